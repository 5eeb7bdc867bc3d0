"""Checks of the float64 references in tests/support/reference_measures.py themselves:
analytic cases, identities that hold by construction, and the `dcor` package.

Tolerances are 100 * (problem size) * float64 epsilon; constructions whose
answers need whitening keep their covariances' condition numbers <= 1e4, which
that bound covers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import require
from support import reference_measures as ref

EPS = np.finfo(np.float64).eps


def tol(*sizes: int) -> float:
  return 100 * math.prod(sizes) * EPS


def rng(seed: int) -> np.random.Generator:
  return np.random.default_rng(seed)


def orthogonal(g: np.random.Generator, d: int) -> np.ndarray:
  q, r = np.linalg.qr(g.standard_normal((d, d)))
  return q * np.sign(np.diag(r))


def centred_orthonormal(g: np.random.Generator, n: int, m: int) -> np.ndarray:
  """n x m, orthonormal columns that each sum to 0 (QR of centred columns)."""
  a = g.standard_normal((n, m))
  q, _ = np.linalg.qr(a - a.mean(0))
  return q


def plane(g: np.random.Generator, d: int) -> np.ndarray:
  """d x 2 with orthonormal columns: a random plane through the origin of R^d."""
  q, _ = np.linalg.qr(g.standard_normal((d, 2)))
  return q


def mixing(g: np.random.Generator, d: int) -> np.ndarray:
  """An invertible d x d map with singular values in [1, 2]: condition number 2."""
  return orthogonal(g, d) @ np.diag(np.linspace(1, 2, d)) @ orthogonal(g, d)


def mean_cca(x: np.ndarray, y: np.ndarray) -> float:
  """Mean canonical correlation by another route than the reference's whitening:
  cosines of the principal angles between the centred column spaces (QR, then SVD)."""
  qx, _ = np.linalg.qr(x - x.mean(0))
  qy, _ = np.linalg.qr(y - y.mean(0))
  return float(np.mean(np.linalg.svd(qx.T @ qy, compute_uv=False)))


def related(g: np.random.Generator, sizes: list[int], dx: int, dy: int) -> tuple[list, list]:
  """Minibatches of generic, partly dependent layers."""
  xs = [g.standard_normal((n, dx)) for n in sizes]
  mix = g.standard_normal((dx, dy))
  ys = [x @ mix + 0.8 * g.standard_normal((len(x), dy)) for x in xs]
  return xs, ys


# --- Procrustes ------------------------------------------------------------------


def test_procrustes_equals_nuclear_norm_formula():
  xs, ys = related(rng(0), [20, 33], 5, 3)  # unequal widths: zero padding
  expected = []
  for x, y in zip(xs, ys):
    xn, yn = x - x.mean(0), y - y.mean(0)
    xn, yn = xn / np.linalg.norm(xn), yn / np.linalg.norm(yn)
    expected.append(2 - 2 * np.linalg.norm(xn.T @ yn, "nuc"))
  got = ref.procrustes(xs, ys)
  assert 0.1 < got < math.sqrt(2)
  assert abs(got ** 2 - np.mean(expected)) <= tol(33, 5)


def test_procrustes_zero_for_scaled_rotated_translated_copy():
  g = rng(1)
  xs = [g.standard_normal((n, 6)) for n in (24, 31)]
  q, shift = orthogonal(g, 6), g.standard_normal(6)
  ys = [3.7 * x @ q + shift for x in xs]
  assert ref.procrustes(xs, ys) <= tol(31, 6)
  # and not zero for a different layer
  assert ref.procrustes(xs, [g.standard_normal(y.shape) for y in ys]) > 0.5


def test_procrustes_invariant_to_feature_permutation():
  g = rng(2)
  xs, ys = related(g, [25, 18], 6, 4)
  px, py = g.permutation(6), g.permutation(4)
  got = ref.procrustes([x[:, px] for x in xs], [y[:, py] for y in ys])
  assert abs(got - ref.procrustes(xs, ys)) <= tol(25, 6)


# --- distance correlation --------------------------------------------------------


@pytest.fixture(scope="module")
def dcor():
  return require("dcor")


def test_distance_correlation_biased_matches_dcor(dcor):
  (x,), (y,) = related(rng(3), [30], 4, 3)
  want = float(dcor.distance_correlation(x, y, method="naive"))
  assert 0.3 < want < 1
  assert abs(ref.distance_correlation([x], [y], "biased") - want) <= tol(30, 30, 4)


def test_distance_correlation_unbiased_matches_dcor(dcor):
  (x,), (y,) = related(rng(4), [30], 4, 3)
  r2 = float(dcor.u_distance_correlation_sqr(x, y, method="naive"))
  assert 0.1 < r2 < 1
  assert abs(ref.distance_correlation([x], [y], "unbiased") - math.sqrt(r2)) <= tol(30, 30, 4)


@pytest.mark.parametrize("estimator", ["biased", "unbiased"])
def test_distance_correlation_sums_minibatch_statistics(dcor, estimator):
  xs, ys = related(rng(5), [20, 27, 9], 4, 3)
  cov = dcor.distance_covariance_sqr if estimator == "biased" else dcor.u_distance_covariance_sqr
  s = lambda a, b: sum(float(cov(p, q, method="naive")) for p, q in zip(a, b))
  want = math.sqrt(max(s(xs, ys), 0) / math.sqrt(s(xs, xs) * s(ys, ys)))
  # per-minibatch correlations averaged would be another number
  assert abs(ref.distance_correlation(xs, ys, estimator) - want) <= tol(27, 27, 4)


@pytest.mark.parametrize("estimator", ["biased", "unbiased"])
def test_distance_correlation_invariances(estimator):
  g = rng(6)
  xs, ys = related(g, [22, 15], 5, 3)
  base = ref.distance_correlation(xs, ys, estimator)
  q, shift = orthogonal(g, 5), g.standard_normal(5)
  moved = [2.5 * x @ q + shift for x in xs]
  assert abs(ref.distance_correlation(moved, ys, estimator) - base) <= tol(22, 22, 5)
  assert abs(ref.distance_correlation(xs, xs, estimator) - 1) <= tol(22, 22, 5)


# --- SVCCA and PWCCA -----------------------------------------------------------------


def test_svcca_without_truncation_is_mean_cca():
  xs, ys = related(rng(7), [40, 35], 5, 4)
  want = np.mean([mean_cca(x, y) for x, y in zip(xs, ys)])
  assert 0.2 < want < 0.99
  assert abs(ref.svcca(xs, ys, variance=1.0, dims=10) - want) <= tol(40, 5)


def test_svcca_of_invertible_map_is_one():
  g = rng(8)
  xs = [g.standard_normal((n, 6)) for n in (30, 41)]
  a = mixing(g, 6)
  assert abs(ref.svcca(xs, [x @ a for x in xs], variance=1.0) - 1) <= tol(41, 6)


def test_svcca_truncation_keeps_top_directions():
  # X = [10 z1, 5 z2, .3 z3, .3 z4] R: squared singular values 100, 25, .09, .09, so 99% of
  # the total (125.18) needs the top 2 (100/125.18 = 0.80, 125/125.18 = 0.9986).
  # Y = [10 (c z1 + s z5), 5 z2, .3 z3, .3 z4] R': same spectrum. Canonical correlations of
  # the top-2 spaces: 1 (z2) and c; of the full spaces: 1, 1, 1, c.
  g = rng(9)
  n, c = 40, 0.6
  z = centred_orthonormal(g, n, 5)
  s = math.sqrt(1 - c ** 2)
  x = np.stack([10 * z[:, 0], 5 * z[:, 1], .3 * z[:, 2], .3 * z[:, 3]], 1) @ orthogonal(g, 4)
  y = np.stack([10 * (c * z[:, 0] + s * z[:, 4]), 5 * z[:, 1], .3 * z[:, 2], .3 * z[:, 3]], 1) @ orthogonal(g, 4)
  assert abs(ref.svcca([x], [y]) - (1 + c) / 2) <= tol(n, 4)
  assert abs(ref.svcca([x], [y], variance=1.0) - (3 + c) / 4) <= tol(n, 4)
  assert abs(ref.svcca([x], [y], variance=1.0, dims=1) - c) <= tol(n, 4)


def equal_correlations(g: np.random.Generator, n: int, d: int, r: float) -> tuple[np.ndarray, np.ndarray]:
  """X = Z1 A, Y = (r Z1 + sqrt(1 - r^2) Z2) B with [Z1 Z2] centred orthonormal: all d
  canonical correlations are r."""
  z = centred_orthonormal(g, n, 2 * d)
  x = z[:, :d] @ mixing(g, d)
  y = (r * z[:, :d] + math.sqrt(1 - r ** 2) * z[:, d:]) @ mixing(g, d)
  return x + g.standard_normal(d), y + g.standard_normal(d)


def test_pwcca_equals_mean_cca_when_correlations_are_equal():
  g = rng(10)
  x, y = equal_correlations(g, 30, 4, 0.7)
  assert abs(mean_cca(x, y) - 0.7) <= tol(30, 4)
  assert abs(ref.pwcca([x], [y]) - 0.7) <= tol(30, 4)
  assert abs(ref.pwcca([y], [x]) - 0.7) <= tol(30, 4)
  assert abs(ref.svcca([x], [y], variance=1.0) - 0.7) <= tol(30, 4)


@pytest.mark.parametrize("s1, s2", [(3., 1.), (1., 3.)])
def test_pwcca_weights_by_variance(s1, s2):
  # X = [s1 z1, s2 z2] R, Y = [r1 z1 + q1 z3, r2 z2 + q2 z4] R' (q = sqrt(1 - r^2)): the canonical
  # variates of X are z1, z2 with correlations r1, r2, and sum_j <z_i, x_j>^2 = s_i^2, so
  # PWCCA(X, Y) = (s1^2 r1 + s2^2 r2) / (s1^2 + s2^2). Y's unit columns give Y's variates
  # equal weights: PWCCA(Y, X) = (r1 + r2) / 2.
  g = rng(11)
  n, r1, r2 = 30, 0.9, 0.3
  z = centred_orthonormal(g, n, 4)
  x = np.stack([s1 * z[:, 0], s2 * z[:, 1]], 1) @ orthogonal(g, 2)
  y = np.stack([r1 * z[:, 0] + math.sqrt(1 - r1 ** 2) * z[:, 2],
                r2 * z[:, 1] + math.sqrt(1 - r2 ** 2) * z[:, 3]], 1) @ orthogonal(g, 2)
  want = (s1 ** 2 * r1 + s2 ** 2 * r2) / (s1 ** 2 + s2 ** 2)  # 0.84 or 0.36
  assert abs(ref.pwcca([x], [y]) - want) <= tol(n, 2)
  assert abs(ref.pwcca([y], [x]) - (r1 + r2) / 2) <= tol(n, 2)
  # two minibatches: the mean of their values
  assert abs(ref.pwcca([x, y], [y, x]) - (want + (r1 + r2) / 2) / 2) <= tol(n, 2)


# --- eigenspace overlap -----------------------------------------------------------


def test_eigenspace_overlap_of_invertible_map_is_one():
  g = rng(12)
  xs = [g.standard_normal((n, 5)) + 3 for n in (20, 26)]
  a = mixing(g, 5)
  assert abs(ref.eigenspace_overlap(xs, [x @ a for x in xs]) - 1) <= tol(26, 5)


def test_eigenspace_overlap_nested_subspaces():
  g = rng(13)
  q, _ = np.linalg.qr(g.standard_normal((30, 5)))
  x, y = q[:, :3] @ mixing(g, 3), q @ mixing(g, 5)  # span(X) inside span(Y)
  assert abs(ref.eigenspace_overlap([x], [y]) - 3 / 5) <= tol(30, 5)
  assert abs(ref.eigenspace_overlap([y], [x]) - 3 / 5) <= tol(30, 5)


def test_eigenspace_overlap_dims_keeps_top_singular_vectors():
  # X = [3 q1, 2 q2, 1 q3] R, Y = [3 q1, 2 q3, 1 q2] R': the same 3-d space; their top-2
  # spaces share only q1.
  g = rng(14)
  q, _ = np.linalg.qr(g.standard_normal((25, 3)))
  x = q @ np.diag([3., 2., 1.]) @ orthogonal(g, 3)
  y = q[:, [0, 2, 1]] @ np.diag([3., 2., 1.]) @ orthogonal(g, 3)
  assert abs(ref.eigenspace_overlap([x], [y]) - 1) <= tol(25, 3)
  assert abs(ref.eigenspace_overlap([x], [y], dims=2) - 1 / 2) <= tol(25, 3)


def test_eigenspace_overlap_does_not_centre():
  # q1 = constant / sqrt(n): X = [q1, q2], Y = [q1, q3] overlap 1/2 uncentred; centred
  # they would be span(q2) and span(q3), overlap 0.
  g = rng(15)
  n = 20
  q, _ = np.linalg.qr(np.concatenate([np.ones((n, 1)), g.standard_normal((n, 2))], 1))
  x, y = q[:, [0, 1]] @ mixing(g, 2), q[:, [0, 2]] @ mixing(g, 2)
  assert abs(ref.eigenspace_overlap([x], [y]) - 1 / 2) <= tol(n, 2)


# --- RSM difference --------------------------------------------------------------------


def test_rsm_difference_analytic():
  g = rng(16)
  xs = [g.standard_normal((n, 4)) + 1 for n in (12, 19)]
  q, shift = orthogonal(g, 4), g.standard_normal(4)
  assert ref.rsm_difference(xs, [x @ q + shift for x in xs]) <= tol(19, 4)
  # Y = 2X: Dy - Dx = Dx, and sum_{i,j} ||x_i - x_j||^2 = 2 n sum_i ||x_i - mean||^2.
  num = sum(2 * len(x) * np.sum((x - x.mean(0)) ** 2) for x in xs)
  want = math.sqrt(num / sum(len(x) * (len(x) - 1) for x in xs))
  assert abs(ref.rsm_difference(xs, [2 * x for x in xs]) - want) <= tol(19, 19, 4)


# --- k-NN measures ------------------------------------------------------------------


def on_circle(degrees: list[float], radii: list[float], q: np.ndarray) -> np.ndarray:
  """Points at the given angles in a random plane of R^d (q: d x 2, orthonormal)."""
  t = np.radians(degrees)
  return (np.asarray(radii)[:, None] * np.stack([np.cos(t), np.sin(t)], 1)) @ q.T


def cosd(a: float) -> float:
  return math.cos(math.radians(a))


def cos_between(u: list[float], v: list[float]) -> float:
  return float(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))


# Hand example, n = 5, k = 2. Cosine similarity of points at angles a, b is cos(a - b), so
# neighbours are the nearest angles (radii differ on purpose: cosine ignores them).
#   X angles 0, 10, 25, 45, 70;  Y angles 0, 30, 40, 55, 90.
#   i  N_i (X, most similar first)   N'_i (Y)           Jaccard  rank similarity
#   0  1 (10), 2 (25)               1 (30), 2 (40)      1        (2/2 + 2/4) / (1 + 1/2) = 1
#   1  0 (10), 2 (15)               2 (10), 3 (25)      1/3      J={2}: r=2, r'=1: 2/(2*3) = 1/3
#   2  1 (15), 3 (20)               1 (10), 3 (15)      1        1
#   3  2 (20), 4 (25)               2 (15), 1 (25)      1/3      J={2}: r=r'=1: 2/(1*2) = 1
#   4  3 (25), 2 (45)               3 (35), 2 (50)      1        1
#   Jaccard = (3 + 2/3) / 5 = 11/15; rank similarity = (4 + 1/3) / 5 = 13/15.
# Second-order cosine: U_i = N_i | N'_i (ascending), vectors of angle gaps to i:
HAND_X, HAND_Y = [0, 10, 25, 45, 70], [0, 30, 40, 55, 90]
HAND_GAPS = [  # (X gaps, Y gaps) over U_i
    ([10, 25], [30, 40]),  # U_0 = {1, 2}
    ([10, 15, 35], [30, 10, 25]),  # U_1 = {0, 2, 3}
    ([15, 20], [10, 15]),  # U_2 = {1, 3}
    ([35, 20, 25], [25, 15, 35]),  # U_3 = {1, 2, 4}
    ([45, 25], [50, 35]),  # U_4 = {2, 3}
]
# Reversed example, n = 3, k = 2: X angles 0, 10, 30 and Y angles 0, 30, 10 order every
# example's two neighbours oppositely: rank similarity 2 * 2/(2*3) / (1 + 1/2) = 4/9 for each,
# Jaccard 1.
REV_X, REV_Y = [0, 10, 30], [0, 30, 10]
REV_GAPS = [([10, 30], [30, 10]), ([10, 20], [30, 20]), ([30, 20], [10, 20])]


def second_order(gaps: list, distances: bool = False) -> list[float]:
  f = (lambda a: 1 - cosd(a)) if distances else cosd
  return [cos_between([f(a) for a in gx], [f(a) for a in gy]) for gx, gy in gaps]


@pytest.fixture(scope="module")
def hand() -> dict[str, np.ndarray]:
  g = rng(17)
  q = plane(g, 6)
  r5, r3 = [1, 2, .5, 3, 1.5], [1, 4, .25]
  return {"x5": on_circle(HAND_X, r5, q), "y5": on_circle(HAND_Y, r5[::-1], q),
          "x3": on_circle(REV_X, r3, q), "y3": on_circle(REV_Y, r3, q)}


def test_knn_measures_of_identical_layers_are_one():
  g = rng(18)
  xs = [g.standard_normal((n, 6)) for n in (40, 23)]
  ys = [x * g.uniform(.5, 2, (len(x), 1)) for x in xs]  # cosines unchanged
  assert ref.knn_jaccard(xs, ys, k=5) == 1
  assert ref.rank_similarity(xs, ys, k=5) == pytest.approx(1, abs=tol(5))
  assert ref.second_order_cosine(xs, ys, k=5) == pytest.approx(1, abs=tol(10, 6))
  assert ref.second_order_cosine(xs, ys, k=5, distances=True) == pytest.approx(1, abs=tol(10, 6))


def test_knn_hand_example(hand):
  x, y = [hand["x5"]], [hand["y5"]]
  assert abs(ref.knn_jaccard(x, y, k=2) - 11 / 15) <= tol(5)
  assert abs(ref.rank_similarity(x, y, k=2) - 13 / 15) <= tol(5)
  sims, dists = np.mean(second_order(HAND_GAPS)), np.mean(second_order(HAND_GAPS, True))
  assert abs(ref.second_order_cosine(x, y, k=2) - sims) <= tol(5, 6)
  assert abs(ref.second_order_cosine(x, y, k=2, distances=True) - dists) <= tol(5, 6)
  assert abs(sims - dists) > 0.05  # the two variants are different measures


def test_rank_similarity_reversed_neighbours(hand):
  x, y = [hand["x3"]], [hand["y3"]]
  assert ref.knn_jaccard(x, y, k=2) == 1
  assert abs(ref.rank_similarity(x, y, k=2) - 4 / 9) <= tol(3)
  assert abs(ref.second_order_cosine(x, y, k=2) - np.mean(second_order(REV_GAPS))) <= tol(3, 6)


def test_knn_measures_average_over_all_examples(hand):
  xs, ys = [hand["x5"], hand["x3"]], [hand["y5"], hand["y3"]]
  assert abs(ref.knn_jaccard(xs, ys, k=2) - (5 * 11 / 15 + 3 * 1) / 8) <= tol(8)
  assert abs(ref.rank_similarity(xs, ys, k=2) - (5 * 13 / 15 + 3 * 4 / 9) / 8) <= tol(8)
  want = np.mean(second_order(HAND_GAPS) + second_order(REV_GAPS))
  assert abs(ref.second_order_cosine(xs, ys, k=2) - want) <= tol(8, 6)


# --- magnitude, concentricity, uniformity ---------------------------------------------


def around(g: np.random.Generator, mu: np.ndarray, n: int, c: float, perpendicular: bool = False) -> np.ndarray:
  """n (even) points mu +- c u_p in pairs (u_p random unit vectors, orthogonal to mu if
  `perpendicular`): their mean is exactly mu up to rounding, each ||x_i - mu|| = c."""
  u = g.standard_normal((n // 2, len(mu)))
  if perpendicular:
    u -= np.outer(u @ mu, mu) / (mu @ mu)
  u /= np.linalg.norm(u, axis=1, keepdims=True)
  return mu + c * np.concatenate([u, -u])


def test_magnitude_difference_analytic():
  # sum_{i != j} <x_i, x_j> = ||sum x||^2 - sum ||x_i||^2 = n(n-1)||mu||^2 - n c^2 per minibatch.
  g = rng(19)
  mu, c, sizes = g.standard_normal(5), 1.5, (20, 12)
  xs = [around(g, mu, n, c) for n in sizes]
  m2 = mu @ mu - c ** 2 * sum(sizes) / sum(n * (n - 1) for n in sizes)
  assert m2 > 0
  # centred layers: the estimate -c^2 * 32/512 < 0 clamps to m = 0
  ys = [around(g, np.zeros(3), n, c) for n in sizes]
  assert abs(ref.magnitude_difference(xs, ys) - math.sqrt(m2)) <= tol(20, 5)
  assert abs(ref.magnitude_difference(ys, xs) - math.sqrt(m2)) <= tol(20, 5)
  assert ref.magnitude_difference(xs, [3 * x for x in xs]) == pytest.approx(2 * math.sqrt(m2), abs=tol(20, 5))


def test_concentricity_difference_analytic():
  # x_i = mu_b +- c u (u orthogonal to mu_b): cos(x_i, mu_b) = |mu| / sqrt(|mu|^2 + c^2)
  # for every example: 3/5 for |mu| = 3, c = 4 and 5/13 for |mu| = 5, c = 12. Each minibatch
  # has its own mean (a global mean would give other cosines).
  g = rng(20)
  e = np.eye(4)
  xs = [around(g, 3 * e[0], 10, 4, True), around(g, 3 * e[1], 14, 4, True)]
  ys = [around(g, 5 * e[2], 10, 12, True), around(g, -5 * e[0], 14, 12, True)]
  assert abs(ref.concentricity_difference(xs, ys) - (3 / 5 - 5 / 13)) <= tol(14, 4)
  assert ref.concentricity_difference(xs, [2 * x for x in xs]) <= tol(14, 4)


def polygon(g: np.random.Generator, degrees: list[float], d: int) -> np.ndarray:
  """Points at the given angles (plus a common offset) of random norms, in a random plane of R^d."""
  return on_circle([a + 17 for a in degrees], g.uniform(.5, 3, len(degrees)), plane(g, d))


@pytest.mark.parametrize("t", [2., 1.])
def test_uniformity_difference_analytic(t):
  # Squared distances between unit vectors at angle a: 2 - 2 cos a. Per point, over the others:
  #   square (0, 90, 180, 270): 2, 2, 4          hexagon (0, 60, ..., 300): 1, 1, 3, 3, 4
  #   doubled digon (0, 0, 180, 180): 0, 4, 4    doubled triangle (0, 0, 120, 120, 240, 240): 0, 3, 3, 3, 3
  g = rng(21)
  square = lambda: polygon(g, [0, 90, 180, 270], 5)
  hexagon = lambda: polygon(g, [0, 60, 120, 180, 240, 300], 5)
  digon = lambda: polygon(g, [0, 0, 180, 180], 5)
  triangle = lambda: polygon(g, [0, 0, 120, 120, 240, 240], 5)
  e = lambda s: math.exp(-t * s)
  sq, hx = 4 * (2 * e(2) + e(4)), 6 * (2 * e(1) + 2 * e(3) + e(4))
  dg, tr = 4 * (e(0) + 2 * e(4)), 6 * (e(0) + 4 * e(3))
  want = abs(math.log(sq / 12) - math.log(dg / 12))
  assert abs(ref.uniformity_difference([square(), square()], [digon(), digon()], t=t) - want) <= tol(6)
  # pooled over minibatches (12 + 30 ordered pairs), not averaged per minibatch
  want = abs(math.log((sq + hx) / 42) - math.log((dg + tr) / 42))
  assert abs(ref.uniformity_difference([square(), hexagon()], [digon(), triangle()], t=t) - want) <= tol(6)
