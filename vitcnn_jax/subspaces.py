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
- `svcca` (Raghu et al. 2017): mean CCA of each layer's fewest top components
  that explain `svcca_variance` of its variance (99% in the paper).
- `pwcca` (Morcos et al. 2018): the canonical correlations weighted by how much
  of the row layer each canonical variate h carries, hᵀ K h (the paper's weights,
  Σ_j |<h, x_j>| over the features, cannot be had from a Gram; these are their
  squared form, Σ_j <h, x_j>², and are unchanged by rotating the features).
- `eigenspace_overlap` (May et al. 2019): ‖U_aᵀ U_b‖_F² / max(r_a, r_b) of the
  top left singular vectors of the uncentred layers.
- `procrustes` (a distance): Ding et al.'s (2021) orthogonal Procrustes distance
  of the centred layers scaled to unit norm, (2 - 2 ‖XᵀY‖_*)^½ (the shape
  metric's chord at α = 1); the root of the mean over minibatches of its square.
- `gulp` (a distance, 0 for equal layers): GULP (Boix-Adserà et al. 2022), how
  differently ridge regression (penalty `gulp_lambda`, on the layers scaled to
  trace 1 as GULP's code does) from each layer predicts any linear function of
  the examples: ‖R_a − R_b‖_F with R = K (K + λ I)⁻¹ the ridge hat matrix, which
  equals the paper's covariance form; the root of the mean over minibatches of
  its square.

Where a layer's width reaches the minibatch, its column space is the whole
centred space and the CCA family and regression say 1 whatever the other layer
(Kornblith et al. 2019, Theorem 1), and so does the eigenspace overlap.
So those (`REDUCED`) read each layer's top at most
`cca_dims` principal components (default: half the smallest minibatch, so that
two subspaces cannot be forced to meet), and the job's json names the layers
this reduced; `shape_metric` keeps every component (α > 0 regularises it).

Each is a mean over minibatches of its per-minibatch value (a new alignment or
regression per minibatch: biased up against the full data, the more so the
smaller the minibatch; the null shows the level of unrelated layers).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

NAMES = ("mean_cca", "cca_r2", "svcca", "pwcca", "regression", "shape_metric", "procrustes",
         "gulp", "eigenspace_overlap")
DISTANCES = ("procrustes", "gulp")  # 0 for equal layers, larger apart; roots of mean squares
# Read at most each layer's top `cca_dims` components.
REDUCED = ("mean_cca", "cca_r2", "svcca", "pwcca", "regression", "eigenspace_overlap")
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


def pairwise(fn, a, b=None) -> dict[str, jax.Array]:
  """(L, L) values of `fn` for every pair of rows of the stacked pytrees `a` and `b`
  (leading axis L), L pairs at a time (all pairs at once would not fit). `fn` maps
  two (P, ...) chunks to a dict of (P,) values; with b None (a against itself, each
  unordered pair once) a key ending "~" gives the value of the reversed pair,
  otherwise the matrix is symmetric. With `b`, "~" keys are dropped."""
  num = jax.tree.leaves(a)[0].shape[0]
  if b is None:
    rows, cols = np.triu_indices(num)
  else:
    rows, cols = np.divmod(np.arange(num * num), num)
  pad = -len(rows) % num
  chunks = np.stack([np.r_[rows, np.zeros(pad, int)], np.r_[cols, np.zeros(pad, int)]], -1)
  other = a if b is None else b
  take = lambda tree, idx: jax.tree.map(lambda x: x[idx], tree)  # noqa: E731
  values = jax.lax.map(lambda p: fn(take(a, p[:, 0]), take(other, p[:, 1])),
                       jnp.asarray(chunks.reshape(-1, num, 2)))
  out = {}
  for key, v in values.items():
    if key.endswith("~"):
      continue
    v = v.reshape(-1)[:len(rows)]
    m = jnp.zeros((num, num), v.dtype).at[rows, cols].set(v)
    if b is None:
      back = values.get(key + "~")
      m = (m.at[cols, rows].set(back.reshape(-1)[:len(rows)]) if back is not None
           else m + jnp.triu(m, 1).T)
    out[key] = m
  return out


class _OneAtATime:
  """Runs the step's LAPACK calls one after another. jaxlib's CPU eigh and SVD
  split a batch over XLA's thread pool and block a pool thread until it is done;
  two such calls that XLA runs side by side can each hold a thread the other
  waits for (on 2 cores: a deadlock, seen at minibatches of 256). Each call's
  input is made to wait for the previous call's output."""

  def __init__(self):
    self.last = None

  def __call__(self, fn, *args):
    if self.last is not None:
      args, _ = jax.lax.optimization_barrier((args, self.last))
    out = fn(*args)
    self.last = out
    return out


def _nuclear(a: jax.Array, b: jax.Array | None, precision) -> jax.Array:
  """(L, L) sums of the singular values of a_iᵀ b_j for stacked (L, n, r) factors
  (with b None, of a_iᵀ a_j)."""
  def fn(x, y):
    m = jnp.einsum("pnr,pns->prs", x, y, precision=precision)
    return {"nuc": jnp.linalg.svd(m, compute_uv=False).sum(-1)}
  return pairwise(fn, a, b)["nuc"]


def _canonical(q: jax.Array, w: jax.Array, other, *, pw: bool, precision) -> dict[str, jax.Array]:
  """(L, L) sums of the canonical correlations of the (L, n, r) orthonormal
  factors `q` (zero columns past each layer's rank) and, with `pw`, PWCCA's
  weighted mean: each canonical variate of the row layer h = Q u weighted by the
  variance of the layer along it, hᵀ K h = Σ w u² (`w` (L, r), K's eigenvalues on q);
  `other`: the column layers' (q, w), or None for q against itself."""
  def fn(x, y):
    (qx, wx), (qy, wy) = x, y
    m = jnp.einsum("pnr,pns->prs", qx, qy, precision=precision)
    if not pw:
      return {"cca": jnp.linalg.svd(m, compute_uv=False).sum(-1)}
    u, rho, vt = jnp.linalg.svd(m, full_matrices=False)
    fewer = jnp.arange(rho.shape[1])[None, :] < jnp.minimum((wx > 0).sum(1), (wy > 0).sum(1))[:, None]
    weighted = lambda wts: ((wts * fewer * rho).sum(1)  # noqa: E731
                            / jnp.maximum((wts * fewer).sum(1), 1e-30))
    return {"cca": rho.sum(-1), "pwcca": weighted(jnp.einsum("pk,pki->pi", wx, u * u)),
            "pwcca~": weighted(jnp.einsum("pk,pik->pi", wy, vt * vt))}
  return pairwise(fn, (q, w), other)


def _matmul_sums(f: dict, names, matrix, precision) -> dict[str, jax.Array]:
  """The measures of per-layer (L, n, n) matrices: one matmul over every pair."""
  flat = lambda m: m.reshape(m.shape[0], -1)  # noqa: E731
  pairs = lambda x, y: jnp.matmul(flat(x), flat(y).T, precision=precision)  # noqa: E731
  out = {}
  if "cca_r2" in names:
    out["cca_r2"] = pairs(f["p"], matrix(f["p"])) / f["smaller"]
  if "regression" in names:
    out["regression"] = pairs(f["p"], matrix(f["k"]))
  if "eigenspace_overlap" in names:
    out["eigenspace_overlap"] = pairs(f["overlap"], matrix(f["overlap"])) / f["larger"]
  if "gulp" in names:  # ‖R_a‖² + ‖R_b‖² - 2 <R_a, R_b>
    own = jnp.sum(jnp.square(f["hat"]), axis=(1, 2))
    out["gulp"] = jnp.maximum(own[:, None] + own[None, :] - 2 * pairs(f["hat"], matrix(f["hat"])), 0.0)
  return out


def _svd_sums(f: dict, names, factor, lapack: _OneAtATime, alpha: float, precision) -> dict[str, jax.Array]:
  """The measures that take an SVD per pair of layers, one batch after another."""
  nuclear = functools.partial(_nuclear, precision=precision)
  out = {}
  if {"mean_cca", "pwcca"} & set(names):
    got = lapack(functools.partial(_canonical, pw="pwcca" in names, precision=precision), f["q"], f["w"],
                 None if factor(f["q"]) is None else (factor(f["q"]), f["w"]))
    if "mean_cca" in names:
      out["mean_cca"] = got["cca"] / f["smaller"]
    if "pwcca" in names:
      out["pwcca"] = got["pwcca"]
  if "svcca" in names:
    out["svcca"] = lapack(nuclear, f["q_sv"], factor(f["q_sv"])) / f["smaller_sv"]
  if "shape_metric" in names:
    nuc = lapack(nuclear, f["a"], factor(f["a"]))
    out["shape_metric"] = nuc / jnp.maximum(f["norm"][:, None] * f["norm"][None, :], 1e-30)
  if "procrustes" in names:  # d² = ‖X‖² + ‖Y‖² - 2 ‖XᵀY‖_* at unit norms
    if not ("shape_metric" in names and alpha == 1):
      nuc = lapack(nuclear, f["procrustes"], factor(f["procrustes"]))
    out["procrustes"] = jnp.maximum(2 - 2 * nuc, 0.0)
  return out


def subspace_sums(gram: jax.Array, raw: jax.Array | None, mask: jax.Array, names: tuple[str, ...],
                  dims: int, alpha: float, ridge: float, variance: float, order: jax.Array | None,
                  precision) -> dict[str, jax.Array]:
  """One minibatch's (L, L) value of each measure of `names` from the layers'
  centred Grams (and, for `eigenspace_overlap`, the `raw` uncentred ones); with
  `order`, of the null too (the column layer's examples re-indexed);
  `subspace_count`, 1 where the minibatch has at least two examples, and
  `subspace_reduced` (L,), 1 where a layer's rank exceeds `dims`. Summed over minibatches."""
  lapack = _OneAtATime()
  both = gram if raw is None else jnp.concatenate([gram, raw])  # one eigh for both
  u, s, kept = lapack(spectra, both, mask)
  if raw is not None:
    (u, ur), (s, sr), (kept, kept_raw) = (jnp.split(v, 2) for v in (u, s, kept))
  first = (jnp.arange(s.shape[1]) < dims)[None, :]
  top = kept & first
  smaller = lambda r: jnp.maximum(jnp.minimum(r[:, None], r[None, :]), 1.0)  # noqa: E731
  has = lambda *m: bool(set(m) & set(names))  # noqa: E731
  sv = top & ((jnp.cumsum(s, axis=1) - s) < variance)  # SVCCA: the fewest that reach `variance`
  a = u * (alpha * jnp.sqrt(s) + (1 - alpha) * kept)[:, None, :]
  f = {"smaller": smaller(top.sum(1).astype(jnp.float32)), "a": a,
       "p": _outer(u, top.astype(s.dtype), precision) if has("cca_r2", "regression") else None,
       "k": _outer(u, s, precision) if has("regression") else None,  # the Gram of trace 1
       "q": (u * top[:, None, :])[:, :, :dims],  # the top components only: dims x dims SVDs
       "w": s[:, :dims] * top[:, :dims], "norm": jnp.sqrt(jnp.sum(jnp.square(a), axis=(1, 2))),
       "hat": _outer(u, s / (s + ridge), precision) if has("gulp") else None,
       "procrustes": u * jnp.sqrt(s)[:, None, :],  # norm 1: the layer scaled to unit Frobenius norm
       "q_sv": (u * sv[:, None, :])[:, :, :dims], "smaller_sv": smaller(sv.sum(1).astype(jnp.float32))}
  if has("eigenspace_overlap"):
    top_raw = kept_raw & first
    f["overlap"] = _outer(ur, top_raw.astype(sr.dtype), precision)
    r = top_raw.sum(1).astype(jnp.float32)
    f["larger"] = jnp.maximum(jnp.maximum(r[:, None], r[None, :]), 1.0)
  valid = (mask.astype(jnp.float32).sum() >= 2).astype(jnp.float32)
  out = {"subspace_count": valid, "subspace_reduced": (kept.sum(1) > dims).astype(jnp.float32) * valid}
  movers = [("", lambda m: m, lambda x: None)]  # None: a layer stack against itself
  if order is not None:  # rows and columns of a matrix, rows of a factor
    movers.append(("null/", lambda m: m[:, order][:, :, order], lambda x: x[:, order]))
  for pre, matrix, factor in movers:
    got = {**_matmul_sums(f, names, matrix, precision),
           **_svd_sums(f, names, factor, lapack, alpha, precision)}
    out.update({pre + m: v * valid for m, v in got.items()})
  return out
