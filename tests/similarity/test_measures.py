"""Similarity measures beyond linear CKA against float64 NumPy written from each
paper's definition: per minibatch (padding rows masked), and summed over
minibatches of unequal size as the analysis combines them."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
import scipy.stats

from support.library_sums import SIZES, batch_slices, padded_sums, related_layers
from support.numerics import assert_close, cka_bound, likely
from vitcnn_jax.similarity import comparison
from vitcnn_jax.similarity import kernels
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import scales

U32 = 2.0 ** -24


# --- float64 references, from the definitions -------------------------------------

def np_hsic1(k: np.ndarray, l: np.ndarray) -> float:
  """Song et al. (2012) eq. 5, unbiased, for any (even asymmetric) kernels."""
  n = len(k)
  k, l = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
  one = np.ones(n)
  return float((np.trace(k @ l) + (one @ k @ one) * (one @ l @ one) / ((n - 1) * (n - 2))
                - 2 / (n - 2) * one @ k @ l @ one) / (n * (n - 3)))


def np_hsic0(k: np.ndarray, l: np.ndarray) -> float:
  """Gretton et al.'s biased HSIC, tr(K H L H) / (n - 1)^2."""
  h = np.eye(len(k)) - 1 / len(k)
  return float(np.trace(k @ h @ l @ h) / (len(k) - 1) ** 2)


def np_rbf(x: np.ndarray, sigma: float) -> np.ndarray:
  """Kornblith et al. (2019): bandwidth sigma^2 times the median squared distance."""
  g = x @ x.T
  sq = np.diag(g)[:, None] + np.diag(g)[None, :] - 2 * g
  return np.exp(-sq / (2 * sigma ** 2 * np.median(sq)))


def np_cosine(x: np.ndarray) -> np.ndarray:
  xn = x / np.linalg.norm(x, axis=1, keepdims=True)
  return xn @ xn.T


def np_knn(x: np.ndarray, k: int) -> np.ndarray:
  """(n, n) 1 for each example's k most cosine-similar other examples (Huh et al. 2024)."""
  c = np_cosine(x)
  np.fill_diagonal(c, -np.inf)
  out = np.zeros_like(c)
  np.put_along_axis(out, np.argsort(-c, axis=1)[:, :k], 1.0, axis=1)
  return out


def np_mutual_knn(x, y, k) -> float:
  return float((np_knn(x, k) * np_knn(y, k)).sum(axis=1).mean() / k)


def np_cknna_hsic(x, y, k) -> float:
  """HSIC_1 of cosine kernels masked to neighbours in both (Huh et al. 2024, CKNNA)."""
  mask = np_knn(x, k) * np_knn(y, k)
  return np_hsic1(mask * np_cosine(x), mask * np_cosine(y))


def np_rsa(x, y, method: str) -> float:
  """Correlation of the dissimilarity matrices 1 - corr(examples), upper triangles."""
  i, j = np.triu_indices(len(x), 1)
  u, v = 1 - np.corrcoef(x)[i, j], 1 - np.corrcoef(y)[i, j]
  if method == "spearman":
    return float(scipy.stats.spearmanr(u, v).statistic)
  return float(np.corrcoef(u, v)[0, 1])


# --- the library on minibatches --------------------------------------------------------


def _normalised(s: np.ndarray) -> np.ndarray:
  d = np.diag(s)
  return s / np.sqrt(np.outer(d, d))


def test_biased_linear_and_rbf_cka_equal_their_definitions(gram_path):
  acts = related_layers()
  for estimator, ref in (("biased", np_hsic0), ("unbiased", np_hsic1)):
    spec = measures.Spec(("linear_cka", "rbf_cka"), estimator=estimator, rbf_sigma=0.8)
    got = padded_sums(acts, SIZES, spec)
    lin = np.zeros((3, 3))
    rbf = np.zeros((3, 3))
    spread = 0.0
    for rows in batch_slices(44, SIZES):
      xs = [a[rows] - a[rows].mean(0) for a in acts]
      k_rbf = [np_rbf(x, 0.8) for x in xs]
      lin += [[ref(a @ a.T, b @ b.T) for b in xs] for a in xs]
      rbf += [[ref(a, b) for b in k_rbf] for a in k_rbf]
      for x in xs:  # the largest squared distance over the median: how far rounding moves a kernel entry
        g = x @ x.T
        sq = np.diag(g)[:, None] + np.diag(g)[None, :] - 2 * g
        spread = max(spread, sq.max() / np.median(sq))
    linear = _normalised(got["hsic_biased"]) if estimator == "biased" else _normalised(got["hsic"])
    assert_close(linear, _normalised(lin), cka_bound(16, 24), f"linear CKA, {estimator}")
    # An RBF entry moves by its exponent's error: the distances' relative error times
    # their ratio to the median; each HSIC then as linear CKA's.
    bound = cka_bound(16, 16) + 4 * spread * likely(16, 24)
    assert_close(_normalised(got["rbf_hsic"]), _normalised(rbf), bound, f"RBF CKA, {estimator}")


def test_the_rbf_bandwidths_median_is_exact_with_padding_and_ties():
  """The median of a minibatch's squared distances, the RBF bandwidth's scale, is
  an order statistic: the float32 entries' own median exactly (each entry, the
  diagonal's zeros, the middle pair of an even count, repeated values), padding
  rows left out."""
  rng = np.random.default_rng(3)
  median = jax.jit(kernels._symmetric_median)
  for n, valid, integer in ((7, 7, False), (8, 8, False), (8, 5, False), (9, 6, True), (16, 16, True),
                            (6, 2, True), (5, 1, False)):
    a = rng.standard_normal((n, 3))
    a = np.round(a) if integer else a  # integer rows: many equal distances
    g = a @ a.T
    sq = np.maximum(np.diag(g)[:, None] + np.diag(g)[None, :] - 2 * g, 0).astype(np.float32)
    x = np.full((n, n), np.inf, np.float32)
    x[:valid, :valid] = sq[:valid, :valid]
    middle = np.sort(sq[:valid, :valid].ravel())[[(valid ** 2 - 1) // 2, valid ** 2 // 2]]
    assert float(median(x, np.int32(valid ** 2))) == np.float32(0.5) * (middle[0] + middle[1]), (n, valid)


def _knn_gap(acts, sizes, k: int) -> float:
  """The smallest float64 gap between an example's k-th and (k+1)-th most similar
  neighbours: rounding below it cannot change a neighbour set."""
  gap = np.inf
  for rows in batch_slices(len(acts[0]), sizes):
    for a in acts:
      c = np_cosine(a[rows])
      np.fill_diagonal(c, -np.inf)
      top = -np.sort(-c, axis=1)
      gap = min(gap, float((top[:, k - 1] - top[:, k]).min()))
  return gap


def _cosine_error(acts, sizes) -> float:
  """Bound on a float32 cosine's error: the raw Gram is the centred one (n + D sums)
  plus the rows' projections on the mean and its norm, each off by likely(n, D) of
  (|c_i| + |mean|)(|c_j| + |mean|), divided by |x_i| |x_j|."""
  worst_ratio = 0.0
  for rows in batch_slices(len(acts[0]), sizes):
    for a in acts:
      x = a[rows]
      mean = x.mean(0)
      ratio = (np.linalg.norm(x - mean, axis=1) + np.linalg.norm(mean)) / np.linalg.norm(x, axis=1)
      worst_ratio = max(worst_ratio, float(ratio.max()))
  return 3 * likely(16, 24) * worst_ratio ** 2


def test_mutual_knn_and_cknna_equal_their_definitions():
  acts, k = related_layers(1), 4
  # Neighbour sets agree where every gap between the k-th and (k+1)-th neighbour is
  # above the two cosines' rounding.
  assert _knn_gap(acts, SIZES, k) > 2 * _cosine_error(acts, SIZES)
  got = padded_sums(acts, SIZES, measures.Spec(("mutual_knn", "cknna"), knn_k=k))
  knn = np.zeros((3, 3))
  ck = np.zeros((3, 3))
  for rows in batch_slices(44, SIZES):
    xs = [a[rows] for a in acts]
    knn += [[np_mutual_knn(a, b, k) * len(a) for b in xs] for a in xs]
    ck += [[np_cknna_hsic(a, b, k) for b in xs] for a in xs]
  assert got["knn_count"] == 44
  assert_close(got["knn"] / got["knn_count"], knn / 44, 1e-12, "mutual k-NN")  # counts of neighbours
  assert np.allclose(np.diag(got["knn"] / got["knn_count"]), 1.0)
  assert_close(_normalised(got["cknna_hsic"]), _normalised(ck), cka_bound(16, 24), "CKNNA")


@pytest.mark.parametrize("method", kernels.RSA_METHODS)
def test_rsa_equals_the_correlation_of_dissimilarity_matrices(method, gram_path):
  acts = related_layers(2)
  got = padded_sums(acts, SIZES, measures.Spec(("rsa",), rsa_method=method))
  ref = np.zeros((3, 3))
  for rows in batch_slices(44, SIZES):
    ref += [[np_rsa(a[rows], b[rows], method) for b in acts] for a in acts]
  assert got["rsa_count"] == 3
  pairs = 16 * 15 // 2
  # Correlations of examples from the float32 Gram (n, D sums and the row-mean
  # correction), then a Pearson correlation over the pairs.
  rounding = 4 * likely(16, 24)
  bound = rounding + 2 * likely(pairs, pairs)
  if method == "spearman":
    # Ranks can swap only between dissimilarities closer than twice their rounding;
    # each swap of adjacent ranks moves a Spearman correlation of N pairs by at
    # most 12 / (N (N + 1)).
    swaps, fewest = 0, pairs
    for rows in batch_slices(44, SIZES):
      i, j = np.triu_indices(rows.stop - rows.start, 1)
      fewest = min(fewest, len(i))
      swaps = max(swaps, max(int((np.diff(np.sort(1 - np.corrcoef(a[rows])[i, j])) < 2 * rounding).sum())
                             for a in acts))
    bound += 12 * 2 * swaps / (fewest * (fewest + 1))
  assert_close(got["rsa"] / got["rsa_count"], ref / 3, bound, f"RSA ({method})")


def test_the_null_is_the_measure_with_one_layer_permuted():
  """With a fixed key, the null equals the measure computed on explicitly permuted
  rows of the column layer above the diagonal and of the row layer below it (valid
  rows only; padding stays in place)."""
  acts = related_layers(3, n=16)
  spec = measures.Spec(("linear_cka", "rbf_cka", "mutual_knn", "cknna", "rsa"), knn_k=3, null=True)
  key = jax.random.PRNGKey(7)
  mask = np.r_[np.ones(12), np.zeros(4)].astype(np.float32)
  order = np.asarray(measures.permutation(key, mask))
  assert sorted(order[:12]) == list(range(12)) and list(order[12:]) == [12, 13, 14, 15]
  padded = [np.concatenate([a[:12], np.full((4, a.shape[1]), 5.0)]).astype(np.float32) for a in acts]
  got = scales.unscale(jax.device_get(jax.jit(functools.partial(measures.minibatch_sums, spec=spec))(
      padded, mask, key=key)), measures.SCALES)
  plain = functools.partial(measures.minibatch_sums, spec=measures.Spec(spec.names, knn_k=3))
  for b in range(3):
    moved = [padded[0], padded[b][order]]
    ref = scales.unscale(jax.device_get(jax.jit(plain)(moved, mask)), measures.SCALES)
    for key_ in ("hsic", "rbf_hsic", "knn", "cknna_hsic", "rsa"):
      scale = max(float(np.abs(ref[key_]).max()), 1e-30)
      assert_close(got[f"null/{key_}"][0, b], ref[key_][0, 1], 4 * cka_bound(12, 24) * scale,
                   f"null {key_} 0-{b}")
      if b:  # below the diagonal: the row layer's examples re-indexed (see layerpairs)
        assert_close(got[f"null/{key_}"][b, 0], ref[key_][1, 0], 4 * cka_bound(12, 24) * scale,
                     f"null {key_} {b}-0")


def test_grouped_minibatches_refuse_other_measures():
  with pytest.raises(ValueError, match=r"need each minibatch on one device"):
    measures.minibatch_sums([np.zeros((4, 3), np.float32)], np.ones(4, np.float32),
                            measures.Spec(("rbf_cka",)), group="group")


def test_murphy_independent_features_unbiased_near_zero_biased_not():
  """Murphy et al. (2024): on independent Gaussian features, many more than the
  examples, biased CKA is large while the unbiased estimator stays near 0."""
  rng = np.random.default_rng(4)
  for n in (32, 64, 128, 256):
    d = 8 * n
    x, y = rng.standard_normal((n, d)).astype(np.float32), rng.standard_normal((n, d)).astype(np.float32)
    got = scales.unscale(jax.device_get(jax.jit(functools.partial(
        measures.minibatch_sums, spec=measures.Spec(("linear_cka",), estimator="biased")))(
            [x, y], np.ones(n, np.float32))), measures.SCALES)
    unbiased, biased = _normalised(got["hsic"])[0, 1], _normalised(got["hsic_biased"])[0, 1]
    # The unbiased estimate of an independent pair: mean 0, spread about sqrt(2) / n
    # for isotropic features; the biased one: about sqrt(d / (n + d)) ... well above.
    assert abs(unbiased) < 6 * np.sqrt(2) / n, (n, unbiased)
    assert biased > 0.5 * np.sqrt(n / (n + d)) + 6 * np.sqrt(2) / n, (n, biased)


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_the_null_flags_every_cell_of_independent_features(estimator):
  """Murphy et al.'s case through the analysis's comparison with the null: over
  repeats, independent features cannot be told from their permuted selves, for
  either estimator (biased CKA is high here, but so is its null)."""
  rng = np.random.default_rng(5)
  spec = measures.Spec(("linear_cka",), estimator=estimator, null=True)
  fn = jax.jit(functools.partial(measures.minibatch_sums, spec=spec))
  for n in (32, 64, 128, 256):
    reps, nulls = [], []
    for r in range(5):
      total = {}
      for b in range(2):
        x, y = (rng.standard_normal((n, 4 * n)).astype(np.float32) for _ in range(2))
        got = scales.unscale(jax.device_get(fn([x, y], np.ones(n, np.float32),
                                             key=jax.random.PRNGKey(10 * r + b))), measures.SCALES)
        total = {k: total.get(k, 0.0) + np.asarray(v, np.float64) for k, v in got.items()}
      reps.append(measures.values(total, ["x", "y"], spec, 2 * n)["linear_cka"])
      nulls.append(measures.values(total, ["x", "y"], spec, 2 * n, null=True)["linear_cka"])
    arrays = {}
    out = comparison.against_null(arrays, "cka", np.asarray(reps), np.asarray(nulls),
                                  [("x_y", None, None, slice(0, 1), slice(1, 2))])
    assert out["like_null"]["x_y"] == 1, (n, estimator, np.asarray(reps)[:, 0, 1], np.asarray(nulls)[:, 0, 1])
    if estimator == "biased":
      assert np.asarray(reps)[:, 0, 1].mean() > 0.3  # high, yet no more than the null


@pytest.mark.parametrize("repeats", [2, 3, 5, 30])
def test_the_t_interval_is_scipy_stats_student_t(repeats):
  """Half the 95% interval of the mean over repeats, per cell, equals the one from
  scipy.stats' Student t quantile (the quantile's tails are where a wrong degree of
  freedom shows: 12.7 at two repeats against 4.30 at three)."""
  x = np.random.default_rng(repeats).standard_normal((repeats, 3, 4))
  want = scipy.stats.t.ppf(0.975, repeats - 1) * x.std(axis=0, ddof=1) / np.sqrt(repeats)
  np.testing.assert_allclose(comparison.t_half_width(x), want, rtol=1e-12)


def test_the_streaming_bootstrap_weights_each_minibatch_by_its_own_draws():
  from vitcnn_jax.run import runstate
  boot = runstate.Bootstrap(seed=3, replicates=5, pooled={})
  w = boot.weights(0, 1, 4, 3)
  assert w.shape == (5, 3) and np.array_equal(w, boot.weights(0, 1, 4, 3))  # seeded per minibatch
  assert np.array_equal(w[:, 1:], boot.weights(0, 1, 5, 2))  # the same minibatch, the same draws
  v = np.arange(6.0).reshape(3, 2)  # three minibatches' sums of a 2-vector
  sums = boot.add({}, {"boot/x": v, "y": np.ones(1)}, 0, 1, 4)
  np.testing.assert_array_equal(sums["x"], v.sum(0))
  np.testing.assert_array_equal(sums["y"], np.ones(1))
  np.testing.assert_allclose(boot.pooled[0]["x"], w @ v)
  boot.add(sums, {"boot/x": v[:1]}, 0, 2, 0)  # a second repeat adds to the same replicates
  np.testing.assert_allclose(boot.pooled[0]["x"], w @ v + boot.weights(0, 2, 0, 1) @ v[:1])


@pytest.mark.parametrize("method", kernels.RSA_METHODS)
def test_rsa_equals_rsatoolbox(method):
  """The same minibatches through rsatoolbox (correlation-distance RDMs, compared by
  Pearson or Spearman correlation), the maintained package of RSA."""
  from conftest import require
  rsa = require("rsatoolbox")
  acts = related_layers(6)
  got = padded_sums(acts, SIZES, measures.Spec(("rsa",), rsa_method=method))
  ref = np.zeros((3, 3))
  for rows in batch_slices(44, SIZES):
    rdms = [rsa.rdm.calc_rdm(rsa.data.Dataset(a[rows]), method="correlation") for a in acts]
    ref += [[float(rsa.rdm.compare(a, b, method="corr" if method == "pearson" else "spearman")[0, 0])
             for b in rdms] for a in rdms]
  pairs = 16 * 15 // 2
  rounding = 4 * likely(16, 24)
  bound = rounding + 2 * likely(pairs, pairs)
  if method == "spearman":  # as test_rsa_equals_the_correlation_of_dissimilarity_matrices
    swaps = max(int((np.diff(np.sort(1 - np.corrcoef(a[rows])[np.triu_indices(rows.stop - rows.start, 1)]))
                     < 2 * rounding).sum()) for rows in batch_slices(44, SIZES) for a in acts)
    bound += 12 * 2 * swaps / (66 * 67)
  assert_close(got["rsa"] / got["rsa_count"], ref / 3, bound, f"RSA vs rsatoolbox ({method})")
