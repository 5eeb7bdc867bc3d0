"""Similarity measures beyond linear CKA, from the Grams minibatch CKA forms.

Every measure is computed within each minibatch from the layers' Grams
(`hsic.Layer`), for every pair of layers at once, and summed over minibatches
(each device holds whole minibatches). How minibatches combine (`ESTIMATORS`):

- `linear_cka` with `estimator="biased"`: HSIC_0(K, L) = tr(K H L H) / (n-1)^2
  per minibatch, summed, then CKA = sum HSIC_0(K, L) / sqrt(sum HSIC_0(K, K)
  sum HSIC_0(L, L)). (`"unbiased"`, the paper's HSIC_1, is `hsic.minibatch_sums`.)
- `rbf_cka`: the same sums (HSIC_1, or HSIC_0 if biased) of Gaussian kernels
  exp(-d^2 / (2 sigma^2 median(d^2))) with d^2 the squared distances within the
  minibatch and sigma `rbf_sigma` (Kornblith et al. 2019: the median over all
  pairs, the zero diagonal included).
- `mutual_knn` (Huh et al. 2024): for each example, the share of its k nearest
  neighbours (cosine of l2-normalised features, itself excluded, within its
  minibatch) that are nearest neighbours in both layers; the mean over examples.
- `cknna` (Huh et al. 2024): CKA of the cosine kernels restricted to pairs that
  are mutual k-nearest neighbours in both layers: sum HSIC_1(M K, M L) /
  sqrt(sum HSIC_1(M_K K, M_K K) sum HSIC_1(M_L L, M_L L)), M = M_K * M_L.
- `rsa`: the Pearson (or, `rsa_method="spearman"`, Spearman) correlation of the
  two representational dissimilarity matrices (1 - the correlation between
  examples) over the minibatch's pairs of examples; the mean over minibatches.
- `distance_correlation` (Székely et al. 2007): dCor, the root of CKA's ratio
  with Euclidean distance matrices for kernels: dCov² of each minibatch as a U-
  statistic (Székely & Rizzo 2014; HSIC_1 of distances) or, biased, the V-statistic.
- `rsm_difference` (a distance): the root mean square over pairs of examples of
  the difference of the two layers' Euclidean distances (in the layers' units).
- `knn_jaccard`, `rank_similarity`, `second_order_cosine`: each example's k
  nearest neighbours compared (`neighbours.py`).
- `magnitude_difference`, `concentricity_difference`, `uniformity_difference`:
  one statistic per layer (`descriptive.py`).
- the CCA family (`mean_cca`, `cca_r2`, `svcca`, `pwcca`), `regression`,
  `shape_metric`, `procrustes`, `gulp`, `eigenspace_overlap`: from each layer's
  principal subspace (`subspaces.py`).

`null=True` adds each measure with one layer's examples permuted within the
minibatch (a re-index of its matrices, no forward): what the measure gives for
unrelated representations of the same statistics. Above the diagonal the column
layer's are permuted, below it the row layer's, so that each unordered pair is
computed once (`layerpairs`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import descriptive
from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import layerpairs
from vitcnn_jax.similarity import neighbours
from vitcnn_jax.similarity import subspaces

NAMES = (("linear_cka", "rbf_cka", "distance_correlation", "mutual_knn", "cknna")
         + neighbours.NAMES + ("rsa", "rsm_difference") + subspaces.NAMES + descriptive.NAMES)
# 0 for equal layers, larger apart.
DISTANCES = ("rsm_difference",) + subspaces.DISTANCES + descriptive.NAMES
WITHOUT_NULL = descriptive.NAMES  # one statistic per layer: permuting examples changes nothing
ESTIMATORS = {
    "linear_cka": "sum over minibatches of HSIC(K, L), normalised by the sums of HSIC(K, K) and "
                  "HSIC(L, L) (HSIC_1 of Song et al. unbiased, or HSIC_0 biased)",
    "rbf_cka": "as linear_cka, on Gaussian kernels whose bandwidth is rbf_sigma times the root of "
               "the median squared distance within each minibatch",
    "mutual_knn": "mean over every example of the share of its k nearest neighbours (within its "
                  "minibatch, cosine, itself excluded) that are neighbours in both layers",
    "cknna": "sum over minibatches of HSIC_1 of the cosine kernels masked to mutual k nearest "
             "neighbours, normalised as CKA",
    "rsa": "mean over minibatches of the correlation (Pearson or Spearman) of the two layers' "
           "dissimilarities (1 - correlation of examples) over the minibatch's pairs of examples",
    "mean_cca": "mean over minibatches of the mean canonical correlation of the two layers' top "
                "principal components",
    "cca_r2": "mean over minibatches of the mean squared canonical correlation of the two layers' "
              "top principal components",
    "regression": "mean over minibatches of the R^2 of the column layer predicted by least squares "
                  "from the row layer's top principal components (asymmetric: row predicts column)",
    "shape_metric": "mean over minibatches of cos(theta) of the angular shape metric of the layers' "
                    "top subspace_dims principal components, their singular values partially "
                    "whitened (alpha s + 1 - alpha, the Gram of trace 1); "
                    "the metric is arccos of the per-minibatch value",
    "gulp": "root of the mean over minibatches of the squared GULP distance, the Frobenius "
            "distance of the two layers' ridge hat matrices (each layer scaled to trace 1)",
    "distance_correlation": "root of the sum over minibatches of dCov^2 (the U-statistic if "
                            "unbiased, else the V-statistic) normalised by the sums of each "
                            "layer's dVar^2",
    "rsm_difference": "root of the sum over minibatches of the squared differences of the two "
                      "layers' Euclidean distances between examples, over the number of pairs",
    "knn_jaccard": "mean over every example of |N ∩ N'| / |N ∪ N'| of its k nearest neighbours "
                   "in each layer (within its minibatch, cosine, itself excluded)",
    "rank_similarity": "mean over every example of its shared k nearest neighbours weighted by "
                       "2 / ((1 + |r - r'|)(r + r')) of their ranks, over that weight's largest "
                       "value for as many shared",
    "second_order_cosine": "mean over every example of the cosine between its cosine "
                           "similarities in each layer to the union of its k nearest neighbours",
    "svcca": "mean over minibatches of the mean canonical correlation of the fewest top "
             "principal components that explain svcca_variance of each layer's variance",
    "pwcca": "mean over minibatches of the canonical correlations of the two layers' top "
             "principal components weighted by the row layer's variance along each canonical "
             "variate (asymmetric: the row layer weights)",
    "eigenspace_overlap": "mean over minibatches of ||U_a^T U_b||_F^2 / max(r_a, r_b) of the top "
                          "left singular vectors of the uncentred layers",
    "procrustes": "root of the mean over minibatches of the squared orthogonal Procrustes "
                  "distance of the centred layers' top subspace_dims principal components, scaled "
                  "to unit Frobenius norm",
    "magnitude_difference": "|a - b| of each layer's norm of the mean, from the sum over "
                            "minibatches of <x_i, x_j> over pairs i != j",
    "concentricity_difference": "|a - b| of each layer's mean over every example of its cosine "
                                "to its minibatch's mean",
    "uniformity_difference": "|a - b| of each layer's log of the mean over pairs within "
                             "minibatches of exp(-t ||x_i - x_j||^2), features l2-normalised",
}
RSA_METHODS = ("pearson", "spearman")
# The most principal components of a layer a decomposition per pair of layers reads
# by default (`subspace_dims`; the CCA family's `cca_dims` too): its cost grows as
# their cube, and every pair (and its null) takes one. 0 reads them all.
SUBSPACE_DIMS = 32
LABELS = {"linear_cka": "linear CKA", "rbf_cka": "RBF CKA", "mutual_knn": "mutual k-NN",
          "cknna": "CKNNA", "rsa": "RSA", "mean_cca": "mean CCA", "cca_r2": "mean squared CCA",
          "regression": "regression R² (row predicts column)", "shape_metric": "shape metric cos θ",
          "gulp": "GULP distance", "distance_correlation": "distance correlation",
          "rsm_difference": "RSM difference", "knn_jaccard": "k-NN Jaccard",
          "rank_similarity": "rank similarity", "second_order_cosine": "second-order cosine",
          "svcca": "SVCCA", "pwcca": "PWCCA (row weights)", "eigenspace_overlap": "eigenspace overlap",
          "procrustes": "Procrustes distance", "magnitude_difference": "magnitude difference",
          "concentricity_difference": "concentricity difference",
          "uniformity_difference": "uniformity difference"}


@dataclasses.dataclass(frozen=True)
class Spec:
  """Which measures, and their parameters (`config` fields of the same names)."""
  names: tuple[str, ...] = ("linear_cka",)
  estimator: str = "unbiased"  # of linear_cka and rbf_cka
  rbf_sigma: float = 1.0
  knn_k: int = 10
  rsa_method: str = "pearson"
  null: bool = False
  cca_dims: int = 1  # principal components of each layer the CCA family and regression read
  subspace_dims: int = 0  # the most that procrustes and shape_metric read (0: all)
  shape_alpha: float = 1.0  # the shape metric's partial whitening (1: Procrustes)
  gulp_lambda: float = 0.01  # GULP's ridge penalty, on layers scaled to trace 1
  svcca_variance: float = 0.99  # the share of each layer's variance SVCCA keeps
  uniformity_t: float = 2.0  # the uniformity's temperature


def valid_count(mask: jax.Array) -> jax.Array:
  return mask.astype(jnp.float32).sum()


class Stack(NamedTuple):
  """The layers of one minibatch (`hsic.Layer`s, each at its own scale) stacked:
  what every measure here reads, as (L, ...) arrays."""
  gram: jax.Array  # (L, n, n) Grams of the centred rows
  proj: jax.Array  # (L, n) each centred row's projection on the mean
  rowmean: jax.Array  # (L, n) each row's mean over its features
  mean_sq: jax.Array  # (L,) the squared norm of the mean
  features: jax.Array  # (L,)
  e: jax.Array  # (L,) int32: each layer's arrays are at the scale 2^-e

  @classmethod
  def of(cls, layers: Sequence[hsic.Layer]) -> "Stack":
    return cls(jnp.stack([lay.gram for lay in layers]), jnp.stack([lay.proj for lay in layers]),
               jnp.stack([lay.rowmean for lay in layers]),
               jnp.stack([jnp.sum(jnp.square(lay.mean)) for lay in layers]),
               jnp.asarray([lay.features for lay in layers], jnp.float32),
               jnp.stack([lay.e for lay in layers]))

  def raw(self, mask: jax.Array) -> jax.Array:
    """(L, n, n) Grams of the rows as they are (uncentred), padding rows and
    columns zero (the centred Gram's are; the mean's term is not)."""
    m = mask.astype(jnp.float32)
    return (self.gram + self.proj[:, :, None] + self.proj[:, None, :]
            + self.mean_sq[:, None, None]) * (m[:, None] * m[None, :])


def _normalise_rows(k: jax.Array, mask: jax.Array) -> jax.Array:
  """K_ij / sqrt(K_ii K_jj): a Gram of rows to that of the l2-normalised rows
  (a zero row stays zero), padding zero."""
  d = jnp.diagonal(k)
  inv = jnp.where(d > 0, jax.lax.rsqrt(jnp.where(d > 0, d, 1.0)), 0.0) * mask
  return k * inv[:, None] * inv[None, :]


def cosine(stack: Stack, mask: jax.Array) -> jax.Array:
  """(L, n, n) cosine similarities of the examples' features (l2-normalised Grams)."""
  return jax.vmap(_normalise_rows, (0, None))(stack.raw(mask), mask)


def correlation(stack: Stack, mask: jax.Array) -> jax.Array:
  """(L, n, n) Pearson correlations between examples (each row centred on its own mean)."""
  rowcentred = stack.raw(mask) - stack.features[:, None, None] * stack.rowmean[:, :, None] * stack.rowmean[:, None, :]
  return jax.vmap(_normalise_rows, (0, None))(rowcentred, mask)


def center_biased(k: jax.Array, mask: jax.Array) -> jax.Array:
  """H K H over the valid rows (padding rows and columns zero)."""
  m = mask.astype(k.dtype)
  n = jnp.maximum(m.sum(), 1.0)
  k = k * m[:, None] * m[None, :]
  means = k.sum(axis=0) / n
  return (k - means[:, None] - means[None, :] + means.sum() / n) * m[:, None] * m[None, :]


def _squared_distances(gram: jax.Array) -> jax.Array:
  """(n, n) squared Euclidean distances between the rows of a Gram (clipped at 0)."""
  d = jnp.diagonal(gram)
  return jnp.maximum(d[:, None] + d[None, :] - 2 * gram, 0.0)


def _order_statistics(x: jax.Array, ks: jax.Array) -> jax.Array:
  """The ks-th smallest (0-based) of the non-negative float32 entries of `x`,
  exactly: a bisection on their bits (non-negative floats order as their int32
  bits do), 31 passes over `x` that count; a sort of a 256-row minibatch's
  65,536 distances per layer cost 10x more on CPU."""
  bits = jax.lax.bitcast_convert_type(jnp.abs(x).ravel(), jnp.int32)

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    enough = (bits[None, :] <= mid[:, None]).sum(1) > ks
    return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

  lo = jnp.zeros_like(bits, shape=ks.shape)  # varying as `x` is, in shard_map
  lo, _ = jax.lax.fori_loop(0, 31, halve, (lo, lo + 0x7F800000))  # [0, +inf]
  return jax.lax.bitcast_convert_type(lo, jnp.float32)


def rbf_kernel(gram: jax.Array, mask: jax.Array, sigma: float) -> jax.Array:
  """exp(-d^2 / (2 sigma^2 median d^2)) from a Gram of centred rows, over the
  valid rows (padding zero); a layer with every distance zero gives ones (it is
  constant: its centred kernel is zero)."""
  sq = _squared_distances(gram)
  m = mask.astype(jnp.float32)
  valid = m[:, None] * m[None, :]
  count = valid.sum().astype(jnp.int32)
  middle = _order_statistics(jnp.where(valid > 0, sq, jnp.inf),
                            jnp.stack([jnp.maximum(count - 1, 0) // 2, count // 2]))
  median = 0.5 * (middle[0] + middle[1])
  scale = 2 * sigma ** 2 * median
  kernel = jnp.exp(-sq / jnp.where(scale > 0, scale, 1.0))
  return jnp.where(scale > 0, kernel, 1.0) * valid


def distances(gram: jax.Array, mask: jax.Array) -> jax.Array:
  """(n, n) Euclidean distances between the valid rows of a Gram of centred rows
  (padding zero)."""
  m = mask.astype(jnp.float32)
  return jnp.sqrt(_squared_distances(gram)) * m[:, None] * m[None, :]


def knn_masks(idx: jax.Array, ok: jax.Array) -> jax.Array:
  """(L, n, n) 1 where column j is among row i's k most similar examples, from
  the layers' (L, n, k) lists (`neighbours.neighbours`: itself and padding
  excluded, fewer where fewer are valid; padding rows have none)."""
  num, n, _ = idx.shape
  return jnp.zeros((num, n, n), jnp.float32).at[
      jnp.arange(num)[:, None, None], jnp.arange(n)[None, :, None], idx].set(ok.astype(jnp.float32))


def cknna_hsic(cos: jax.Array, knn: jax.Array, cos_b: jax.Array, knn_b: jax.Array, n: jax.Array,
               precision: hsic.Precision) -> jax.Array:
  """(L, L) HSIC_1(M_ab K_a, M_ab K_b) with M_ab = knn_a * knn_b, for stacked (L, n, n)
  cosine kernels and k-NN masks, as sums over flattened matrices: with P = M K,
  tr(A B^T) = <M M^T K, M M^T K'>, 1^T A 1 = <P_a, M_b>, 1^T A B 1 = sum_k
  (P_a[:, k] . M_b[:, k]) (M_a[k] . P_b[k])."""
  num = cos.shape[0]
  p, p_b = knn * cos, knn_b * cos_b
  s = (knn * jnp.swapaxes(knn, 1, 2) * cos).reshape(num, -1)
  s_b = (knn_b * jnp.swapaxes(knn_b, 1, 2) * cos_b).reshape(cos_b.shape[0], -1)
  trace = jnp.matmul(s, s_b.T, precision=precision)
  a_b = jnp.matmul(p.reshape(num, -1), knn_b.reshape(knn_b.shape[0], -1).T, precision=precision)
  b_a = jnp.matmul(knn.reshape(num, -1), p_b.reshape(p_b.shape[0], -1).T, precision=precision)
  cols = jnp.einsum("aik,bik->kab", p, knn_b, precision=precision)
  rows = jnp.einsum("aki,bki->kab", knn, p_b, precision=precision)
  hs = trace + a_b * b_a / jnp.maximum((n - 1) * (n - 2), 1.0) - 2 * (cols * rows).sum(0) / jnp.maximum(n - 2, 1.0)
  return jnp.where(n >= hsic.MIN_BATCH, hs / jnp.maximum(n * (n - 3), 1.0), 0.0)


def _ranks(u: jax.Array, valid: jax.Array) -> jax.Array:
  """Ordinal ranks of the valid entries (invalid ones ranked last)."""
  order = jnp.argsort(jnp.where(valid > 0, u, jnp.inf))
  return jnp.zeros_like(u).at[order].set(jnp.arange(u.shape[0], dtype=u.dtype))


def rsa_vectors(corr: jax.Array, mask: jax.Array, method: str) -> tuple[jax.Array, jax.Array]:
  """(L, pairs) dissimilarities 1 - corr over the pairs i < j (ranked for Spearman),
  centred over the valid pairs and scaled to unit norm (zero where constant);
  (pairs,) validity."""
  i, j = jnp.triu_indices(corr.shape[1], 1)
  valid = (mask[i] * mask[j]).astype(jnp.float32)
  u = 1.0 - corr[:, i, j]
  if method == "spearman":
    u = jax.vmap(lambda v: _ranks(v, valid))(u)
  count = jnp.maximum(valid.sum(), 1.0)
  z = (u - (u * valid).sum(axis=1, keepdims=True) / count) * valid
  norm = jnp.sqrt((z * z).sum(axis=1, keepdims=True))
  return jnp.where(norm > 0, z / jnp.where(norm > 0, norm, 1.0), 0.0), valid


def permutation(key: jax.Array, mask: jax.Array) -> jax.Array:
  """A random order of the valid rows (which come first), padding left in place."""
  u = jax.random.uniform(key, mask.shape)
  return jnp.argsort(jnp.where(mask > 0, u, 2.0 + jnp.arange(mask.shape[0])))


def _pairs(out: dict, name: str, mats: jax.Array, order: jax.Array | None, precision,
           scale: jax.Array | float = 1.0) -> None:
  """Every pair of layers' flattened (L, n, n) matrices, and the null (see `layerpairs`)."""
  flat = mats.reshape(mats.shape[0], -1)
  out[name] = scale * jnp.matmul(flat, flat.T, precision=precision)
  if order is not None:
    moved = layerpairs.permuted(mats, order).reshape(flat.shape)
    out[f"null/{name}"] = layerpairs.mirror(scale * jnp.matmul(flat, moved.T, precision=precision))


def _kernel_sums(stack: Stack, mask: jax.Array, spec: Spec, order, precision) -> dict[str, jax.Array]:
  """Biased linear CKA, RBF CKA, distance correlation and the RSM difference: inner
  products of each pair of layers' kernel matrices (and the RSM difference's
  squared differences, `_rsm_sums`)."""
  n, out = valid_count(mask), {}
  unbiased = spec.estimator == "unbiased"
  per_layer = lambda f, x: jax.vmap(f, (0, None))(x, mask)  # noqa: E731
  centre = hsic.center_unbiased if unbiased else center_biased
  hsic_norm = (jnp.where(n >= hsic.MIN_BATCH, 1 / jnp.maximum(n * (n - 3), 1.0), 0.0) if unbiased
               else 1 / jnp.maximum(n - 1, 1.0) ** 2)
  if "linear_cka" in spec.names and not unbiased:  # centred features: K is H K H already
    _pairs(out, "hsic_biased", stack.gram, order, precision, 1 / jnp.maximum(n - 1, 1.0) ** 2)
  if "rbf_cka" in spec.names:
    kernels = jax.vmap(rbf_kernel, (0, None, None))(stack.gram, mask, spec.rbf_sigma)
    _pairs(out, "rbf_hsic", per_layer(centre, kernels), order, precision, hsic_norm)
  if {"distance_correlation", "rsm_difference"} & set(spec.names):
    dist = per_layer(distances, stack.gram)  # at the layers' scales 2^-e (declared below)
    if "distance_correlation" in spec.names:  # dCov²: the V-statistic's 1/n², not 1/(n-1)²
      _pairs(out, "dcov", per_layer(centre, dist), order, precision,
             hsic_norm if unbiased else 1 / jnp.maximum(n, 1.0) ** 2)
    if "rsm_difference" in spec.names:
      _pairs(out, "rsm", dist, order, precision)
      out.update(_rsm_sums(dist, stack.e, order))
  if "rsm_difference" in spec.names:
    out["pair_count"] = n * (n - 1)
  return out


hsic.declare_scale("hsic_biased", 2, per_pair=True)
hsic.declare_scale("dcov", 1, per_pair=True)
hsic.declare_scale("rsm", 1, per_pair=True)
hsic.declare_scale("rsm_diff", 1, per_pair=True)
RSM_SPAN = 64  # pairs of layers at most 2^RSM_SPAN apart in scale sum (D_a - D_b)² on the device


def _rsm_differences(dist: jax.Array, other: jax.Array, e: jax.Array) -> dict[str, jax.Array]:
  """(L, L) sums of (D_a − D_b)² of distance matrices `dist` (rows a) and `other`
  (columns b), both at scales 2^-e, term by term, in units of 2^(e_a + e_b)
  (`rsm_diff`): ‖D_a‖² + ‖D_b‖² − 2 <D_a, D_b> cancels for close layers. Each
  layer is brought to 2^((e_a + e_b) / 2) by a power of two (exact), halving the
  sum where e_a + e_b is odd. Pairs more than 2^RSM_SPAN apart in scale, whose
  squares could overflow, give 0 and `rsm_far` 1. The upper triangle, mirrored
  (see `layerpairs`)."""
  delta = e[:, None] - e[None, :]
  near = jnp.abs(delta) <= RSM_SPAN
  delta = jnp.where(near, delta, 0)
  up = (delta + 1) // 2  # a's exponent; b's is up - delta, and their sum 2 up - delta is 0 or 1
  total = layerpairs.squared_differences(dist, other, hsic.pow2(up), hsic.pow2(up - delta))
  total = total * hsic.pow2(delta - 2 * up)
  return {"rsm_diff": layerpairs.mirror(jnp.where(near, total, 0.0)),
          "rsm_far": layerpairs.mirror((~near).astype(jnp.float32))}


def _rsm_sums(dist: jax.Array, e: jax.Array, order: jax.Array | None) -> dict[str, jax.Array]:
  """`_rsm_differences` of every pair of layers, and the null's (the column
  layer's examples re-indexed, see `layerpairs`)."""
  out = _rsm_differences(dist, dist, e)
  if order is not None:
    null = _rsm_differences(dist, layerpairs.permuted(dist, order), e)
    out.update({f"null/{k}": v for k, v in null.items()})
  return out


def _cosine_sums(stack: Stack, mask: jax.Array, spec: Spec, order, precision) -> dict[str, jax.Array]:
  """The measures of the examples' cosines: neighbourhoods and the descriptive statistics."""
  n, out = valid_count(mask), {}
  cos = cosine(stack, mask)
  lists = (neighbours.neighbours(cos, mask, spec.knn_k)  # one top-k for every neighbour measure
           if {"mutual_knn", "cknna", *neighbours.NAMES} & set(spec.names) else None)
  if set(neighbours.NAMES) & set(spec.names):
    out.update(neighbours.neighbour_sums(cos, mask, lists, spec.names, spec.knn_k, order, precision))
  if set(descriptive.NAMES) & set(spec.names):
    out.update(descriptive.statistic_sums(stack.raw(mask), cos, stack.proj, stack.mean_sq, mask,
                                          spec.names, spec.uniformity_t))
  if {"mutual_knn", "cknna"} & set(spec.names):
    knn = knn_masks(*lists)
    if "mutual_knn" in spec.names:
      _pairs(out, "knn", knn, order, precision, 1 / spec.knn_k)
      out["knn_count"] = n
    if "cknna" in spec.names:
      out["cknna_hsic"] = cknna_hsic(cos, knn, cos, knn, n, precision)
      if order is not None:
        moved = layerpairs.permuted(cos, order), layerpairs.permuted(knn, order)  # one-way: 1ᵀ A B 1 is not symmetric
        out["null/cknna_hsic"] = layerpairs.one_way(cknna_hsic(cos, knn, *moved, n, precision),
                                                    cknna_hsic(*moved, cos, knn, n, precision))
  return out


def measure_sums(layers: Sequence[hsic.Layer], mask: jax.Array, spec: Spec,
                 order: jax.Array | None = None,
                 precision: hsic.Precision = hsic.HIGHEST) -> dict[str, jax.Array]:
  """One minibatch's sums of every measure of `spec` but unbiased linear CKA
  (`hsic.linear_sums`), for every pair of `layers`; with `order`, each again
  with one layer's examples re-indexed (prefix "null/", see `layerpairs`). Keys:
  `hsic_biased`, `dcov`, `rsm` and `magnitude` (carrying the layers' scales, see
  `hsic.unscale`), `rbf_hsic`, `knn` and `knn_count` (examples), `cknna_hsic`,
  `rsa` and `rsa_count` (1 per minibatch with pairs), ...; the others are scale-free."""
  stack = Stack.of(layers)
  out = _kernel_sums(stack, mask, spec, order, precision)
  if {"mutual_knn", "cknna", *neighbours.NAMES, *descriptive.NAMES} & set(spec.names):
    out.update(_cosine_sums(stack, mask, spec, order, precision))
  if "rsa" in spec.names:
    corr = correlation(stack, mask)
    z, valid = rsa_vectors(corr, mask, spec.rsa_method)
    out["rsa"] = jnp.matmul(z, z.T, precision=precision)
    out["rsa_count"] = (valid.sum() > 1).astype(jnp.float32)
    if order is not None:
      z_null, _ = rsa_vectors(layerpairs.permuted(corr, order), mask, spec.rsa_method)
      out["null/rsa"] = layerpairs.mirror(jnp.matmul(z, z_null.T, precision=precision))
  chosen = tuple(m for m in spec.names if m in subspaces.NAMES)
  if chosen:
    raw = stack.raw(mask) if "eigenspace_overlap" in chosen else None
    out.update(subspaces.subspace_sums(stack.gram, raw, mask, chosen, spec.cca_dims,
                                       spec.subspace_dims, spec.shape_alpha, spec.gulp_lambda,
                                       spec.svcca_variance, order, precision))
  return out


def only_linear(spec: Spec) -> bool:
  """Whether `spec` asks for nothing but the paper's (unbiased linear) CKA."""
  return set(spec.names) <= {"linear_cka"} and spec.estimator == "unbiased" and not spec.null


def minibatch_sums(acts: Sequence[jax.Array], mask: jax.Array, spec: Spec,
                   axis_name: str | tuple[str, ...] | None = None, group: str | None = None,
                   key: jax.Array | None = None,
                   precision: hsic.Precision = hsic.HIGHEST) -> dict[str, jax.Array]:
  """`layer_sums` of the layers' activations; a minibatch spread over a `group` of
  devices has unbiased linear CKA alone (`hsic.minibatch_sums`)."""
  if group is not None:
    if not only_linear(spec):
      raise ValueError(f"config.measures={spec.names} (estimator {spec.estimator!r}, null "
                       f"{spec.null}) need each minibatch on one device: set "
                       "config.devices_per_minibatch=1 or a smaller config.batch_size; a minibatch "
                       "spread over devices has unbiased linear CKA only.")
    return hsic.minibatch_sums(acts, mask, axis_name, group, precision)
  return layer_sums([hsic.scaled_layer(a, mask, precision) for a in acts], mask, spec, axis_name,
                    key, precision)


def layer_sums(layers: Sequence[hsic.Layer], mask: jax.Array, spec: Spec,
               axis_name: str | tuple[str, ...] | None = None, key: jax.Array | None = None,
               precision: hsic.Precision = hsic.HIGHEST) -> dict[str, jax.Array]:
  """`hsic.linear_sums` of one minibatch's layers (`hsic.scaled_layer`, made where
  the forward made each activation) and, from the same Grams, the sums of
  `spec`'s other measures (and nulls, permuted by `key`), at the exponents shared
  along `axis_name`."""
  order = permutation(key, mask) if spec.null else None
  out = hsic.linear_sums(layers, mask, precision, order)
  if not only_linear(spec):
    out.update(measure_sums(layers, mask, spec, order, precision))
  return hsic.shared_scale(out, axis_name)


def spec_of(config) -> Spec:
  """The measures a config asks for (`measures`, `estimator`, `rbf_sigma`, `knn_k`,
  `rsa_method`, `null`, `cca_dims`, `subspace_dims`, `shape_alpha`, `gulp_lambda`,
  `svcca_variance`, `uniformity_t`), checked against its minibatches."""
  names = tuple(config.get("measures") or ("linear_cka",))
  smallest = min(config.batch_size, config.num_examples % config.batch_size or config.batch_size)
  width = int(config.get("subspace_dims", SUBSPACE_DIMS))
  if width < 0:
    raise ValueError(f"config.subspace_dims={width} must be >= 1, or 0 for every component.")
  dims = int(config.get("cca_dims", 0)) or max(1, min((smallest - 1) // 2, width or smallest))
  spec = Spec(names, config.get("estimator", "unbiased"), float(config.get("rbf_sigma", 1.0)),
              int(config.get("knn_k", 10)), config.get("rsa_method", "pearson"),
              bool(config.get("null", False)), dims, width, float(config.get("shape_alpha", 1.0)),
              float(config.get("gulp_lambda", 0.01)), float(config.get("svcca_variance", 0.99)),
              float(config.get("uniformity_t", 2.0)))
  unknown = [m for m in names if m not in NAMES]
  if unknown or len(set(names)) != len(names):
    raise ValueError(f"config.measures={list(names)}: each at most once, of {list(NAMES)}.")
  if spec.estimator not in ("unbiased", "biased"):
    raise ValueError(f"config.estimator={spec.estimator!r} is not 'unbiased' or 'biased'.")
  if spec.rsa_method not in RSA_METHODS:
    raise ValueError(f"config.rsa_method={spec.rsa_method!r} is not one of {RSA_METHODS}.")
  if not spec.rbf_sigma > 0:
    raise ValueError(f"config.rbf_sigma={spec.rbf_sigma} must be > 0.")
  if not 0 < spec.shape_alpha <= 1:
    raise ValueError(f"config.shape_alpha={spec.shape_alpha} must be in (0, 1]: at 0 the shape "
                     "metric is CCA's, which a layer as wide as the minibatch makes 1 (use mean_cca, "
                     "which reads cca_dims components).")
  if not spec.gulp_lambda > 0:
    raise ValueError(f"config.gulp_lambda={spec.gulp_lambda} must be > 0: at 0 GULP is 0 between "
                     "any two layers as wide as the minibatch (their hat matrices are both the "
                     "centring).")
  if set(subspaces.REDUCED) & set(names) and not 1 <= spec.cca_dims <= (smallest - 1) // 2:
    raise ValueError(f"config.cca_dims={spec.cca_dims}: each layer's principal components are "
                     f"found within a minibatch, whose smallest here has {smallest} examples; use "
                     f"1..{max(1, (smallest - 1) // 2)} (two layers' components then need not meet), "
                     "or 0 for that largest.")
  if not 0 < spec.svcca_variance <= 1:
    raise ValueError(f"config.svcca_variance={spec.svcca_variance} must be in (0, 1]: the share of "
                     "each layer's variance SVCCA keeps (0.99 in Raghu et al. 2017).")
  if not spec.uniformity_t > 0:
    raise ValueError(f"config.uniformity_t={spec.uniformity_t} must be > 0 (2 in Wang & Isola 2020).")
  if {"mutual_knn", "cknna", *neighbours.NAMES} & set(names):
    if not 1 <= spec.knn_k < smallest:
      raise ValueError(f"config.knn_k={spec.knn_k}: neighbours are found within a minibatch, whose "
                       f"smallest here has {smallest} examples; knn_k must be 1..{smallest - 1}.")
  return spec


def _normalise(hs: np.ndarray, own: np.ndarray, names: Sequence[str], measure: str) -> np.ndarray:
  """hs / sqrt(own_aa own_bb), naming a layer whose own term is not positive."""
  diag = np.diag(own)
  bad = [n for n, v in zip(names, diag) if not v > 0]
  if bad:
    raise FloatingPointError(f"{measure}: the self-similarity of layers {bad[:5]} is not positive: "
                             "constant over the examples, or (cknna) without mutual neighbours.")
  return hs / np.sqrt(np.outer(diag, diag))


CLIPPED = {  # measures that clip a negative estimate to 0, and what `values` counts ("clipped/M")
    "distance_correlation": "layer pairs whose dCor² (the ratio of the dCov² sums; the unbiased "
                            "U-statistic can be negative) was negative, reported as dCor 0",
    "magnitude_difference": "layers whose unbiased squared norm of the mean (the mean of <x_i, x_j> "
                            "over pairs i != j) was negative, clipped to 0 before the root"}


def values(sums: dict, names: Sequence[str], spec: Spec, num_examples: int,
           null: bool = False) -> dict[str, np.ndarray | int]:
  """Each measure's (L, L) matrix from one repeat's float64 sums (`null`: its
  null's, normalised by the measure's own self-terms; none for `WITHOUT_NULL`),
  and for each measure M of `CLIPPED` the number of cells (or layers) whose
  negative estimate was clipped to 0, as "clipped/M" (for the json).
  Layers that overflowed or are constant over the examples are refused for every
  measure, as linear CKA refuses them; a cell no layer explains is named too."""
  hsic.check_layers(np.diag(sums["hsic"]), sums["moments"] / num_examples, names, ", ".join(spec.names))
  pre = "null/" if null else ""
  out, clipped = {}, {}
  stats = descriptive.statistics(sums)
  for m in spec.names:
    if null and m in WITHOUT_NULL:
      continue
    if m == "linear_cka":
      key = "hsic" if spec.estimator == "unbiased" else "hsic_biased"
      own = hsic.cka_from_hsic(sums[key], names, sums["moments"] / num_examples)  # checks the layers
      out[m] = own if not null else _normalise(sums[pre + key], sums[key], names, m)
    elif m in ("rbf_cka", "cknna"):
      key = {"rbf_cka": "rbf_hsic", "cknna": "cknna_hsic"}[m]
      out[m] = _normalise(sums[pre + key], sums[key], names, m)
    elif m == "distance_correlation":
      squared = _normalise(sums[pre + "dcov"], sums["dcov"], names, m)
      out[m], clipped[m] = np.sqrt(np.maximum(squared, 0.0)), int(np.sum(squared < 0))
    elif m == "rsm_difference":
      out[m] = np.sqrt(_rsm_squares(sums, pre) / np.maximum(sums["pair_count"], 1.0))
    elif m == "mutual_knn":
      out[m] = sums[pre + "knn"] / sums["knn_count"]
    elif m in neighbours.NAMES:
      out[m] = sums[pre + m] / np.maximum(sums["neighbour_count"], 1.0)
    elif m in descriptive.NAMES:
      out[m] = np.abs(stats[m][:, None] - stats[m][None, :])
      if m == "magnitude_difference":
        clipped[m] = descriptive.negative_squared_norms(sums)
    elif m in subspaces.DISTANCES:
      out[m] = np.sqrt(sums[pre + m] / np.maximum(sums["subspace_count"], 1.0))
    elif m in subspaces.NAMES:
      out[m] = sums[pre + m] / np.maximum(sums["subspace_count"], 1.0)
    else:
      out[m] = sums[pre + "rsa"] / np.maximum(sums["rsa_count"], 1.0)
  for m, v in out.items():
    _check_finite(v, names, pre + m)
  return {**out, **{f"clipped/{m}": c for m, c in clipped.items()}}


def clip_counts(measure: str, per_repeat: Sequence[dict], null: Sequence[dict] | None = None) -> dict:
  """A `CLIPPED` measure's json entry: what its clip is, and how many cells (or
  layers) it fired for in each repeat's `values` (and in its null's)."""
  key = f"clipped/{measure}"
  out = {"what": CLIPPED[measure], "per_repeat": [int(r[key]) for r in per_repeat]}
  if null and key in null[0]:
    out["null_per_repeat"] = [int(r[key]) for r in null]
  return out


def _rsm_squares(sums: dict, pre: str) -> np.ndarray:
  """(L, L) sums of (D_a − D_b)² over every pair of examples: the device's, term by
  term; for a pair whose scales were more than 2^RSM_SPAN apart in some minibatch,
  where one layer's distances dwarf the other's and nothing cancels, ‖D_a‖² + ‖D_b‖²
  − 2 <D_a, D_b> in float64."""
  own = np.diag(sums["rsm"])
  expanded = np.maximum(own[:, None] + own[None, :] - 2 * sums[pre + "rsm"], 0.0)
  return np.where(sums[pre + "rsm_far"] > 0, expanded, sums[pre + "rsm_diff"])


def _check_finite(v: np.ndarray, names: Sequence[str], measure: str) -> None:
  """A measure's matrix is finite, or an error naming its cells: its layers passed
  `hsic.check_layers`, so what is left is a step's own arithmetic failing (e.g. a
  decomposition that did not converge)."""
  bad = np.argwhere(~np.isfinite(v))
  if len(bad):
    cells = ", ".join(f"{names[i]!r} x {names[j]!r}" for i, j in bad[:4])
    raise FloatingPointError(f"{measure}: {len(bad)} of {v.size} layer pairs are not finite ({cells}"
                             f"{', ...' if len(bad) > 4 else ''}), though every layer is finite and "
                             "varies: a decomposition or a sum failed in some minibatch. Please report it "
                             "with the config; the other measures are unaffected (leave this one out).")


def describe(measure: str, spec: Spec) -> str:
  """How a measure's minibatches combine, with its parameters (for the json)."""
  dims = f"at most {spec.cca_dims} components"
  width = f"at most {spec.subspace_dims} components" if spec.subspace_dims else "every component"
  params = {"linear_cka": f"estimator {spec.estimator}",
            "rbf_cka": f"estimator {spec.estimator}, rbf_sigma {spec.rbf_sigma}",
            "distance_correlation": f"estimator {spec.estimator}", "rsm_difference": "Euclidean",
            "mutual_knn": f"k {spec.knn_k}", "cknna": f"k {spec.knn_k}",
            "knn_jaccard": f"k {spec.knn_k}", "rank_similarity": f"k {spec.knn_k}",
            "second_order_cosine": f"k {spec.knn_k}",
            "rsa": f"{spec.rsa_method} correlation", "mean_cca": dims, "cca_r2": dims,
            "svcca": f"svcca_variance {spec.svcca_variance}, {dims}", "pwcca": dims,
            "regression": dims, "eigenspace_overlap": dims,
            "shape_metric": f"alpha {spec.shape_alpha}, {width}", "procrustes": f"alpha 1, {width}",
            "gulp": f"lambda {spec.gulp_lambda}", "magnitude_difference": "unbiased squared norm",
            "concentricity_difference": "minibatch means",
            "uniformity_difference": f"t {spec.uniformity_t}"}[measure]
  return f"{ESTIMATORS[measure]} ({params})"
