"""The null of a pair of models' layer search, drawn from the layers' Grams.

A draw permutes model B's examples within each minibatch, one order for every
layer of B (a re-index of each layer's Gram and per-example vectors, no
forward), and recomputes every measure for every layer pair from the same code
as the observed map. Draw k of minibatch b is keyed by (seed, b, k) alone, so a
draw is the same whichever models ride along and however the minibatches are
split over processes. `calibration` turns the draws' statistics into p-values
and calibrated scores; `calibrate_layers` does it all for in-memory matrices.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import calibration
from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import registry
from vitcnn_jax.similarity import scales


def draw_keys(seed: int, minibatch: int, num: int) -> jax.Array:
  """The `num` draws' keys of one minibatch (by its index in the sample)."""
  return jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), minibatch), num)


def draw_orders(seed: int, minibatch: int, num: int, mask: jax.Array) -> np.ndarray:
  """(num, n) the examples' order in each draw of one minibatch (valid rows first)."""
  return np.asarray(jax.vmap(measures.permutation, (0, None))(draw_keys(seed, minibatch, num), mask))


def draw_sums(stack_a: registry.Stack, stack_b: registry.Stack, mask: jax.Array, spec: measures.Spec,
              keys: jax.Array, precision: grams.Precision = grams.HIGHEST) -> dict[str, jax.Array]:
  """One minibatch's sums (`measures.stack_sums` of A's layers then B's, without
  the per-cell null) for each of `keys`, B's examples permuted: leading axis K."""
  spec = dataclasses.replace(spec, null=False)

  def one(key: jax.Array) -> dict[str, jax.Array]:
    both = registry.Stack.join([stack_a, stack_b.reindexed(measures.permutation(key, mask))])
    return measures.stack_sums(both, mask, spec, precision=precision)

  return jax.lax.map(one, keys)


@functools.partial(jax.jit, static_argnames=("precision",))
def _stack(xs: tuple[jax.Array, ...], mask: jax.Array, precision: grams.Precision) -> registry.Stack:
  return registry.Stack.of_activations(xs, mask, precision)


@functools.partial(jax.jit, static_argnames=("spec", "precision"))
def _minibatch(a: registry.Stack, b: registry.Stack, mask: jax.Array, keys: jax.Array,
               spec: measures.Spec, precision: grams.Precision) -> tuple[dict, dict]:
  """(observed sums, the draws' sums) of one minibatch of two models' stacks: one
  program for any features' widths."""
  observed = measures.stack_sums(registry.Stack.join([a, b]), mask, dataclasses.replace(spec, null=False),
                                 precision=precision)
  return observed, draw_sums(a, b, mask, spec, keys, precision)


def _host(sums: dict) -> dict[str, np.ndarray]:
  return scales.unscale({k: np.asarray(v) for k, v in sums.items()}, measures.SCALES)


def _padded(v: np.ndarray, start: int, size: int) -> np.ndarray:
  """Rows start..start + size of `v`, zero rows after its end."""
  part = v[start:start + size]
  return np.pad(part, [(0, size - len(part))] + [(0, 0)] * (v.ndim - 1))


def _checked(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], aggregate: str, num_null: int,
             alpha: float) -> int:
  """The examples' count of `calibrate_layers`' arguments, or a ValueError naming the argument."""
  if aggregate not in calibration.AGGREGATES:
    raise ValueError(f"aggregate={aggregate!r} is not one of {list(calibration.AGGREGATES)}.")
  if num_null < 1:
    raise ValueError(f"num_null={num_null} must be >= 1 (the p-value's resolution is 1 / (num_null + 1)).")
  calibration.check_alpha(alpha)
  if not xs or not ys:
    raise ValueError(f"xs and ys need a layer each (got {len(xs)} and {len(ys)}).")
  rows = {len(v) for v in [*xs, *ys]}
  if len(rows) != 1:
    raise ValueError(f"every layer of xs and ys must have the same examples (rows): got {sorted(rows)}.")
  return rows.pop()


def calibrate_layers(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], spec: measures.Spec | None = None,
                     *, aggregate: str = "matched", num_null: int = 200, alpha: float = 0.05, seed: int = 0,
                     batch_size: int | None = None,
                     precision: grams.Precision = grams.HIGHEST) -> dict[str, calibration.Calibrated]:
  """Each measure of `spec` (default: linear CKA) between the layers `xs` of model
  A and `ys` of model B (arrays over the same examples, in order), as the pair's
  statistic (`aggregate`, of `calibration.AGGREGATES`) calibrated against
  `num_null` draws of B's examples permuted, in minibatches of `batch_size`
  (default: all the examples in one). Measures without a null (one statistic
  per layer: the examples' correspondence does not enter) are left out."""
  spec = spec or measures.Spec()
  total = _checked(xs, ys, aggregate, num_null, alpha)
  xs, ys = [np.asarray(x) for x in xs], [np.asarray(y) for y in ys]
  size = batch_size or total
  observed, draws = {}, {}
  for b, start in enumerate(range(0, total, size)):
    mask = jnp.asarray(np.arange(size) < total - start, jnp.float32)
    stacks = [_stack(tuple(_padded(v, start, size) for v in vs), mask, precision) for vs in (xs, ys)]
    got, drawn = _minibatch(*stacks, mask, draw_keys(seed, b, num_null), spec, precision)
    for acc, new in ((observed, _host(got)), (draws, _host(drawn))):
      for k, v in new.items():
        acc[k] = acc.get(k, 0.0) + v
  names = [f"xs[{i}]" for i in range(len(xs))] + [f"ys[{j}]" for j in range(len(ys))]
  observed = measures.values(observed, names, spec, total)
  return calibrated({m: v[:len(xs), len(xs):] for m, v in observed.items() if m in spec.names},
                    null_blocks(draws, names, spec, total, len(xs)), aggregate, alpha)


def null_blocks(draws: dict[str, np.ndarray], names: Sequence[str], spec: measures.Spec, num_examples: int,
                rows: int) -> dict[str, np.ndarray]:
  """{each measure of `spec` with a null: (K, rows, columns)}: the block of the
  first `rows` layers against the others in each draw's maps, from the draws'
  float64 sums ({key: (K, ...)}, `draw_sums` summed over minibatches)."""
  count = len(draws["hsic"])
  out: dict[str, np.ndarray] = {}
  for k in range(count):
    for m, v in measures.values({key: val[k] for key, val in draws.items()}, names, spec, num_examples).items():
      if m in spec.names and measures.REGISTRY[m].null:
        out.setdefault(m, np.zeros((count, rows, v.shape[1] - rows)))[k] = v[:rows, rows:]
  return out


def calibrated(observed: dict[str, np.ndarray], null: dict[str, np.ndarray], aggregate: str,
               alpha: float) -> dict[str, calibration.Calibrated]:
  """Each measure of `null` (its (K, rows, columns) draws) calibrated: the
  statistic `aggregate` of its `observed` block against that of each draw."""
  stat = calibration.AGGREGATES[aggregate]
  out = {}
  for m, blocks in null.items():
    distance = measures.REGISTRY[m].distance
    out[m] = calibration.calibrate(stat(observed[m], distance), np.asarray([stat(b, distance) for b in blocks]),
                                   distance, alpha)
  return out
