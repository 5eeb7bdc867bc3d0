"""Linear HSIC over minibatches: each minibatch's HSIC_1 of every pair of layers
in one matmul, and the fourth moments that say whether a layer varies.

Minibatch CKA (Nguyen et al. 2021; Raghu et al. 2021) sums the unbiased HSIC
estimator of Song et al. (2012) over minibatches,

  CKA(X, Y) = sum_i HSIC1(K_i, L_i) / sqrt(sum_i HSIC1(K_i, K_i) * sum_i HSIC1(L_i, L_i)),

with HSIC1(K, L) = <U(K), U(L)> / (n (n - 3)) and U the unbiased (Szekely-Rizzo)
centring. Vectorised centred Grams of all layers are stacked and multiplied
once per batch, so every layer pair costs one entry of one matmul. Minibatches
of different sizes are weighted correctly because each term carries its own
1 / (n (n - 3)). `linear_cka` turns the summed HSIC into CKA.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from vitcnn_jax.similarity import device_ring
from vitcnn_jax.similarity import layerpairs
from vitcnn_jax.similarity import MIN_BATCH  # n (n - 3) and (n - 1)(n - 2) must be positive
from vitcnn_jax.similarity import registry
from vitcnn_jax.similarity import scales
from vitcnn_jax.similarity.grams import HIGHEST, Precision, center_unbiased, flat_products, fourth_moment, layer_parts

# The sums here that carry the layers' scales (`scales`): HSIC per pair, the
# fourth moments of the means per layer.
SCALES = {"hsic": scales.Scale(2, per_pair=True), "moments": scales.Scale(4, per_pair=False)}

def activation_sums(acts: Sequence[jax.Array], mask: jax.Array | None = None,
                   axis_name: str | tuple[str, ...] | None = None, group: str | None = None,
                   precision: Precision = HIGHEST, prescale: bool = True) -> dict[str, jax.Array]:
  """One minibatch's HSIC matrix and fourth moments of the layers' means from
  their activations, each layer scaled by a power of two (exact, see
  `grams.Parts`); `scales.unscale` restores them in float64 on the host. With
  `prescale` False (a step the driver runs again prescaled where a layer left
  float32's range), each layer is read once, its Gram made as it is.

  Each device scales by its own exponents; only the small results are brought to
  the exponents shared along `axis_name` (their max), after every Gram is made. A
  collective on the exponents before the Grams would keep every layer's
  activations alive until it ran (measured: 2.3 -> 15 GiB on workload W).

  With `group`, the minibatch's rows are spread over the devices of that mesh
  axis (see `device_ring.group_gram`): each returns its share of the sums, and their sum over
  the group is the single-device result.
  """
  if group is not None:
    return _group_sums(acts, mask, axis_name, group, precision)
  layers = registry.Stack.of_activations(acts, mask, precision, prescale)
  return scales.shared_scale(linear_sums(layers, mask, precision), axis_name, SCALES)


def _valid_rows(n_all: int, mask: jax.Array | None) -> jax.Array:
  """The minibatch's valid rows in float32: all `n_all`, or those `mask` marks."""
  return jnp.asarray(n_all, jnp.float32) if mask is None else mask.astype(jnp.float32).sum()


def stacked_sums(stacks: Sequence[jax.Array], mask: jax.Array | None = None,
                 axis_name: str | tuple[str, ...] | None = None, group: str | None = None,
                 precision: Precision = HIGHEST, prescale: bool = True) -> dict[str, jax.Array]:
  """`activation_sums` of the layers stacked on the leading axis of each of `stacks`
  ((k, rows, ...): k layers of one shape, e.g. a layer's tokens or an image's
  patches), in that order. Each stack's layers are made by one batched copy of
  the code (`jax.vmap`), so the program does not grow with k: localization on a
  16x16 grid has 512 such layers, unrolled over a minute of compile on CPU.
  Spread over a `group` of devices (collectives per layer), the layers are taken
  one by one."""
  if group is not None:
    return activation_sums([a for s in stacks for a in s], mask, axis_name, group, precision)
  n_all = stacks[0].shape[1]
  n = _valid_rows(n_all, mask)

  def parts(a: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    layer = layer_parts(a, mask, precision, prescale).layer()
    return center_unbiased(layer.gram, mask).ravel(), n * layer.mean_4th, layer.e

  grams, moments, exps = (jnp.concatenate(p) for p in zip(*(jax.vmap(parts)(s) for s in stacks)))
  return scales.shared_scale(_linear_out(grams, moments, exps, n_all, mask, precision), axis_name, SCALES)


def linear_sums(stack: registry.Stack, mask: jax.Array | None, precision: Precision = HIGHEST,
                order: jax.Array | None = None) -> dict[str, jax.Array]:
  """One minibatch's HSIC_1 matrix of the `stack`'s layers (each at its own
  scale), their fourth moments and exponents; with `order`, also `null/hsic`:
  one layer's examples re-indexed by `order` (see `layerpairs`; U-centring
  commutes with it)."""
  n_all = stack.gram.shape[1]
  n = _valid_rows(n_all, mask)
  # One batched centring for every layer: its code does not grow with the layers.
  grams = jax.vmap(center_unbiased, (0, None))(stack.gram, mask).reshape(len(stack.gram), -1)
  return _linear_out(grams, n * stack.mean_4th, stack.e, n_all, mask, precision, order)


def _linear_out(grams: jax.Array, moments: jax.Array, exps: jax.Array, n_all: int,
                mask: jax.Array | None, precision: Precision, order: jax.Array | None = None
                ) -> dict[str, jax.Array]:
  """`linear_sums` from the layers' stacked, flattened U-centred Grams (of `n_all`
  rows), fourth moments and exponents."""
  out = {"hsic": _hsic_of_grams(grams, n_all, mask, precision), "moments": moments,
         "log2_scale": exps}
  if order is not None:  # the barrier keeps XLA from fusing the centring into both uses (compile memory)
    grams = jax.lax.optimization_barrier(grams)
    moved = layerpairs.permuted(grams.reshape(-1, n_all, n_all), order).reshape(grams.shape)
    out["null/hsic"] = layerpairs.mirror(_hsic_of_grams(grams, n_all, mask, precision, moved))
  return out


def pair_mask(mask: jax.Array) -> jax.Array:
  """(n, n) float32: 1 where both rows are valid and not the same row."""
  m = mask.astype(jnp.float32)
  return m[:, None] * m[None, :] * (1 - jnp.eye(m.shape[0], dtype=jnp.float32))


def _hsic_of_grams(g: jax.Array, n_all: int, mask: jax.Array | None,
                   precision: Precision = HIGHEST, g2: jax.Array | None = None) -> jax.Array:
  """All pairs of stacked, flattened U-centred Grams (`g` with `g2`, default `g`)
  in one matmul (on CPU, past a size, summed over cache slices of its columns:
  `grams.flat_products`), normalised."""
  n = _valid_rows(n_all, mask)
  hs = flat_products(g, g if g2 is None else g2, precision)
  return jnp.where(n >= MIN_BATCH, hs / jnp.maximum(n * (n - 3), 1.0), 0.0)


def _group_sums(acts: Sequence[jax.Array], mask: jax.Array | None,
                axis_name: str | tuple[str, ...] | None, group: str, precision: Precision
                ) -> dict[str, jax.Array]:
  """`activation_sums` of a minibatch spread over the devices of `group`: this
  device's share of the sums, from its row blocks of the layers' Grams."""
  m = (jnp.ones((acts[0].shape[0],), jnp.float32) if mask is None
       else mask.astype(jnp.float32))
  keep = jax.lax.all_gather(m, group, tiled=True)
  n = keep.sum()
  grams, moments, exps = [], [], []
  done = keep
  for a in acts:
    # Each layer's collectives after the last layer's: XLA's CPU runtime runs
    # independent ops in any order, and devices that took two layers' collectives
    # in different orders would wait for each other forever.
    a, _ = jax.lax.optimization_barrier((a, done))
    block, mean, e = device_ring.group_gram(a, m, keep, group, precision)
    done = block
    grams.append(block.ravel())
    moments.append(m.sum() * fourth_moment(mean))  # the group's shares add up to n's
    exps.append(e)
  stacked = jnp.stack(grams)
  hs = flat_products(stacked, stacked, precision)
  hsic = jnp.where(n >= MIN_BATCH, hs / jnp.maximum(n * (n - 3), 1.0), 0.0)
  return scales.shared_scale(
      {"hsic": hsic, "moments": jnp.stack(moments), "log2_scale": jnp.stack(exps)}, axis_name, SCALES)
