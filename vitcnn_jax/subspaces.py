"""Similarity measures from each layer's principal subspace within a minibatch.

One eigendecomposition per layer of its centred Gram, normalised to trace 1,
K = X Xᵀ / tr(X Xᵀ) = U diag(s) Uᵀ, gives what the CCA family, regression and
Procrustes read from the features, for every pair of layers at once: Xᵀ Y has
the singular values of diag(√s_x) U_xᵀ U_y diag(√s_y), and X's column space is
spanned by the columns of U with s > 0. Each measure is a similarity in [0, 1]:

- `mean_cca`: the mean canonical correlation, the mean singular value of
  U_aᵀ U_b over the smaller of the two ranks (Kornblith et al. 2019, Table 1).
- `cca_r2`: the mean squared canonical correlation, tr(P_a P_b) / min(r_a, r_b)
  with P the projector on the column space (R²_CCA; Yanai's GCD up to the divisor).
- `regression`: the R² of predicting the column layer from the row layer by
  least squares, tr(P_row K_col) (K of trace 1): row a, column b says how much of
  b a linear map of a explains; both directions are the two triangles.
- `shape_metric`: cos θ of Williams et al.'s (2021) angular shape metric with
  partial whitening `shape_alpha`: each layer's singular values s^½ become
  α s^½ + (1 - α), so ‖A_aᵀ A_b‖_* / (‖A_a‖_F ‖A_b‖_F) with A = U diag(α √s +
  (1 - α) 1[s > 0]); α = 1 is angular Procrustes (the distance is arccos).
- `gulp` (a distance, 0 for equal layers): GULP (Boix-Adserà et al. 2022), how
  differently ridge regression (penalty `gulp_lambda`, on the layers scaled to
  trace 1 as GULP's code does) from each layer predicts any linear function of
  the examples: ‖R_a − R_b‖_F with R = K (K + λ I)⁻¹ the ridge hat matrix, which
  equals the paper's covariance form; the root of the mean over minibatches of
  its square.

Where a layer's width reaches the minibatch, its column space is the whole
centred space and the CCA family and regression say 1 whatever the other layer
(Kornblith et al. 2019, Theorem 1). So those three read each layer's top
`cca_dims` principal components (default: half the smallest minibatch, so that
two subspaces cannot be forced to meet), and the job's json names the layers
this reduced; `shape_metric` keeps every component (α > 0 regularises it).

Each is a mean over minibatches of its per-minibatch value (a new alignment or
regression per minibatch: biased up against the full data, the more so the
smaller the minibatch; the null shows the level of unrelated layers).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NAMES = ("mean_cca", "cca_r2", "regression", "shape_metric", "gulp")
DISTANCES = ("gulp",)  # 0 for equal layers, larger apart
REDUCED = ("mean_cca", "cca_r2", "regression")  # read each layer's top `cca_dims` components
_TOL = 16 * float(jnp.finfo(jnp.float32).eps)  # eigenvalues below this share of the largest are 0


def spectra(gram: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(L, n, n) centred Grams -> each layer's eigenvectors (L, n, n), largest first,
  eigenvalues (L, n) of the Gram normalised to trace 1, and which are nonzero
  (L, n) (padding rows give none: their rows and columns are zero)."""
  n = jnp.maximum(mask.astype(jnp.float32).sum(), 1.0)
  trace = jnp.trace(gram, axis1=1, axis2=2)
  k = gram / jnp.where(trace > 0, trace, 1.0)[:, None, None]
  s, u = jnp.linalg.eigh(k)
  s, u = s[:, ::-1], u[:, :, ::-1]
  kept = s > _TOL * n * s[:, :1]
  return u, jnp.where(kept, s, 0.0), kept


def _outer(u: jax.Array, w: jax.Array, precision) -> jax.Array:
  """(L, n, n) U diag(w) Uᵀ of each layer."""
  return jnp.einsum("lik,ljk->lij", u * w[:, None, :], u, precision=precision)


def _nuclear(a: jax.Array, b: jax.Array | None, precision) -> jax.Array:
  """(L, L) sums of the singular values of a_iᵀ b_j for stacked (L, n, r) factors,
  L pairs at a time (the (L, L, r, r) products at once would not fit); with b None,
  of a_iᵀ a_j, each pair once (a_jᵀ a_i has the same singular values)."""
  num = a.shape[0]
  if b is None:
    rows, cols = np.triu_indices(num)
  else:
    rows, cols = np.divmod(np.arange(num * num), num)
  pad = -len(rows) % num
  chunks = np.stack([np.r_[rows, np.zeros(pad, int)], np.r_[cols, np.zeros(pad, int)]], -1)
  other = a if b is None else b

  def chunk(pairs):
    m = jnp.einsum("pnr,pns->prs", a[pairs[:, 0]], other[pairs[:, 1]], precision=precision)
    return jnp.linalg.svd(m, compute_uv=False).sum(-1)
  values = jax.lax.map(chunk, jnp.asarray(chunks.reshape(-1, num, 2))).reshape(-1)[:len(rows)]
  out = jnp.zeros((num, num), values.dtype).at[rows, cols].set(values)
  return out + jnp.triu(out, 1).T if b is None else out


def subspace_sums(gram: jax.Array, mask: jax.Array, names: tuple[str, ...], dims: int,
                  alpha: float, ridge: float, order: jax.Array | None, precision
                  ) -> dict[str, jax.Array]:
  """One minibatch's (L, L) value of each measure of `names` (and, with `order`,
  of the null: the column layer's examples re-indexed); `subspace_count`, 1 where
  the minibatch has at least two examples, and `subspace_reduced` (L,), 1 where a
  layer's rank exceeds `dims`. Summed over minibatches."""
  n = mask.astype(jnp.float32).sum()
  u, s, kept = spectra(gram, mask)
  top = kept & (jnp.arange(s.shape[1]) < dims)[None, :]
  rank = top.sum(1).astype(jnp.float32)
  smaller = jnp.maximum(jnp.minimum(rank[:, None], rank[None, :]), 1.0)
  valid = (n >= 2).astype(jnp.float32)
  out = {"subspace_count": valid, "subspace_reduced": (kept.sum(1) > dims).astype(jnp.float32) * valid}
  movers = [("", lambda m: m, lambda x: None)]  # None: a layer stack against itself
  if order is not None:  # rows and columns of a matrix, rows of a factor
    movers.append(("null/", lambda m: m[:, order][:, :, order], lambda x: x[:, order]))
  flat = lambda m: m.reshape(m.shape[0], -1)  # noqa: E731
  pairs = lambda x, y: jnp.matmul(flat(x), flat(y).T, precision=precision)  # noqa: E731
  p = _outer(u, top.astype(s.dtype), precision) if {"cca_r2", "regression"} & set(names) else None
  k = _outer(u, s, precision) if "regression" in names else None  # the Gram of trace 1
  q = (u * top[:, None, :])[:, :, :dims]  # the top components only: a dims x dims SVD per pair
  hat = _outer(u, s / (s + ridge), precision) if "gulp" in names else None
  a = u * (alpha * jnp.sqrt(s) + (1 - alpha) * kept)[:, None, :]
  norm = jnp.sqrt(jnp.sum(jnp.square(a), axis=(1, 2)))
  for pre, matrix, factor in movers:
    if "cca_r2" in names:
      out[pre + "cca_r2"] = pairs(p, matrix(p)) / smaller * valid
    if "regression" in names:
      out[pre + "regression"] = pairs(p, matrix(k)) * valid
    if "mean_cca" in names:
      out[pre + "mean_cca"] = _nuclear(q, factor(q), precision) / smaller * valid
    if "gulp" in names:  # ‖R_a‖² + ‖R_b‖² - 2 <R_a, R_b>
      own = jnp.sum(jnp.square(hat), axis=(1, 2))
      out[pre + "gulp"] = jnp.maximum(own[:, None] + own[None, :] - 2 * pairs(hat, matrix(hat)),
                                      0.0) * valid
    if "shape_metric" in names:
      out[pre + "shape_metric"] = (_nuclear(a, factor(a), precision) * valid
                                   / jnp.maximum(norm[:, None] * norm[None, :], 1e-30))
  return out
