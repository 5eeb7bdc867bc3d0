"""Measures of each minibatch's (n, n) matrices of its examples, from the Grams.

- `linear_cka` with `estimator="biased"`: HSIC_0(K, L) = tr(K H L H) / (n-1)^2
  per minibatch, summed, then CKA = sum HSIC_0(K, L) / sqrt(sum HSIC_0(K, K)
  sum HSIC_0(L, L)). (`"unbiased"`, the paper's HSIC_1, is `hsic.linear_sums`.)
- `rbf_cka`: the same sums (HSIC_1, or HSIC_0 if biased) of Gaussian kernels
  exp(-d^2 / (2 sigma^2 median(d^2))) with d^2 the squared distances within the
  minibatch and sigma `rbf_sigma` (Kornblith et al. 2019: the median over all
  pairs, the zero diagonal included).
- `distance_correlation` (Székely et al. 2007): dCor, the root of CKA's ratio
  with Euclidean distance matrices for kernels: dCov² of each minibatch as a U-
  statistic (Székely & Rizzo 2014; HSIC_1 of distances) or, biased, the V-statistic.
- `mutual_knn` (Huh et al. 2024): for each example, the share of its k nearest
  neighbours (cosine of l2-normalised features, itself excluded, within its
  minibatch) that are nearest neighbours in both layers; the mean over examples.
- `cknna` (Huh et al. 2024): CKA of the cosine kernels restricted to pairs that
  are mutual k-nearest neighbours in both layers: sum HSIC_1(M K, M L) /
  sqrt(sum HSIC_1(M_K K, M_K K) sum HSIC_1(M_L L, M_L L)), M = M_K * M_L.
- `rsa`: the Pearson (or, `rsa_method="spearman"`, Spearman) correlation of the
  two representational dissimilarity matrices (1 - the correlation between
  examples) over the minibatch's pairs of examples; the mean over minibatches.
- `rsm_difference` (a distance): the root mean square over pairs of examples of
  the difference of the two layers' Euclidean distances (in the layers' units).

Each is a family of its own (`registry.Family`); what two read alike
(the distance matrices, the k-NN masks) is made once a step (`Minibatch.shared`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import layerpairs
from vitcnn_jax.similarity import linear_cka
from vitcnn_jax.similarity import MIN_BATCH
from vitcnn_jax.similarity import neighbours
from vitcnn_jax.similarity import registry
from vitcnn_jax.similarity.scales import Scale

RSA_METHODS = ("pearson", "spearman")


def valid_count(mask: jax.Array) -> jax.Array:
  return mask.astype(jnp.float32).sum()


def correlation(stack: registry.Stack, mask: jax.Array) -> jax.Array:
  """(L, n, n) Pearson correlations between examples (each row centred on its own mean)."""
  rowcentred = stack.raw(mask) - stack.features[:, None, None] * stack.rowmean[:, :, None] * stack.rowmean[:, None, :]
  return jax.vmap(registry.normalise_rows, (0, None))(rowcentred, mask)


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


def _symmetric_median(x: jax.Array, count: jax.Array) -> jax.Array:
  """The median of the `count` smallest entries of a symmetric (n, n) matrix of
  non-negative float32 (the rest +inf), exactly: the lower middle by a bisection
  on the bits (non-negative floats order as their int32 bits do) that counts the
  diagonal once and the strict upper triangle twice, 31 passes over half the
  entries; the upper middle, where it differs, is the next larger entry. A sort of
  a 256-row minibatch's 65,536 distances per layer cost 10x more on CPU."""
  diag, upper = jnp.diagonal(x), x[np.triu_indices(x.shape[0], 1)]
  diag_bits, upper_bits = (jax.lax.bitcast_convert_type(v, jnp.int32) for v in (diag, upper))
  at_most = lambda t: (diag_bits <= t).sum() + 2 * (upper_bits <= t).sum()
  low_k, high_k = jnp.maximum(count - 1, 0) // 2, count // 2

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    enough = at_most(mid) > low_k
    return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

  lo = jnp.zeros_like(diag_bits[0])  # varying as `x` is, in shard_map
  lo, _ = jax.lax.fori_loop(0, 31, halve, (lo, lo + 0x7F800000))  # [0, +inf]
  low = jax.lax.bitcast_convert_type(lo, jnp.float32)
  above_low = lambda v: jnp.min(jnp.where(v > low, v, jnp.inf))
  next_up = jnp.minimum(above_low(diag), above_low(upper))
  return 0.5 * (low + jnp.where(at_most(lo) > high_k, low, next_up))


def rbf_kernel(gram: jax.Array, mask: jax.Array, sigma: float) -> jax.Array:
  """exp(-d^2 / (2 sigma^2 median d^2)) from a Gram of centred rows, over the
  valid rows (padding zero); a layer with every distance zero gives ones (it is
  constant: its centred kernel is zero)."""
  sq = _squared_distances(gram)
  m = mask.astype(jnp.float32)
  valid = m[:, None] * m[None, :]
  median = _symmetric_median(jnp.where(valid > 0, sq, jnp.inf), valid.sum().astype(jnp.int32))
  scale = 2 * sigma ** 2 * median
  kernel = jnp.exp(-sq / jnp.where(scale > 0, scale, 1.0))
  return jnp.where(scale > 0, kernel, 1.0) * valid


def distances(gram: jax.Array, mask: jax.Array) -> jax.Array:
  """(n, n) Euclidean distances between the valid rows of a Gram of centred rows
  (padding zero)."""
  m = mask.astype(jnp.float32)
  return jnp.sqrt(_squared_distances(gram)) * m[:, None] * m[None, :]


def _cknna_trace(x: neighbours.ByExample, y: neighbours.ByExample, precision: grams.Precision) -> jax.Array:
  """(L, L) tr(A Bᵀ) = <M ∘ Mᵀ ∘ K, M' ∘ M'ᵀ ∘ K'> of every pair."""
  s = lambda side: side.knn * side.back * side.cos
  return neighbours.per_example(s(x), s(y), precision).sum(0)


def cknna_hsic(trace: jax.Array, x: neighbours.ByExample, y: neighbours.ByExample, n: jax.Array,
               precision: grams.Precision) -> jax.Array:
  """(L, L) HSIC_1(M_ab K_a, M_ab K_b) with M_ab = knn_a * knn_b of the row layers
  `x` and the column layers `y`, given their `_cknna_trace`: with P = M ∘ K, 1ᵀ A
  1 = <P_a, M_b> = Σ_k cols_k, 1ᵀ B 1 = Σ_k rows_k and 1ᵀ A B 1 = Σ_k cols_k rows_k,
  where cols_k = P_a[:, k] · M_b[:, k] and rows_k = M_a[k] · P_b[k]."""
  rows = neighbours.per_example(x.knn, y.knn * y.cos, precision)
  cols = neighbours.per_example(x.back * x.cos, y.back, precision)  # the cosines are symmetric
  hs = (trace + cols.sum(0) * rows.sum(0) / jnp.maximum((n - 1) * (n - 2), 1.0)
        - 2 * (cols * rows).sum(0) / jnp.maximum(n - 2, 1.0))
  return jnp.where(n >= MIN_BATCH, hs / jnp.maximum(n * (n - 3), 1.0), 0.0)


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


def _pairs(out: dict, name: str, mats: jax.Array, order: jax.Array | None, precision,
           scale: jax.Array | float = 1.0) -> None:
  """Every pair of layers' flattened (L, n, n) matrices, and the null (see `layerpairs`)."""
  flat = mats.reshape(mats.shape[0], -1)
  out[name] = scale * grams.flat_products(flat, flat, precision)
  if order is not None:
    moved = layerpairs.permuted(mats, order).reshape(flat.shape)
    out[f"null/{name}"] = layerpairs.mirror(scale * grams.flat_products(flat, moved, precision))


RSM_SPAN = 64  # pairs of layers at most 2^RSM_SPAN apart in scale sum (D_a - D_b)² on the device


def _rsm_differences(dist: jax.Array, e: jax.Array, order: jax.Array | None) -> dict[str, jax.Array]:
  """(L, L) sums of (D_a − D_b)² of distance matrices `dist` (rows a) and the same
  with their examples re-indexed by `order` (columns b; None: as they are), both at
  scales 2^-e, term by term, in units of 2^(e_a + e_b)
  (`rsm_diff`): ‖D_a‖² + ‖D_b‖² − 2 <D_a, D_b> cancels for close layers. Each
  layer is brought to 2^((e_a + e_b) / 2) by a power of two (exact), halving the
  sum where e_a + e_b is odd. Pairs more than 2^RSM_SPAN apart in scale, whose
  squares could overflow, give 0 and `rsm_far` 1. The upper triangle, mirrored
  (see `layerpairs`)."""
  delta = e[:, None] - e[None, :]
  near = jnp.abs(delta) <= RSM_SPAN
  delta = jnp.where(near, delta, 0)
  up = (delta + 1) // 2  # a's exponent; b's is up - delta, and their sum 2 up - delta is 0 or 1
  total = layerpairs.symmetric_squared_differences(dist, grams.pow2(up), grams.pow2(up - delta), order)
  total = total * grams.pow2(delta - 2 * up)
  return {"rsm_diff": layerpairs.mirror(jnp.where(near, total, 0.0)),
          "rsm_far": layerpairs.mirror((~near).astype(jnp.float32))}


def _rsm_sums(dist: jax.Array, e: jax.Array, order: jax.Array | None) -> dict[str, jax.Array]:
  """`_rsm_differences` of every pair of layers, and the null's (the column
  layer's examples re-indexed, see `layerpairs`)."""
  out = _rsm_differences(dist, e, None)
  if order is not None:
    null = _rsm_differences(dist, e, order)
    out.update({f"null/{k}": v for k, v in null.items()})
  return out


def _rsm_squares(t: registry.Totals) -> np.ndarray:
  """(L, L) sums of (D_a − D_b)² over every pair of examples: the device's, term by
  term; for a pair whose scales were more than 2^RSM_SPAN apart in some minibatch,
  where one layer's distances dwarf the other's and nothing cancels, ‖D_a‖² + ‖D_b‖²
  − 2 <D_a, D_b> in float64."""
  own = np.diag(t.sums["rsm"])
  expanded = np.maximum(own[:, None] + own[None, :] - 2 * t.of("rsm"), 0.0)
  return np.where(t.of("rsm_far") > 0, expanded, t.of("rsm_diff"))


def _distances(mb: registry.Minibatch) -> jax.Array:
  """(L, n, n) the layers' distance matrices, at their scales 2^-e (the sums made of them declare theirs);
  read through `mb.shared`."""
  return jax.vmap(distances, (0, None))(mb.stack.gram, mb.mask)


def _centred_pairs(mb: registry.Minibatch, name: str, kernels, biased_scale) -> dict:
  """`_pairs` of the layers' (L, n, n) kernels (`kernels(mb)`) centred for
  `spec.estimator`: HSIC_1 if unbiased, else H K H times `biased_scale(n)`."""
  n, out = valid_count(mb.mask), {}
  if mb.spec.estimator == "unbiased":
    centre, scale = grams.center_unbiased, jnp.where(n >= MIN_BATCH, 1 / jnp.maximum(n * (n - 3), 1.0), 0.0)
  else:
    centre, scale = center_biased, biased_scale(n)
  _pairs(out, name, jax.vmap(centre, (0, None))(kernels(mb), mb.mask), mb.order, mb.precision, scale)
  return out


def _linear_sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  """Biased HSIC of the linear kernels (the unbiased is `hsic.linear_sums`, always
  there): the features are centred, so K is H K H already."""
  del chosen
  out = {}
  if mb.spec.estimator != "unbiased":
    n = valid_count(mb.mask)
    _pairs(out, "hsic_biased", mb.stack.gram, mb.order, mb.precision, 1 / jnp.maximum(n - 1, 1.0) ** 2)
  return out


def _linear_value(t: registry.Totals) -> np.ndarray:
  key = "hsic" if t.spec.estimator == "unbiased" else "hsic_biased"
  own = linear_cka.cka_from_hsic(t.sums[key], t.names, t.sums["moments"] / t.num_examples)  # checks the layers
  return own if not t.null else t.normalised(key, "linear_cka")


def _check_estimator(spec: registry.Spec, smallest: int, chosen: tuple[str, ...]) -> None:
  del smallest, chosen
  if spec.estimator not in ("unbiased", "biased"):
    raise ValueError(f"config.estimator={spec.estimator!r} is not 'unbiased' or 'biased'.")


LINEAR_CKA = registry.Family((registry.Measure(
    "linear_cka", "linear CKA",
    "sum over minibatches of HSIC(K, L), normalised by the sums of HSIC(K, K) and HSIC(L, L) "
    "(HSIC_1 of Song et al. unbiased, or HSIC_0 biased)",
    lambda spec: f"estimator {spec.estimator}", _linear_value),), _linear_sums, _check_estimator,
    scales={"hsic_biased": Scale(2, per_pair=True)})


def _rbf_kernels(mb: registry.Minibatch) -> jax.Array:
  return jax.vmap(rbf_kernel, (0, None, None))(mb.stack.gram, mb.mask, mb.spec.rbf_sigma)


def _rbf_sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  del chosen
  return _centred_pairs(mb, "rbf_hsic", _rbf_kernels, lambda n: 1 / jnp.maximum(n - 1, 1.0) ** 2)


def _check_sigma(spec: registry.Spec, smallest: int, chosen: tuple[str, ...]) -> None:
  del smallest, chosen
  if not spec.rbf_sigma > 0:
    raise ValueError(f"config.rbf_sigma={spec.rbf_sigma} must be > 0.")


RBF_CKA = registry.Family((registry.Measure(
    "rbf_cka", "RBF CKA",
    "as linear_cka, on Gaussian kernels whose bandwidth is rbf_sigma times the root of the median "
    "squared distance within each minibatch",
    lambda spec: f"estimator {spec.estimator}, rbf_sigma {spec.rbf_sigma}",
    lambda t: t.normalised("rbf_hsic", "rbf_cka")),), _rbf_sums, _check_sigma)


def _dcov_sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  """dCov² of the distance matrices: biased, the V-statistic's 1/n², not 1/(n-1)²."""
  del chosen
  return _centred_pairs(mb, "dcov", lambda mb: mb.shared(_distances), lambda n: 1 / jnp.maximum(n, 1.0) ** 2)


def _dcor_squared(t: registry.Totals) -> np.ndarray:
  return t.normalised("dcov", "distance_correlation")


DISTANCE_CORRELATION = registry.Family((registry.Measure(
    "distance_correlation", "distance correlation",
    "root of the sum over minibatches of dCov^2 (the U-statistic if unbiased, else the "
    "V-statistic) normalised by the sums of each layer's dVar^2",
    lambda spec: f"estimator {spec.estimator}",
    lambda t: np.sqrt(np.maximum(_dcor_squared(t), 0.0)),
    clip=registry.Clip(
        "layer pairs whose dCor² (the ratio of the dCov² sums; the unbiased U-statistic can be "
        "negative) was negative, reported as dCor 0", lambda t: int(np.sum(_dcor_squared(t) < 0)))),),
    _dcov_sums, scales={"dcov": Scale(1, per_pair=True)})


def _mutual_knn_sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  del chosen
  x, k = mb.shared(neighbours.by_example), mb.spec.knn_k
  shared = lambda y: neighbours.per_example(x.knn, y.knn, mb.precision).sum(0) / k  # neighbours in both
  out = {"knn": shared(x), "knn_count": valid_count(mb.mask)}
  if mb.order is not None:
    out["null/knn"] = layerpairs.mirror(shared(mb.shared(neighbours.moved_by_example)))
  return out


MUTUAL_KNN = registry.Family((registry.Measure(
    "mutual_knn", "mutual k-NN",
    "mean over every example of the share of its k nearest neighbours (within its minibatch, cosine, "
    "itself excluded) that are neighbours in both layers",
    lambda spec: f"k {spec.knn_k}", lambda t: t.of("knn") / t.sums["knn_count"]),),
    _mutual_knn_sums, neighbours.check_k)


def _cknna_sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  del chosen
  n, x = valid_count(mb.mask), mb.shared(neighbours.by_example)
  out = {"cknna_hsic": cknna_hsic(_cknna_trace(x, x, mb.precision), x, x, n, mb.precision)}
  if mb.order is not None:  # one-way: 1ᵀ A B 1 is not symmetric; tr(A Bᵀ) is
    moved = mb.shared(neighbours.moved_by_example)
    trace = _cknna_trace(x, moved, mb.precision)
    out["null/cknna_hsic"] = layerpairs.one_way(cknna_hsic(trace, x, moved, n, mb.precision),
                                                cknna_hsic(trace.T, moved, x, n, mb.precision))
  return out


CKNNA = registry.Family((registry.Measure(
    "cknna", "CKNNA",
    "sum over minibatches of HSIC_1 of the cosine kernels masked to mutual k nearest neighbours, "
    "normalised as CKA",
    lambda spec: f"k {spec.knn_k}", lambda t: t.normalised("cknna_hsic", "cknna")),),
    _cknna_sums, neighbours.check_k)


def _rsa_sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  del chosen
  corr = correlation(mb.stack, mb.mask)
  z, valid = rsa_vectors(corr, mb.mask, mb.spec.rsa_method)
  out = {"rsa": grams.flat_products(z, z, mb.precision),
         "rsa_count": (valid.sum() > 1).astype(jnp.float32)}  # 1 per minibatch with pairs
  if mb.order is not None:
    z_null, _ = rsa_vectors(layerpairs.permuted(corr, mb.order), mb.mask, mb.spec.rsa_method)
    out["null/rsa"] = layerpairs.mirror(grams.flat_products(z, z_null, mb.precision))
  return out


def _check_method(spec: registry.Spec, smallest: int, chosen: tuple[str, ...]) -> None:
  del smallest, chosen
  if spec.rsa_method not in RSA_METHODS:
    raise ValueError(f"config.rsa_method={spec.rsa_method!r} is not one of {RSA_METHODS}.")


RSA = registry.Family((registry.Measure(
    "rsa", "RSA",
    "mean over minibatches of the correlation (Pearson or Spearman) of the two layers' dissimilarities "
    "(1 - correlation of examples) over the minibatch's pairs of examples",
    lambda spec: f"{spec.rsa_method} correlation", lambda t: t.mean("rsa", "rsa_count")),),
    _rsa_sums, _check_method)


def _rsm_difference_sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  del chosen
  n, out = valid_count(mb.mask), {}
  dist = mb.shared(_distances)
  _pairs(out, "rsm", dist, mb.order, mb.precision)
  out.update(_rsm_sums(dist, mb.stack.e, mb.order))
  out["pair_count"] = n * (n - 1)
  return out


RSM_DIFFERENCE = registry.Family((registry.Measure(
    "rsm_difference", "RSM difference",
    "root of the sum over minibatches of the squared differences of the two layers' Euclidean "
    "distances between examples, over the number of pairs",
    lambda spec: "Euclidean",
    lambda t: np.sqrt(_rsm_squares(t) / np.maximum(t.sums["pair_count"], 1.0)), distance=True),),
    _rsm_difference_sums, scales={"rsm": Scale(1, per_pair=True), "rsm_diff": Scale(1, per_pair=True)})
