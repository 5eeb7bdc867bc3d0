"""Values of a function for every pair of layers, each unordered pair once.

Measures that decompose two layers' matrices pair by pair (an SVD per pair)
cannot be had from one matmul over the stack; `pairwise`
runs them over chunks of pairs, so that memory stays that of L pairs, and gives
each chunk its pairs' products of per-layer factors (`Chunk.products`).

The null of every measure permutes one layer's examples. Above the diagonal the
column layer's examples are re-indexed by the permutation, below it by its
inverse: m(X_j, P⁻¹ X_i) = m(P X_j, X_i), so a symmetric measure's null is
symmetric and each unordered pair is computed once (`mirror`), and an asymmetric
one's lower triangle is the reverse direction of the same computation.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


def permuted(mats: jax.Array, order: jax.Array) -> jax.Array:
  """(L, n, n) per-layer matrices over the examples, rows and columns re-indexed by
  `order`: those of the layers with their examples permuted (the null's input).
  One gather of entries from the flattened matrices: XLA:CPU fused a row gather
  then a column gather, with their producers, into element loops over a
  transposed layout (55 layers of 256 rows: 143 ms a step over the measures'
  nine permuted stacks, against 69 ms so)."""
  n = mats.shape[-1]
  entries = (order[:, None] * n + order[None, :]).reshape(-1)
  return mats.reshape(*mats.shape[:-2], n * n)[..., entries].reshape(mats.shape)


def mirror(m: jax.Array) -> jax.Array:
  """(L, L) the upper triangle of `m` with its diagonal, mirrored below."""
  return jnp.triu(m) + jnp.triu(m, 1).T


def one_way(upper: jax.Array, lower: jax.Array) -> jax.Array:
  """(L, L) an asymmetric measure's null: `upper`'s upper triangle with its
  diagonal (the column layer re-indexed), `lower`'s strict lower (the row layer)."""
  return jnp.triu(upper) + jnp.tril(lower, -1)


class Chunk(NamedTuple):
  """Which pairs a chunk of `pairwise` holds: two row layers (`heads`) and, per
  pair, which of them is its row (`slot`, 0 or 1) and its column layer (`col`)."""
  heads: jax.Array  # (2,)
  slot: jax.Array  # (P,)
  col: jax.Array  # (P,)

  def products(self, rows: jax.Array, cols: jax.Array, precision) -> jax.Array:
    """(P, r, s) each pair's rows[i]ᵀ cols[j] of (L, n, r) factors and (L, s, n)
    ones (`examples_last`): one matmul of the two row layers against every column
    layer, the pairs' blocks taken from it (a batch of small products ran at a
    tenth of a matmul's rate)."""
    both = jnp.einsum("hnr,bsn->hbrs", rows[self.heads], cols, precision=precision)
    return both[self.slot, self.col]


def examples_last(factors: jax.Array) -> jax.Array:
  """(L, n, s) factors as (L, s, n), the layout `Chunk.products` reads: once, where
  (L, n, s) had XLA:CPU transpose the whole stack in every chunk (50 ms of the
  measures' step at 55 layers of 256 rows)."""
  return jnp.swapaxes(factors, 1, 2)


def _chunks(num: int) -> np.ndarray:
  """(C, num + 1, 3) each chunk's pairs (row, column, slot): the pairs i <= j of
  row layers c and num - 1 - c (num + 1 pairs; the middle row of an odd count
  alone, padded with its first pair)."""
  out = []
  for c in range((num + 1) // 2):
    heads = (c, num - 1 - c)
    pairs = [(h, j, k) for k, h in enumerate(heads[:1 if heads[0] == heads[1] else 2]) for j in range(h, num)]
    out.append(pairs + pairs[:1] * (num + 1 - len(pairs)))
  return np.asarray(out, np.int32)


def pairwise(fn, num: int, a, b=None) -> dict[str, jax.Array]:
  """(L, L) values of `fn` for every pair i ≤ j of `num` layers, the rows of the
  stacked pytrees `a` (the row layers) and `b` (the column layers; default `a`),
  leading axis L (either may hold nothing: `fn` may read whole stacks itself),
  L + 1 pairs at a time. `fn` maps two (P, ...) chunks and their `Chunk` to a dict
  of (P,) values; a key ending "~" gives the reversed pair's value, which fills
  the lower triangle of its key without the "~"; a key without one is mirrored."""
  chunks = _chunks(num)
  rows, cols = chunks[..., 0].reshape(-1), chunks[..., 1].reshape(-1)
  heads = np.stack([chunks[:, 0, 0], num - 1 - chunks[:, 0, 0]], -1).astype(np.int32)
  other = a if b is None else b
  take = lambda tree, idx: jax.tree.map(lambda x: x[idx], tree)
  values = jax.lax.map(lambda c: fn(take(a, c[0][:, 0]), take(other, c[0][:, 1]),
                                    Chunk(c[1], c[0][:, 2], c[0][:, 1])),
                       (jnp.asarray(chunks), jnp.asarray(heads)))
  out = {}
  for key, v in values.items():
    if key.endswith("~"):
      continue
    m = jnp.zeros((num, num), v.dtype).at[rows, cols].set(v.reshape(-1))
    back = values.get(key + "~")
    below = rows < cols  # the diagonal keeps the forward value
    out[key] = (mirror(m) if back is None
                else m.at[cols[below], rows[below]].set(back.reshape(-1)[below]))
  return out


SLICE_BYTES = 2 ** 19  # two layers' slices of entries that stay in cache together


def squared_differences(x: jax.Array, y: jax.Array, fx: jax.Array | None = None,
                        fy: jax.Array | None = None) -> jax.Array:
  """(L, L) Σ_e (fx[a, b] x[a, e] − fy[a, b] y[b, e])² for every row a of x and b
  of y ((L, ...) stacks, flattened; fx, fy (L, L) factors, default 1), term by
  term: the expansion ‖x_a‖² + ‖y_b‖² − 2 <x_a, y_b> cancels for close layers.
  A slice of every layer's entries at a time, all pairs from it while it is in
  cache: gathering each pair's two whole matrices (`pairwise`) read 2x L^2 of
  them from memory (GULP and the RSM difference at 55 layers of 256 rows)."""
  num = x.shape[0]
  x, y = x.reshape(num, -1), y.reshape(y.shape[0], -1)
  width = min(x.shape[1], max(1, SLICE_BYTES // (8 * num)))
  whole = x.shape[1] // width  # slices; the entries past them in one last step (padding the
  # stacks to whole slices copied them: 35 ms of the measures' step, 55 layers of 256 rows)
  fx = jnp.ones((num, y.shape[0]), x.dtype) if fx is None else fx
  fy = jnp.ones_like(fx) if fy is None else fy
  terms = lambda a, b: jnp.sum(jnp.square(fx[:, :, None] * a[:, None, :] - fy[:, :, None] * b[None, :, :]), -1)

  def add(i, total):
    take = lambda v: jax.lax.dynamic_slice_in_dim(v, i * width, width, 1)
    return total + terms(take(x), take(y))

  total = jnp.zeros_like(fx * x[0, 0] * y[0, 0])  # varying as the layers are, in shard_map
  total = jax.lax.fori_loop(0, whole, add, total)
  return total + terms(x[:, whole * width:], y[:, whole * width:]) if whole * width < x.shape[1] else total


def symmetric_squared_differences(mats: jax.Array, fx: jax.Array | None = None,
                                  fy: jax.Array | None = None,
                                  order: jax.Array | None = None) -> jax.Array:
  """(L, L) `squared_differences` of a stack of symmetric (L, n, n) matrices against
  itself, over all n² entries, each off-diagonal entry taken once and its sum doubled
  (exact): half the terms of the full matrices (GULP's hat matrices and the RSM
  difference's distances at 55 layers of 256 rows: 138 ms of the measures' step).
  With `order`, the column layers' rows and columns are re-indexed by it (the
  null's, see `permuted`) in the same gather."""
  n = mats.shape[-1]
  i, j = np.triu_indices(n, 1)
  moved = np.arange(n) if order is None else order
  pick = lambda r, c: mats.reshape(mats.shape[0], n * n)[:, r * n + c]
  off = squared_differences(pick(i, j), pick(moved[i], moved[j]), fx, fy)
  diagonal = squared_differences(pick(np.arange(n), np.arange(n)), pick(moved, moved), fx, fy)
  return 2 * off + diagonal
