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
  metric's chord at α = 1), computed as the residual ‖X Q − Y‖_F at the optimal
  rotation Q (2 − 2 ‖XᵀY‖_* in float32 cancels to ~n ε for equal layers: ~1e-3
  under the root); the root of the mean over minibatches of its square.
- `gulp` (a distance, 0 for equal layers): GULP (Boix-Adserà et al. 2022), how
  differently ridge regression (penalty `gulp_lambda`, on the layers scaled to
  trace 1 as GULP's code does) from each layer predicts any linear function of
  the examples: ‖R_a − R_b‖_F with R = K (K + λ I)⁻¹ the ridge hat matrix, which
  equals the paper's covariance form, summed term by term over R_a − R_b (not as
  ‖R_a‖² + ‖R_b‖² − 2 <R_a, R_b>, which cancels for close layers); the root of
  the mean over minibatches of its square.

Where a layer's width reaches the minibatch, its column space is the whole
centred space and the CCA family and regression say 1 whatever the other layer
(Kornblith et al. 2019, Theorem 1), and so does the eigenspace overlap.
So those (`REDUCED`) read each layer's top at most
`cca_dims` principal components (default: half the smallest minibatch, so that
two subspaces cannot be forced to meet, and at most `subspace_dims`), and the
job's json names the layers this reduced and the share of their variance kept.
`shape_metric` and `procrustes` (`WIDE`) read each layer's top `subspace_dims`
components (default 32; 0: every one, as their papers do), scaled to unit norm:
an SVD per pair of layers, and per null pair, costs the cube of that (at
minibatches of 256, every component took 29 of the 51 s of a step of 54 layers
on 2 cores), and the json gives the share of each layer's variance they kept
(α > 0 regularises the shape metric, so no Theorem 1 forces this).

Each is a mean over minibatches of its per-minibatch value (a new alignment or
regression per minibatch: biased up against the full data, the more so the
smaller the minibatch; the null shows the level of unrelated layers).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import lapack
from vitcnn_jax.similarity import layerpairs
from vitcnn_jax.similarity import registry

# Read at most each layer's top `subspace_dims` components.
WIDE = ("shape_metric", "procrustes")
# Read at most each layer's top `cca_dims` components.
REDUCED = ("mean_cca", "cca_r2", "svcca", "pwcca", "regression", "eigenspace_overlap")
# The sum (`subspace_sums`) of each layer's share of variance in the components a measure reads.
KEPT = {**{m: "subspace_kept" for m in REDUCED}, **{m: "shape_kept" for m in WIDE},
        "eigenspace_overlap": "overlap_kept"}
_TOL = 16 * float(jnp.finfo(jnp.float32).eps)  # eigenvalues below this share of the largest are 0


def unit_trace(gram: jax.Array) -> jax.Array:
  """(L, n, n) Grams scaled to trace 1 (a zero Gram stays zero)."""
  trace = jnp.trace(gram, axis1=1, axis2=2)
  return gram / jnp.where(trace > 0, trace, 1.0)[:, None, None]


def spectra(k: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(L, n, n) Grams of trace 1 (`unit_trace`) -> each layer's eigenvectors (L, n,
  n), largest first, eigenvalues (L, n), and which are nonzero (L, n) (padding
  rows give none: their rows and columns are zero)."""
  n = jnp.maximum(mask.astype(jnp.float32).sum(), 1.0)
  s, u = lapack.eigh(k)
  s, u = s[:, ::-1], u[:, :, ::-1]
  kept = s > _TOL * n * s[:, :1]
  return u, jnp.where(kept, s, 0.0), kept


def _outer(u: jax.Array, w: jax.Array, precision, width: int | None = None) -> jax.Array:
  """(L, n, n) U diag(w) Uᵀ of each layer; `width`: w is 0 past its first `width`
  components, which are then all that is multiplied (a top-32 projector of 256
  rows: an eighth of the full product)."""
  u, w = (u, w) if width is None else (u[:, :, :width], w[:, :width])
  return jnp.einsum("lik,ljk->lij", u * w[:, None, :], u, precision=precision)


def _nuclear(m: jax.Array) -> jax.Array:
  """(P,) sums of the singular values of (P, r, s) matrices."""
  return jnp.linalg.svd(m, compute_uv=False).sum(-1)


def _procrustes(a: jax.Array, b: jax.Array, m: jax.Array, precision) -> dict[str, jax.Array]:
  """The squared Procrustes distances of (P, n, r) factors of unit norm (`m`: their
  products aᵀb) as the residual ‖a Q − b‖_F² at the optimal rotation Q = W Vᵀ
  (aᵀb = W Σ Vᵀ), a sum of squares that is 0 for equal layers and keeps its
  relative precision for close ones, and the nuclear norms Σ σ (the shape
  metric's at α = 1). Any completion of W, V past aᵀb's rank gives the same
  residual, 2 − 2 Σ σ in exact arithmetic."""
  w, sigma, vt = lapack.svd(m)
  fitted = jnp.einsum("pnr,prs->pns", a, jnp.matmul(w, vt, precision=precision), precision=precision)
  return {"pro_sq": jnp.sum(jnp.square(fitted - b), axis=(1, 2)), "nuc_p": sigma.sum(-1)}


def _pwcca(m: jax.Array, wx: jax.Array, wy: jax.Array) -> dict[str, jax.Array]:
  """The canonical correlations' sums of (P, r, r) products of orthonormal factors
  (zero columns past each layer's rank) and PWCCA's weighted means both ways: each
  canonical variate of the row layer h = Q u weighted by the variance of the layer
  along it, hᵀ K h = Σ w u² (`wx`, `wy` (P, r): K's eigenvalues on the factors)."""
  u, rho, vt = lapack.svd(m)
  fewer = jnp.arange(rho.shape[1])[None, :] < jnp.minimum((wx > 0).sum(1), (wy > 0).sum(1))[:, None]
  weighted = lambda wts: ((wts * fewer * rho).sum(1)
                          / jnp.maximum((wts * fewer).sum(1), 1e-30))
  return {"cca": rho.sum(-1), "pwcca": weighted(jnp.einsum("pk,pki->pi", wx, u * u)),
          "pwcca~": weighted(jnp.einsum("pk,pik->pi", wy, vt * vt))}


def _chunk_sums(x: dict, ys: tuple, chunk, rows: dict, cols: tuple, names, precision) -> dict[str, jax.Array]:
  """The SVD measures of one chunk of P pairs (`chunk`, a `layerpairs.Chunk`): the
  row layers' factors `rows` against the column layers' `cols` (the layers, and
  for the null their re-indexed examples, laid out by `layerpairs.examples_last`),
  `x` and `ys` the chunk's per-layer values; each kind of SVD in one call for
  both, one call after another."""
  calls = lapack.OneAtATime()
  both = lambda k: (jnp.concatenate([x[k]] * len(ys)), jnp.concatenate([y[k] for y in ys]))
  prod = lambda k: jnp.concatenate([chunk.products(rows[k], c[k], precision) for c in cols])
  got = {}
  if "a" in rows:
    got["nuc"] = calls(_nuclear, prod("a"))
  if "pro" in rows:
    got.update(calls(functools.partial(_procrustes, precision=precision), *both("pro"), prod("pro")))
  if "pwcca" in names:
    got.update(calls(_pwcca, prod("q"), *both("w")))
  elif "mean_cca" in names:
    got["cca"] = calls(_nuclear, prod("q"))
  if "svcca" in names and "cca" in got:  # the same subspaces where no layer keeps fewer
    short = (x["short"] | ys[0]["short"]).any()
    got["cca_sv"] = calls(lambda m, c: jax.lax.cond(short, _nuclear, lambda _: c, m), prod("q_sv"), got["cca"])
  elif "svcca" in names:
    got["cca_sv"] = calls(_nuclear, prod("q_sv"))
  parts = lambda v: jnp.split(v, len(ys))
  return {pre + k: part for k, v in got.items() for pre, part in zip(("", "null/"), parts(v))}


def _matmul_sums(f: dict, names, order: jax.Array | None, precision) -> dict[str, jax.Array]:
  """The measures of per-layer (L, n, n) matrices: one matmul over every pair;
  with `order`, their nulls (see `layerpairs`)."""
  flat = lambda m: m.reshape(m.shape[0], -1)
  moved = (lambda m: m) if order is None else (lambda m: layerpairs.permuted(m, order))
  pairs = lambda x, y: grams.flat_products(flat(x), flat(moved(y)), precision)
  both_ways = (lambda v: v) if order is None else layerpairs.mirror
  out = {}
  if "cca_r2" in names:
    out["cca_r2"] = both_ways(pairs(f["p"], f["p"])) / f["smaller"]
  if "regression" in names:  # below the diagonal: the row layer's examples re-indexed instead
    reg = pairs(f["p"], f["k"])
    out["regression"] = reg if order is None else layerpairs.one_way(
        reg, grams.flat_products(flat(moved(f["p"])), flat(f["k"]), precision))
  if "eigenspace_overlap" in names:
    out["eigenspace_overlap"] = both_ways(pairs(f["overlap"], f["overlap"])) / f["larger"]
  if "gulp" in names:  # ‖R_a − R_b‖² term by term: the expansion in float32 gave equal layers ~1e-3;
    # the null's column layer re-indexed
    out["gulp"] = layerpairs.mirror(layerpairs.symmetric_squared_differences(f["hat"], order=order))
  return {("" if order is None else "null/") + k: v for k, v in out.items()}


def _svd_sums(f: dict, names, order: jax.Array | None, calls: lapack.OneAtATime, alpha: float,
              precision) -> dict[str, jax.Array]:
  """The measures that take an SVD per pair of layers (and their nulls), in one
  pass over the pairs; the shape metric at α = 1 reuses Procrustes' SVD."""
  procrustes = "procrustes" in names
  keys = (("a",) if "shape_metric" in names and not (procrustes and alpha == 1) else ()) + (
      ("pro",) if procrustes else ()) + (
      ("q", "w") if {"mean_cca", "pwcca"} & set(names) else ()) + (
      ("q_sv", "short") if "svcca" in names else ())
  if not keys:
    return {}
  rows = {k: f[k] for k in keys}
  cols = (rows,) if order is None else (
      rows, {k: v[:, order] if v.ndim == 3 else v for k, v in rows.items()})
  small = lambda tree: {k: v for k, v in tree.items() if v.ndim < 3 or k == "pro"}  # gathered per pair
  across = lambda tree: {k: layerpairs.examples_last(v) for k, v in tree.items() if v.ndim == 3}

  def over_pairs(r, c):
    last = tuple(map(across, c))  # once, outside the loop over chunks
    return layerpairs.pairwise(lambda x, ys, chunk: _chunk_sums(x, ys, chunk, r, last, names, precision),
                               f["norm"].shape[0], small(r), tuple(map(small, c)))
  got = calls(over_pairs, rows, cols)
  out = {}
  for pre in ("", "null/")[:len(cols)]:
    if "mean_cca" in names:
      out[pre + "mean_cca"] = got[pre + "cca"] / f["smaller"]
    if "pwcca" in names:
      out[pre + "pwcca"] = got[pre + "pwcca"]
    if "svcca" in names:
      out[pre + "svcca"] = got[pre + "cca_sv"] / f["smaller_sv"]
    if "shape_metric" in names:
      nuc = got[pre + "nuc"] if pre + "nuc" in got else got[pre + "nuc_p"]
      out[pre + "shape_metric"] = nuc / jnp.maximum(f["norm"][:, None] * f["norm"][None, :], 1e-30)
    if "procrustes" in names:
      out[pre + "procrustes"] = got[pre + "pro_sq"]
  return out


def subspace_sums(gram: jax.Array, raw: jax.Array | None, mask: jax.Array, names: tuple[str, ...],
                  dims: int, width: int, alpha: float, ridge: float, variance: float,
                  order: jax.Array | None, precision) -> dict[str, jax.Array]:
  """One minibatch's (L, L) value of each measure of `names` from the layers'
  centred Grams (and, for `eigenspace_overlap`, the `raw` uncentred ones); with
  `order`, of the null too (one layer's examples re-indexed, see `layerpairs`);
  `subspace_count`, 1 where the minibatch has at least two examples,
  `subspace_reduced` (L,), 1 where a layer's rank exceeds `dims`, and the share
  of each layer's variance in its top `dims` components (`subspace_kept`) and
  in the top `width` that `procrustes` and `shape_metric` read (`shape_kept`;
  width 0: every component), and of the uncentred layer in its top `dims` for
  `eigenspace_overlap` (`overlap_kept`). Summed over minibatches."""
  calls = lapack.OneAtATime()
  both = unit_trace(gram if raw is None else jnp.concatenate([gram, raw]))  # one eigh for both
  u, s, kept = calls(spectra, both, mask)
  if raw is not None:
    (u, ur), (s, sr), (kept, kept_raw) = (jnp.split(v, 2) for v in (u, s, kept))
  first = (jnp.arange(s.shape[1]) < dims)[None, :]
  top = kept & first
  width = min(width or s.shape[1], s.shape[1])
  wide = kept & (jnp.arange(s.shape[1]) < width)[None, :]  # what Procrustes and the shape metric read
  share = (s * wide).sum(1)
  smaller = lambda r: jnp.maximum(jnp.minimum(r[:, None], r[None, :]), 1.0)
  has = lambda *m: bool(set(m) & set(names))
  sv = top & ((jnp.cumsum(s, axis=1) - s) < variance)  # SVCCA: the fewest that reach `variance`
  sw = s * wide / jnp.where(share > 0, share, 1.0)[:, None]  # the top `width`, of trace 1
  a = (u * ((alpha * jnp.sqrt(sw) + (1 - alpha)) * wide)[:, None, :])[:, :, :width]
  f = {"smaller": smaller(top.sum(1).astype(jnp.float32)), "a": a,
       "p": _outer(u, top.astype(s.dtype), precision, dims) if has("cca_r2", "regression") else None,
       "k": both[:len(gram)] if has("regression") else None,  # the Grams of trace 1
       "q": (u * top[:, None, :])[:, :, :dims],  # the top components only: dims x dims SVDs
       "w": s[:, :dims] * top[:, :dims], "norm": jnp.sqrt(jnp.sum(jnp.square(a), axis=(1, 2))),
       "hat": _outer(u, s / (s + ridge), precision) if has("gulp") else None,
       "pro": (u * jnp.sqrt(sw)[:, None, :])[:, :, :width],  # norm 1
       "q_sv": (u * sv[:, None, :])[:, :, :dims], "smaller_sv": smaller(sv.sum(1).astype(jnp.float32)),
       "short": (sv != top).any(1)}  # a layer whose SVCCA keeps fewer than its top components
  if has("eigenspace_overlap"):
    top_raw = kept_raw & first
    f["overlap"] = _outer(ur, top_raw.astype(sr.dtype), precision, dims)
    r = top_raw.sum(1).astype(jnp.float32)
    f["larger"] = jnp.maximum(jnp.maximum(r[:, None], r[None, :]), 1.0)
  valid = (mask.astype(jnp.float32).sum() >= 2).astype(jnp.float32)
  out = {"subspace_count": valid, "subspace_reduced": (kept.sum(1) > dims).astype(jnp.float32) * valid,
         "subspace_kept": (s * top).sum(1) * valid, "shape_kept": share * valid}
  if has("eigenspace_overlap"):  # the uncentred layer's, whose components it reads
    out["overlap_kept"] = (sr * top_raw).sum(1) * valid
  got = {**_matmul_sums(f, names, None, precision), **_svd_sums(f, names, order, calls, alpha, precision)}
  if order is not None:
    got.update(_matmul_sums(f, names, order, precision))
  return {**out, **{m: v * valid for m, v in got.items()}}


def _sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  spec = mb.spec
  raw = mb.stack.raw(mb.mask) if "eigenspace_overlap" in chosen else None
  return subspace_sums(mb.stack.gram, raw, mb.mask, chosen, spec.cca_dims, spec.subspace_dims,
                       spec.shape_alpha, spec.gulp_lambda, spec.svcca_variance, mb.order, mb.precision)


def _check(spec: registry.Spec, smallest: int, chosen: tuple[str, ...]) -> None:
  if not 0 < spec.shape_alpha <= 1:
    raise ValueError(f"config.shape_alpha={spec.shape_alpha} must be in (0, 1]: at 0 the shape "
                     "metric is CCA's, which a layer as wide as the minibatch makes 1 (use mean_cca, "
                     "which reads cca_dims components).")
  if not spec.gulp_lambda > 0:
    raise ValueError(f"config.gulp_lambda={spec.gulp_lambda} must be > 0: at 0 GULP is 0 between "
                     "any two layers as wide as the minibatch (their hat matrices are both the "
                     "centring).")
  if set(REDUCED) & set(chosen) and not 1 <= spec.cca_dims <= (smallest - 1) // 2:
    raise ValueError(f"config.cca_dims={spec.cca_dims}: each layer's principal components are "
                     f"found within a minibatch, whose smallest here has {smallest} examples; use "
                     f"1..{max(1, (smallest - 1) // 2)} (two layers' components then need not meet), "
                     "or 0 for that largest.")
  if not 0 < spec.svcca_variance <= 1:
    raise ValueError(f"config.svcca_variance={spec.svcca_variance} must be in (0, 1]: the share of "
                     "each layer's variance SVCCA keeps (0.99 in Raghu et al. 2017).")


def _dims(spec: registry.Spec) -> str:
  return f"at most {spec.cca_dims} components"


def _width(spec: registry.Spec) -> str:
  return f"at most {spec.subspace_dims} components" if spec.subspace_dims else "every component"


def _measure(name: str, label: str, estimator: str, params, distance: bool = False) -> registry.Measure:
  """A mean over minibatches (a distance: the root of the mean of its square)."""
  mean = lambda t: t.mean(name, "subspace_count")
  return registry.Measure(name, label, estimator, params,
                          (lambda t: np.sqrt(mean(t))) if distance else mean, distance=distance)


FAMILY = registry.Family((
    _measure("mean_cca", "mean CCA", "mean over minibatches of the mean canonical correlation of the "
             "two layers' top principal components", _dims),
    _measure("cca_r2", "mean squared CCA", "mean over minibatches of the mean squared canonical "
             "correlation of the two layers' top principal components", _dims),
    _measure("svcca", "SVCCA", "mean over minibatches of the mean canonical correlation of the fewest "
             "top principal components that explain svcca_variance of each layer's variance",
             lambda spec: f"svcca_variance {spec.svcca_variance}, {_dims(spec)}"),
    _measure("pwcca", "PWCCA (row weights)", "mean over minibatches of the canonical correlations of "
             "the two layers' top principal components weighted by the row layer's variance along "
             "each canonical variate (asymmetric: the row layer weights)", _dims),
    _measure("regression", "regression R² (row predicts column)", "mean over minibatches of the R^2 of "
             "the column layer predicted by least squares from the row layer's top principal "
             "components (asymmetric: row predicts column)", _dims),
    _measure("shape_metric", "shape metric cos θ", "mean over minibatches of cos(theta) of the angular "
             "shape metric of the layers' top subspace_dims principal components, their singular values "
             "partially whitened (alpha s + 1 - alpha, the Gram of trace 1); the metric is arccos of "
             "the per-minibatch value", lambda spec: f"alpha {spec.shape_alpha}, {_width(spec)}"),
    _measure("procrustes", "Procrustes distance", "root of the mean over minibatches of the squared "
             "orthogonal Procrustes distance of the centred layers' top subspace_dims principal "
             "components, scaled to unit Frobenius norm", lambda spec: f"alpha 1, {_width(spec)}",
             distance=True),
    _measure("gulp", "GULP distance", "root of the mean over minibatches of the squared GULP distance, "
             "the Frobenius distance of the two layers' ridge hat matrices (each layer scaled to trace 1)",
             lambda spec: f"lambda {spec.gulp_lambda}", distance=True),
    _measure("eigenspace_overlap", "eigenspace overlap", "mean over minibatches of ||U_a^T U_b||_F^2 / "
             "max(r_a, r_b) of the top left singular vectors of the uncentred layers", _dims)),
    _sums, _check)
