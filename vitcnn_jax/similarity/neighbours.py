"""Similarity measures that compare each example's nearest neighbours in two layers.

Within each minibatch, every example's k nearest others by the cosine of the
features as they are (uncentred, as ReSi and `mutual_knn` do), N_i in one
layer and N'_i in the other, compared example by example and averaged over
every example of every minibatch:

- `knn_jaccard`: |N_i ∩ N'_i| / |N_i ∪ N'_i| (Klabunde et al. 2025, after
  Wang et al. 2022).
- `rank_similarity` (Wang et al. 2022, TKDE): the shared neighbours weighted by
  how closely their ranks agree, Σ_{j ∈ N_i ∩ N'_i} 2 / ((1 + |r_j - r'_j|)
  (r_j + r'_j)), over its largest value for that many shared neighbours,
  Σ_{t ≤ |N_i ∩ N'_i|} 1/t (0 with none shared).
- `second_order_cosine` (Hamilton et al. 2016): the cosine between the example's
  cosine similarities to the neighbours of either layer, N_i ∪ N'_i, in one
  layer and in the other (ReSi's code uses cosine distances instead).

Each is computed for every pair of layers at once, k examples i at a time: the
shared neighbours and their two ranks by looking up each row layer's neighbours
in each column layer's ranks, and the second-order cosine's sums over N ∪ N' from
the cosines at the 2k examples of the two lists (a product over all n examples
per example and pair, as (n, L, n) batches of matmuls, cost it 2.2x as much
beside linear CKA at 55 layers of 256 rows).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import layerpairs
from vitcnn_jax.similarity import registry

RANKED = ("knn_jaccard", "rank_similarity")  # from the lists' ranks
NAMES = RANKED + ("second_order_cosine",)


def neighbours(cos: jax.Array, mask: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """(L, n, k) indices of each example's k most similar others, most similar
  first, and whether each is one (fewer where fewer examples are valid)."""
  top, idx = jax.lax.top_k(jnp.where(hsic.pair_mask(mask) > 0, cos, -jnp.inf), k)
  return idx, top > -jnp.inf


def lists(mb: registry.Minibatch) -> tuple[jax.Array, jax.Array]:
  """`neighbours` of the minibatch's cosines, `knn_k` of them; read through
  `mb.shared`: one top-k for every neighbour measure (`mutual_knn` and `cknna` too)."""
  return neighbours(mb.shared(registry.cosines), mb.mask, mb.spec.knn_k)


class ByExample(NamedTuple):
  """A minibatch's layers as (n, L, n) arrays with the example k first: [k, a, i]
  holds layer a's cosine K[k, i] (`cos`), whether i is among k's neighbours (`knn`),
  and whether k is among i's (`back`, the mask transposed). With k first, a sum
  over i for every example and pair of layers is a batch of (L, n) x (n, L)
  matmuls (`per_example`) that needs no transposing."""
  cos: jax.Array
  knn: jax.Array
  back: jax.Array


def _by_example(cos: jax.Array, idx: jax.Array, ok: jax.Array) -> ByExample:
  """`ByExample` of (L, n, n) cosines and their (L, n, k) `neighbours` lists, the
  masks scattered straight into that layout."""
  num, n, _ = idx.shape
  layer, row = jnp.arange(num)[:, None, None], jnp.arange(n)[None, :, None]
  zeros = jnp.zeros((n, num, n), jnp.float32)
  on = ok.astype(jnp.float32)
  return ByExample(jnp.swapaxes(cos, 0, 1), zeros.at[row, layer, idx].set(on),
                   zeros.at[idx, layer, row].set(on))


def by_example(mb: registry.Minibatch) -> ByExample:
  """The minibatch's `ByExample`; read through `mb.shared`."""
  return _by_example(mb.shared(registry.cosines), *mb.shared(lists))


def moved_lists(mb: registry.Minibatch) -> tuple[jax.Array, jax.Array]:
  """`lists` of the null's layers (examples re-indexed by `mb.order`, see
  `layerpairs`): the lists re-indexed, not a second top-k. Example i of the moved
  layer is example order[i], and j there is order[j] (padding stays put); read through
  `mb.shared`."""
  idx, ok = mb.shared(lists)
  return jnp.argsort(mb.order)[idx[:, mb.order]], ok[:, mb.order]


def moved_cosines(mb: registry.Minibatch) -> jax.Array:
  """The cosines of the null's layers (examples re-indexed by `mb.order`); read
  through `mb.shared`: one re-indexing for the second-order cosine, CKNNA and
  mutual k-NN."""
  return layerpairs.permuted(mb.shared(registry.cosines), mb.order)


def moved_by_example(mb: registry.Minibatch) -> ByExample:
  """`by_example` of the null's layers; read through `mb.shared`."""
  return _by_example(mb.shared(moved_cosines), *mb.shared(moved_lists))


def per_example(x: jax.Array, y: jax.Array, precision) -> jax.Array:
  """(n, L, L) Σ_i x[k, a, i] y[k, b, i] of (n, L, n) arrays, for each example k."""
  return jnp.einsum("kai,kbi->kab", x, y, precision=precision)


def check_k(spec: registry.Spec, smallest: int, chosen: tuple[str, ...]) -> None:
  """`knn_k` of a chosen neighbour measure, against the smallest minibatch."""
  if chosen and not 1 <= spec.knn_k < smallest:
    raise ValueError(f"config.knn_k={spec.knn_k}: neighbours are found within a minibatch, whose "
                     f"smallest here has {smallest} examples; knn_k must be 1..{smallest - 1}.")


def _ranks(idx: jax.Array, ok: jax.Array, n: int, k: int) -> jax.Array:
  """(L, n) the rank of each of `n` examples in each layer's k-list (k: not in it)."""
  return jnp.full((idx.shape[0], n), k, jnp.int32).at[
      jnp.arange(idx.shape[0])[:, None], idx].set(jnp.where(ok, jnp.arange(k), k))


def _second_order_example(x, y, n: int, k: int) -> jax.Array:
  """One example's (L, L) second-order cosine of every row layer of `x` and column
  layer of `y` (each (idx (L, k), ok (L, k), its cosines to every example (L, n))):
  sums over the union of the two lists as the row layer's list plus the column
  layer's neighbours not in it, 2k cosines a pair gathered from the lists, not a
  product over all n examples."""
  (idx_x, ok_x, cos_x), (idx_y, ok_y, cos_y) = x, y
  back = jnp.take(_ranks(idx_x, ok_x, n, k), idx_y, axis=1)  # (L_x, L_y, k)
  only_y = ok_y[None, :, :] & (back >= k)  # the column layer's neighbours missing from the row's list
  own_x = jnp.take_along_axis(cos_x, idx_x, 1) * ok_x  # (L_x, k)
  own_y = jnp.take_along_axis(cos_y, idx_y, 1)  # (L_y, k)
  y_at_x = jnp.swapaxes(jnp.take(cos_y, idx_x, axis=1), 0, 1) * ok_x[:, None, :]  # (L_x, L_y, k)
  x_at_y = jnp.take(cos_x, idx_y, axis=1) * only_y  # (L_x, L_y, k)
  y_only = own_y[None, :, :] * only_y
  dot = (own_x[:, None, :] * y_at_x).sum(-1) + (x_at_y * y_only).sum(-1)
  norm_x = jnp.square(own_x).sum(-1)[:, None] + jnp.square(x_at_y).sum(-1)
  norm_y = jnp.square(y_at_x).sum(-1) + jnp.square(y_only).sum(-1)
  valid = ok_x.any(-1)[:, None]  # the example has neighbours in the row layer
  return jnp.where(valid, dot * jax.lax.rsqrt(jnp.maximum(norm_x * norm_y, 1e-30)), 0.0)


def _example_sums(x, y, n: int, k: int) -> dict[str, jax.Array]:
  """One example's (L, L) k-NN Jaccard and rank similarity for every pair of a row
  layer of `x` and a column layer of `y`, each an (idx (L, k), ok (L, k)) of that
  example's neighbours among `n`: shared neighbours and their ranks from the two
  k-lists; where each also holds its layers' cosines to every example (L, n), the
  second-order cosine too."""
  (idx_x, ok_x), (idx_y, ok_y) = x[:2], y[:2]
  r = jnp.arange(1, k + 1, dtype=jnp.float32)
  weight = 2 / ((1 + jnp.abs(r[:, None] - r[None, :])) * (r[:, None] + r[None, :]))
  harmonic = jnp.cumsum(jnp.r_[0.0, 1 / r])  # harmonic[c] = Σ_{t ≤ c} 1/t
  # (L, L, k): the rank in each column layer's list of the row layer's r-th neighbour (k: not
  # in it), read from each column layer's ranks of every example j: L² k reads an example,
  # not the L² k² comparisons of the two lists (nor a matmul of one-hots over the n examples).
  found = jnp.swapaxes(jnp.take(_ranks(idx_y, ok_y, n, k), idx_x, axis=1), 0, 1)  # (L_x, L_y, k)
  found = jnp.where(ok_x[:, None, :], found, k)
  shared = (found < k).sum(-1).astype(jnp.float32)
  agree = jnp.take_along_axis(jnp.pad(weight, ((0, 0), (0, 1)))[None, None],
                              found[..., None], axis=-1)[..., 0]  # w[r, rank], 0 past the list
  agree = agree.sum(-1)
  count_x, count_y = ok_x.sum(-1).astype(jnp.float32), ok_y.sum(-1).astype(jnp.float32)
  valid = (count_x > 0).astype(jnp.float32)[:, None]
  jaccard = shared / jnp.maximum(count_x[:, None] + count_y[None, :] - shared, 1.0)
  ranks = agree / jnp.maximum(harmonic[shared.astype(jnp.int32)], 1.0)  # (none shared: 0 / 1)
  out = {"knn_jaccard": jaccard * valid, "rank_similarity": ranks * valid}
  if len(x) > 2:
    out["second_order_cosine"] = _second_order_example(x, y, n, k)
  return out


def _pair_sums(x, y, k: int) -> dict[str, jax.Array]:
  """(L, L) sums over the examples of `_example_sums` of `x` and `y`, each (idx,
  ok) of the layers' lists and, for the second-order cosine, their (L, n, n)
  cosines, k examples at a time: each holds a few (L, L) arrays of its sums and
  (L, L, k) ranks and cosines of its neighbours."""
  xs, ys = jax.tree.map(lambda v: jnp.swapaxes(v, 0, 1), (x, y))  # leading axis: the example
  n = xs[0].shape[0]
  block = min(n, k)
  pad = -n % block
  blocks = lambda t: jax.tree.map(  # padding examples have no neighbours
      lambda v: jnp.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1)).reshape(-1, block, *v.shape[1:]), t)
  one = jax.vmap(lambda a, b: _example_sums(a, b, n, k))
  zero = {m: jnp.zeros_like(x[0], jnp.float32, shape=(x[0].shape[0], y[0].shape[0]))  # as varying as x
          for m in (NAMES if len(x) > 2 else RANKED)}
  add = lambda sums, ab: ({m: sums[m] + v.sum(0) for m, v in one(*ab).items()}, None)
  return jax.lax.scan(add, zero, (blocks(xs), blocks(ys)))[0]


def _sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  """One minibatch's (L, L) sums over its examples of each chosen measure, and with
  `mb.order` of the null's (the examples of one layer re-indexed, see `layerpairs`),
  and `neighbour_count`, its examples."""
  out = {"neighbour_count": mb.mask.astype(jnp.float32).sum()}
  cos = (mb.shared(registry.cosines),) if "second_order_cosine" in chosen else ()
  x = mb.shared(lists) + cos
  got = _pair_sums(x, x, mb.spec.knn_k)
  if mb.order is not None:
    moved = mb.shared(moved_lists) + ((mb.shared(moved_cosines),) if cos else ())
    got.update({f"null/{m}": v for m, v in _pair_sums(x, moved, mb.spec.knn_k).items()})
  return {**out, **{m: layerpairs.mirror(v) for m, v in got.items() if m.rsplit("/", 1)[-1] in chosen}}


def _measure(name: str, label: str, estimator: str) -> registry.Measure:
  """A measure of the mean over every example."""
  return registry.Measure(name, label, estimator, lambda spec: f"k {spec.knn_k}",
                          lambda t: t.mean(name, "neighbour_count"))


FAMILY = registry.Family((
    _measure("knn_jaccard", "k-NN Jaccard",
             "mean over every example of |N ∩ N'| / |N ∪ N'| of its k nearest neighbours in each layer "
             "(within its minibatch, cosine, itself excluded)"),
    _measure("rank_similarity", "rank similarity",
             "mean over every example of its shared k nearest neighbours weighted by 2 / ((1 + |r - r'|)"
             "(r + r')) of their ranks, over that weight's largest value for as many shared"),
    _measure("second_order_cosine", "second-order cosine",
             "mean over every example of the cosine between its cosine similarities in each layer to the "
             "union of its k nearest neighbours")), _sums, check_k)
