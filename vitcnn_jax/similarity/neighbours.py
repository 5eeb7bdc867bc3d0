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

Each is computed for every pair of layers at once, k examples i at a time:
the shared neighbours and their two ranks by looking up each row layer's
neighbours in each column layer's ranks, the cosine sums as matmuls over the
examples j of which are a layer's neighbours.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import layerpairs
from vitcnn_jax.similarity import registry

NAMES = ("knn_jaccard", "rank_similarity", "second_order_cosine")


def neighbours(cos: jax.Array, mask: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """(L, n, k) indices of each example's k most similar others, most similar
  first, and whether each is one (fewer where fewer examples are valid)."""
  top, idx = jax.lax.top_k(jnp.where(hsic.pair_mask(mask) > 0, cos, -jnp.inf), k)
  return idx, top > -jnp.inf


def lists(mb: registry.Minibatch) -> tuple[jax.Array, jax.Array]:
  """`neighbours` of the minibatch's cosines, `knn_k` of them; read through
  `mb.shared`: one top-k for every neighbour measure (`mutual_knn` and `cknna` too)."""
  return neighbours(mb.shared(registry.cosines), mb.mask, mb.spec.knn_k)


def check_k(spec: registry.Spec, smallest: int, chosen: tuple[str, ...]) -> None:
  """`knn_k` of a chosen neighbour measure, against the smallest minibatch."""
  if chosen and not 1 <= spec.knn_k < smallest:
    raise ValueError(f"config.knn_k={spec.knn_k}: neighbours are found within a minibatch, whose "
                     f"smallest here has {smallest} examples; knn_k must be 1..{smallest - 1}.")


def _one_hot(idx: jax.Array, ok: jax.Array, n: int) -> jax.Array:
  """(..., n, k): 1 where example j is the r-th neighbour (r < k) in the list."""
  return ((idx[..., None, :] == jnp.arange(n)[:, None]) & ok[..., None, :]).astype(jnp.float32)


def _example_sums(x, y, k: int, precision) -> dict[str, jax.Array]:
  """One example's (L, L) value of each measure for every pair of a row layer of
  `x` and a column layer of `y`, each a (cos (L, n), idx (L, k), ok (L, k)) of
  that example: shared neighbours and their ranks from the two k-lists; sums of
  cosines over the examples j that are neighbours as matmuls of per-layer
  indicators over j (N_i ∪ N'_i as N_i and the rest of N'_i)."""
  (cos_x, idx_x, ok_x), (cos_y, idx_y, ok_y) = x, y
  n = cos_x.shape[-1]
  in_x, in_y = _one_hot(idx_x, ok_x, n).sum(-1), _one_hot(idx_y, ok_y, n).sum(-1)  # (L, n): j is a neighbour
  mm = lambda a, b: jnp.matmul(a, b.T, precision=precision)  # Σ_j a[row, j] b[col, j]
  r = jnp.arange(1, k + 1, dtype=jnp.float32)
  weight = 2 / ((1 + jnp.abs(r[:, None] - r[None, :])) * (r[:, None] + r[None, :]))
  harmonic = jnp.cumsum(jnp.r_[0.0, 1 / r])  # harmonic[c] = Σ_{t ≤ c} 1/t
  # (L, L, k): the rank in each column layer's list of the row layer's r-th neighbour (k: not
  # in it), read from each column layer's ranks of every example j: L² k reads an example,
  # not the L² k² comparisons of the two lists (nor a matmul of one-hots over the n examples).
  rank_y = jnp.full((idx_y.shape[0], n), k, jnp.int32).at[
      jnp.arange(idx_y.shape[0])[:, None], idx_y].set(jnp.where(ok_y, jnp.arange(k), k))
  found = jnp.swapaxes(jnp.take(rank_y, idx_x, axis=1), 0, 1)  # (L_x, L_y, k)
  found = jnp.where(ok_x[:, None, :], found, k)
  shared = (found < k).sum(-1).astype(jnp.float32)
  agree = jnp.take_along_axis(jnp.pad(weight, ((0, 0), (0, 1)))[None, None],
                              found[..., None], axis=-1)[..., 0]  # w[r, rank], 0 past the list
  agree = agree.sum(-1)
  count_x, count_y = ok_x.sum(-1).astype(jnp.float32), ok_y.sum(-1).astype(jnp.float32)
  valid = (count_x > 0).astype(jnp.float32)[:, None]
  jaccard = shared / jnp.maximum(count_x[:, None] + count_y[None, :] - shared, 1.0)
  ranks = agree / jnp.maximum(harmonic[shared.astype(jnp.int32)], 1.0)  # (none shared: 0 / 1)
  out_x = 1 - in_x  # Σ over N ∪ N' = Σ over N + Σ over N' outside N
  dot = mm(in_x * cos_x, cos_y) + mm(out_x * cos_x, in_y * cos_y)
  norm_x = (in_x * cos_x * cos_x).sum(-1)[:, None] + mm(out_x * cos_x * cos_x, in_y)
  norm_y = mm(in_x, cos_y * cos_y) + mm(out_x, in_y * cos_y * cos_y)
  second = dot * jax.lax.rsqrt(jnp.maximum(norm_x * norm_y, 1e-30))
  return {"knn_jaccard": jaccard * valid, "rank_similarity": ranks * valid,
          "second_order_cosine": second * valid}


def _pair_sums(x, y, k: int, precision) -> dict[str, jax.Array]:
  """(L, L) sums over the examples of `_example_sums`, k examples at a time: each
  holds a few (L, L) arrays of its sums and (L, n, k) one-hots of its neighbours."""
  xs, ys = jax.tree.map(lambda v: jnp.swapaxes(v, 0, 1), (x, y))  # leading axis: the example
  n = xs[0].shape[0]
  block = min(n, k)
  pad = -n % block
  blocks = lambda t: jax.tree.map(  # padding examples have no neighbours
      lambda v: jnp.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1)).reshape(-1, block, *v.shape[1:]), t)
  one = jax.vmap(lambda a, b: _example_sums(a, b, k, precision))
  zero = {m: jnp.zeros_like(x[0], shape=(x[0].shape[0], y[0].shape[0])) for m in NAMES}  # as varying as x
  add = lambda sums, ab: ({m: sums[m] + v.sum(0) for m, v in one(*ab).items()}, None)
  return jax.lax.scan(add, zero, (blocks(xs), blocks(ys)))[0]


def neighbour_sums(cos: jax.Array, mask: jax.Array, lists: tuple[jax.Array, jax.Array],
                   names: tuple[str, ...], k: int, order: jax.Array | None,
                   precision) -> dict[str, jax.Array]:
  """One minibatch's (L, L) sums over its examples of each measure of `names` from
  the layers' (L, n, n) cosine similarities and their neighbour `lists`
  (`neighbours`; with `order`, of the null too: the examples of one layer
  re-indexed, see `layerpairs`), and `neighbour_count`, its examples."""
  idx, ok = lists
  out = {"neighbour_count": mask.astype(jnp.float32).sum()}
  got = {m: layerpairs.mirror(v) for m, v in _pair_sums((cos, idx, ok), (cos, idx, ok), k, precision).items()}
  if order is not None:
    # The permuted layers' lists are the lists re-indexed, not a second top-k: example i
    # of the moved layer is example order[i], and j there is order[j] (padding stays put).
    moved = layerpairs.permuted(cos, order)
    null = _pair_sums((cos, idx, ok), (moved, jnp.argsort(order)[idx[:, order]], ok[:, order]), k, precision)
    got.update({f"null/{m}": layerpairs.mirror(v) for m, v in null.items()})
  return {**out, **{m: v for m, v in got.items() if m.rsplit("/", 1)[-1] in names}}


def _sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  return neighbour_sums(mb.shared(registry.cosines), mb.mask, mb.shared(lists), chosen, mb.spec.knn_k,
                        mb.order, mb.precision)


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
