"""The RSM difference, GULP and Procrustes summed without the cancelling expansion
‖a‖² + ‖b‖² − 2 <a, b>: a layer against itself (and against a copy of itself)
gives 0, and close layers (y = x + 1e-3 noise; examples repeated in the
minibatch) agree with float64 from the definitions (`reference_measures.py`,
`test_subspaces.np_gulp_squared`), in the null too; and the counts of the clips of
distance correlation and of the magnitude difference.

Every bound is derived from float32's unit roundoff u = 2^-24 and the problem's
size (`numerics`), for rows of similar norms about a mean near zero, as here:
- a Gram entry of the centred rows, G_ij, is off by at most GRAM √(G_ii G_jj): its
  dot over d features and the centring over n rows (`likely`), doubled as in
  test_more_measures; so the Gram scaled to trace 1, K, by GRAM in Frobenius norm
  (Σ_ij √(K_ii K_jj)² = (tr K)² = 1);
- an eigendecomposition or SVD of n rows adds a backward error of SVD = 8 worst(n)
  of the matrix's norm (the 8 as test_subspaces allows an eigh);
- a float32 sum of m nonnegative terms is off by likely(m) of itself.
The expansion loses likely(n²) of ‖a‖² + ‖b‖² instead, which under the root is
~√(n u) of the layers' scale: ~1e-3 here, what these tests catch.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from support import reference_measures as ref
from support.numerics import U32, assert_close, likely, worst
from support.reference_measures import np_gulp_squared
from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import kernels
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import scales

N = 32
CLOSE = 1e-3  # y = x + CLOSE * noise
SVD = lambda n: 8 * worst(n)


def gram_error(n: int, d: int) -> float:
  """GRAM: a centred Gram entry's relative error (module docstring)."""
  return 2 * (likely(d, n) + worst(n))


def _values(acts, spec: measures.Spec, key: int = 0, null: bool = False) -> dict:
  """`measures.values` of one minibatch of every row of `acts` (float32)."""
  n = len(acts[0])
  fn = jax.jit(functools.partial(measures.minibatch_sums, spec=spec))
  sums = scales.unscale(jax.device_get(fn([np.asarray(a, np.float32) for a in acts], np.ones(n, np.float32),
                                        key=jax.random.PRNGKey(key))), measures.SCALES)
  return measures.values(sums, [str(i) for i in range(len(acts))], spec, n, null=null)


def _close(seed: int, d: int, repeated: int = 0, n: int = N) -> tuple[np.ndarray, np.ndarray]:
  """(x, x + CLOSE noise) of n examples (float32 numbers), the last `repeated` rows
  repeating the first."""
  g = np.random.default_rng(seed)
  x = g.standard_normal((n, d))
  y = x + CLOSE * g.standard_normal((n, d))
  if repeated:
    x[-repeated:], y[-repeated:] = x[:repeated], y[:repeated]
  return x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)


def _assert_zero_on_itself(got: np.ndarray, bound: float, what: str) -> None:
  """Every layer against itself (the diagonal) and layer 0 against its copy, layer 1."""
  for i, j in [(i, i) for i in range(len(got))] + [(0, 1), (1, 0)]:
    assert_close(got[i, j], 0.0, bound, f"{what} {i}-{j}")


# --- the RSM difference ---------------------------------------------------------------


def distance_errors(x: np.ndarray) -> np.ndarray:
  """(n, n) bounds on the error of each distance the step computes from x's Gram:
  S_ij = G_ii + G_jj − 2 G_ij is off by δS <= 4 GRAM max G_kk, so D_ij = √S_ij by
  min(√δS, δS / D_ij), and the root's rounding u D_ij; 0 between identical rows,
  whose three Gram entries are the same dot product of the same numbers (S is 0
  exactly: `test_rsm_difference_...` checks it)."""
  xc = x - x.mean(0)
  g = xc @ xc.T
  dist = np.sqrt(np.maximum(np.diag(g)[:, None] + np.diag(g)[None, :] - 2 * g, 0.0))
  ds = 4 * gram_error(*x.shape) * g.diagonal().max()
  err = np.minimum(np.sqrt(ds), ds / np.maximum(dist, 1e-300)) + U32 * dist
  return np.where((x[:, None] == x[None, :]).all(-1), 0.0, err)


def rsm_bound(x: np.ndarray, y: np.ndarray, want: float) -> float:
  """|got − want|: by the triangle inequality at most the RMS over pairs of both
  layers' distance errors, plus the float32 sum of the n² squared differences."""
  off = ~np.eye(len(x), dtype=bool)
  return float(np.sqrt(np.mean((distance_errors(x) + distance_errors(y))[off] ** 2))
               + likely(len(x) ** 2) * want)


def test_rsm_difference_is_zero_on_itself_and_exact_for_close_layers_and_repeated_examples():
  x, y = _close(0, 24)
  xr, yr = _close(1, 24, repeated=4)
  spec = measures.Spec(("rsm_difference",))
  got = _values([x, x, y, xr, yr], spec)["rsm_difference"]
  _assert_zero_on_itself(got, 0.0, "rsm_difference")  # the same distances, subtracted
  lay = jax.jit(grams.scaled_layer)(xr.astype(np.float32), np.ones(N, np.float32))
  assert np.all(np.asarray(kernels.distances(lay.gram, np.ones(N)))[np.arange(4), N - 4 + np.arange(4)] == 0)
  for (i, j), (a, b) in {(0, 2): (x, y), (3, 4): (xr, yr), (2, 0): (y, x)}.items():
    want = ref.rsm_difference([a], [b])
    assert_close(got[i, j], want, rsm_bound(a, b, want), f"rsm_difference {i}-{j}")


def test_rsm_difference_of_layers_powers_of_two_apart_in_scale():
  """x and 2^k x have bit-identical distances at scales 2^k apart: the difference is
  (2^k − 1) RMS(D_x) for k odd, even and beyond `RSM_SPAN` (there from ‖D_a‖² +
  ‖D_b‖² − 2 <D_a, D_b> on the host, where 2^-70 of the terms cannot cancel), so
  each cell over its factor is the same up to the n² sums' rounding (and one more
  for the difference of two powers of two times a distance)."""
  x, _ = _close(2, 24)
  got = _values([x, 2 * x, 8 * x, 2.0 ** 70 * x], measures.Spec(("rsm_difference",)))["rsm_difference"]
  rms = {(0, 1): 1, (0, 2): 7, (0, 3): 2.0 ** 70 - 1, (1, 2): 6, (1, 3): 2.0 ** 70 - 2, (2, 3): 2.0 ** 70 - 8}
  first = got[0, 1]
  for (i, j), factor in rms.items():
    assert_close(got[i, j] / factor, first, (2 * likely(N * N) + U32) * first, f"rsm_difference {i}-{j} / {factor}")
    assert got[j, i] == got[i, j]
  want = ref.rsm_difference([x], [2 * x])
  assert_close(first, want, rsm_bound(x, 2 * x, want), "rsm_difference 0-1")


# --- GULP -----------------------------------------------------------------------------------


def spectrum(x: np.ndarray) -> np.ndarray:
  """The nonzero eigenvalues of x's centred Gram scaled to trace 1 (float64)."""
  xc = x - x.mean(0)
  s = np.linalg.eigvalsh(xc @ xc.T / np.sum(xc ** 2))
  return s[s > 1e-12]


def hat_error(x: np.ndarray, lam: float) -> float:
  """‖δR‖_F of the step's ridge hat matrix R = K (K + λI)⁻¹ = I − λ (K + λI)⁻¹: K off
  by GRAM + SVD(n) in Frobenius norm (module docstring) moves it by λ (K + λI)⁻¹ δK
  (K + λI)⁻¹, at most ‖δK‖_F / λ; U diag(h) Uᵀ from U orthogonal within SVD(n) adds
  √n SVD(n), and its float32 sums over n terms likely(n) Σ h."""
  n, d = x.shape
  s = spectrum(x)
  return ((gram_error(n, d) + SVD(n)) / lam + np.sqrt(n) * SVD(n) + likely(n) * np.sum(s / (s + lam)))


def gulp_bound(x: np.ndarray, y: np.ndarray, lam: float, want: float) -> float:
  """|got − want| <= ‖δR_x‖_F + ‖δR_y‖_F, plus the float32 sum of the n² squares."""
  return hat_error(x, lam) + hat_error(y, lam) + likely(len(x) ** 2) * want


def test_gulp_is_zero_on_itself_and_exact_for_close_layers():
  """Layers of several widths against themselves at the default penalty (the
  expansion gave ~1e-3 or, rounded below 0, 0); close layers at λ = 0.1 in
  minibatches of 16, where the first-order bound ‖δK‖_F / λ stays below their
  distance (at 0.01 it is ~1e-2, above it)."""
  x, y = _close(3, 64)
  widths = np.random.default_rng(5).standard_normal((N, 200))
  got = _values([x, x, y] + [widths[:, :w] for w in (8, 30, 100, 200)], measures.Spec(("gulp",)))["gulp"]
  _assert_zero_on_itself(got, 0.0, "gulp")  # the same hat matrices, subtracted
  x, y = _close(3, 64, n=16)
  got = _values([x, y], measures.Spec(("gulp",), gulp_lambda=0.1))["gulp"]
  want = np.sqrt(np_gulp_squared(x, y, 0.1))
  assert_close(got[0, 1], want, gulp_bound(x, y, 0.1, want), "gulp 0-1")
  assert got[1, 0] == got[0, 1]


# --- Procrustes -------------------------------------------------------------------------------


def residual_error(x: np.ndarray) -> float:
  """The error of ‖a Q − b‖_F as computed, a = U √s (unit norm) and Q = W Vᵀ from the
  SVD of M = aᵀb, for b = a: the rotation Q moves off I by Ω_kl ~ (δM_kl − δM_lk) /
  (s_k + s_l), from M's float32 sums (likely(n) √(s_k s_l) each: ‖aΩ‖_F <= √n
  likely(n)) and the SVD's backward error (SVD(n) s_max: ‖aΩ‖_F <= SVD(n) s_max
  √(n Σ 1/s)); W Vᵀ and a Q each round by likely(n) √n (‖|a|‖_F = 1, ‖|Q|‖₂ <= √n)."""
  n = len(x)
  s = spectrum(x)
  return 3 * np.sqrt(n) * likely(n) + SVD(n) * s.max() * np.sqrt(n * np.sum(1 / s))


def procrustes_bound(x: np.ndarray, y: np.ndarray, want: float) -> float:
  """The Procrustes distance is the Bures metric of the Grams (trace 1), so the
  computed one is off by at most d(K_x, K̂_x) + d(K_y, K̂_y) <= Σ ‖δK‖_F / √s_min (the
  square root's derivative 1 / (√s_k + √s_l) on the range, doubled for the range's
  rotation), ‖δK‖_F <= GRAM + SVD(n); plus the residual's own error (above) and the
  float32 sum of its n² squares."""
  n = len(x)
  moved = sum((gram_error(n, a.shape[1]) + SVD(n)) / np.sqrt(spectrum(a).min()) for a in (x, y))
  return moved + residual_error(x) + residual_error(y) + likely(n * n) * want


def test_procrustes_is_zero_on_itself_and_exact_for_close_layers():
  """Minibatches of 16 examples of 512 features: the bounds grow with n and with
  a layer's smallest eigenvalue's inverse (see `residual_error`)."""
  x, y = _close(4, 512, n=16)
  got = _values([x, x, y], measures.Spec(("procrustes",)))["procrustes"]
  for i, a in enumerate((x, x, y)):
    assert_close(got[i, i], 0.0, residual_error(a), f"procrustes {i}-{i}")
  assert_close(got[0, 1], 0.0, residual_error(x), "procrustes 0-1")
  want = ref.procrustes([x], [y])
  assert_close(got[0, 2], want, procrustes_bound(x, y, want), "procrustes 0-2")
  assert got[2, 0] == got[0, 2]


# --- the null ---------------------------------------------------------------------------------


def test_the_null_of_a_layer_and_a_permuted_close_one_is_exact():
  """y is x + noise with its examples in the inverse of the null's order, so the
  null (y's examples put in that order, above the diagonal) compares close layers:
  within each measure's bound of float64 at the true pair, and symmetric."""
  spec = measures.Spec(("rsm_difference", "gulp", "procrustes"), gulp_lambda=0.1, null=True)
  x, z = _close(6, 64, n=16)
  order = np.asarray(measures.permutation(jax.random.PRNGKey(0), np.ones(16, np.float32)))
  y = z[np.argsort(order)]
  got = _values([x, y], spec, null=True)
  bounds = {"rsm_difference": lambda w: rsm_bound(x, z, w), "gulp": lambda w: gulp_bound(x, z, 0.1, w),
            "procrustes": lambda w: procrustes_bound(x, z, w)}
  wants = {"rsm_difference": ref.rsm_difference([x], [z]), "gulp": np.sqrt(np_gulp_squared(x, z, 0.1)),
           "procrustes": ref.procrustes([x], [z])}
  for m, want in wants.items():
    assert_close(got[m][0, 1], want, bounds[m](want), f"null {m} 0-1")
    assert got[m][1, 0] == got[m][0, 1], m


# --- the clips' counts ------------------------------------------------------------------------


def test_distance_correlation_counts_its_negative_cells_as_float64_does():
  """Tiny independent layers (8 examples): the unbiased dCov² of many pairs is
  negative, and dCor reports 0 there; the count of such cells (and of the null's)
  is float64's. Each cell's float64 ratio is farther from 0 than its float32 error
  (test_more_measures' dCor² bound: three inner products of distance matrices)."""
  g = np.random.default_rng(10)
  n, widths = 8, (3, 5, 2, 4, 6, 3)
  acts = [g.standard_normal((n, w)).astype(np.float32).astype(np.float64) for w in widths]
  spec = measures.Spec(("distance_correlation",), null=True)
  order = np.asarray(measures.permutation(jax.random.PRNGKey(0), np.ones(n, np.float32)))
  dist = [ref._distances(a) for a in acts]
  term = lambda a, b: ref._dcov_term(a, b, "unbiased")
  counts = {}
  for null in (False, True):
    moved = [d[order][:, order] for d in dist] if null else dist
    ratio = np.array([[term(dist[i], moved[j]) / np.sqrt(term(dist[i], dist[i]) * term(dist[j], dist[j]))
                       for j in range(len(acts))] for i in range(len(acts))])
    ratio = np.triu(ratio) + np.triu(ratio, 1).T  # the null: each unordered pair once (layerpairs)
    sizes = [distance_errors(a).max() / ref._distances(a)[~np.eye(n, dtype=bool)].min() for a in acts]
    assert np.abs(ratio).min() > 3 * (2 * max(sizes) + likely(n * n)), np.abs(ratio).min()
    counts[null] = got = _values(acts, spec, null=null)
    want = int(np.sum(ratio < 0))
    assert want > 0 and got["clipped/distance_correlation"] == want, (null, want, got["clipped/distance_correlation"])
    assert np.all(got["distance_correlation"][ratio < 0] == 0)
  entry = measures.clip_counts("distance_correlation", [counts[False]], [counts[True]])
  assert entry["per_repeat"] == [counts[False]["clipped/distance_correlation"]]
  assert entry["null_per_repeat"] == [counts[True]["clipped/distance_correlation"]] and "negative" in entry["what"]


def test_magnitude_difference_counts_its_negative_squared_norms_as_float64_does():
  """Layers about a mean of zero, 6 examples: Σ_{i≠j} <x_i, x_j> is negative for some,
  whose norm of the mean is clipped to 0; the count is float64's, each sum farther
  from 0 than its float32 error (n² Gram entries, each off by GRAM of the largest
  squared norm)."""
  g = np.random.default_rng(8)
  n = 6
  acts = [g.standard_normal((n, w)).astype(np.float32).astype(np.float64) for w in (4, 7, 3, 9, 5, 6, 2, 8)]
  pairs = [np.sum(a @ a.T) - np.trace(a @ a.T) for a in acts]
  for a, p in zip(acts, pairs):
    assert abs(p) > n * n * gram_error(n, a.shape[1]) * np.max(np.sum(a ** 2, 1)), p
  got = _values(acts, measures.Spec(("magnitude_difference",)))
  want = int(np.sum(np.array(pairs) < 0))
  assert 0 < want < len(acts) and got["clipped/magnitude_difference"] == want
  assert measures.clip_counts("magnitude_difference", [got])["per_repeat"] == [want]
