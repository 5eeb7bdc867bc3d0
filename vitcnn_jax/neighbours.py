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

Each pair of layers compares index lists, k x k per example, L pairs at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vitcnn_jax import hsic
from vitcnn_jax import layerpairs

NAMES = ("knn_jaccard", "rank_similarity", "second_order_cosine")


def neighbours(cos: jax.Array, mask: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """(L, n, k) indices of each example's k most similar others, most similar
  first, and whether each is one (fewer where fewer examples are valid)."""
  top, idx = jax.lax.top_k(jnp.where(hsic.pair_mask(mask) > 0, cos, -jnp.inf), k)
  return idx, top > -jnp.inf


def _rows(x, y, k: int, precision) -> dict[str, jax.Array]:
  """Per pair of layers (P of them), each measure summed over the examples."""
  (cos_x, idx_x, ok_x), (cos_y, idx_y, ok_y) = x, y
  same = (idx_x[..., :, None] == idx_y[..., None, :]) & ok_x[..., :, None] & ok_y[..., None, :]
  shared = same.sum((-2, -1)).astype(jnp.float32)  # (P, n)
  both = jnp.maximum(ok_x.sum(-1) + ok_y.sum(-1) - shared, 1.0)
  rank = jnp.arange(1, k + 1, dtype=jnp.float32)
  weight = 2 / ((1 + jnp.abs(rank[:, None] - rank[None, :])) * (rank[:, None] + rank[None, :]))
  harmonic = jnp.cumsum(jnp.r_[0.0, 1 / rank])  # harmonic[c] = Σ_{t ≤ c} 1/t
  agree = jnp.einsum("pnab,ab->pn", same.astype(jnp.float32), weight, precision=precision)
  ranks = agree / jnp.maximum(harmonic[shared.astype(jnp.int32)], 1.0)  # (none shared: 0 / 1)
  at = lambda cos, idx: jnp.take_along_axis(cos, idx, -1)  # noqa: E731
  in_y = same.any(-1)  # (P, n, k): x's neighbour is also y's
  # Σ over N ∪ N' = Σ over N + Σ over N' - Σ over N ∩ N'
  over = lambda f_x, f_y: (f_x * (ok_x & ~in_y)).sum(-1) + (f_y * ok_y).sum(-1)  # noqa: E731
  xx, yx = at(cos_x, idx_x), at(cos_y, idx_x)  # both layers' cosines to x's neighbours
  xy, yy = at(cos_x, idx_y), at(cos_y, idx_y)
  dot, norm_x, norm_y = over(xx * yx, xy * yy), over(xx * xx, xy * xy), over(yx * yx, yy * yy)
  second = dot * jax.lax.rsqrt(jnp.maximum(norm_x * norm_y, 1e-30))
  valid = ok_x.any(-1)
  return {"knn_jaccard": (shared / both * valid).sum(-1), "rank_similarity": (ranks * valid).sum(-1),
          "second_order_cosine": (second * valid).sum(-1)}


def neighbour_sums(cos: jax.Array, mask: jax.Array, names: tuple[str, ...], k: int,
                   order: jax.Array | None, precision) -> dict[str, jax.Array]:
  """One minibatch's (L, L) sums over its examples of each measure of `names` from
  the layers' (L, n, n) cosine similarities (with `order`, of the null too: the
  examples of one layer re-indexed, see `layerpairs`), and `neighbour_count`, its examples."""
  idx, ok = neighbours(cos, mask, k)
  out = {"neighbour_count": mask.astype(jnp.float32).sum()}
  fn = lambda x, y: _rows(x, y, k, precision)  # noqa: E731
  got = layerpairs.pairwise(fn, (cos, idx, ok))
  if order is not None:
    moved = layerpairs.permuted(cos, order)
    null = layerpairs.pairwise(fn, (cos, idx, ok), (moved, *neighbours(moved, mask, k)))
    got.update({f"null/{m}": v for m, v in null.items()})
  return {**out, **{m: v for m, v in got.items() if m.rsplit("/", 1)[-1] in names}}
