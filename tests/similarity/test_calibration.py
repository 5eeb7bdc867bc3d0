"""A pair's score calibrated against the null of its layer search
(`calibration`, `layer_search`): against the `calibrated-similarity` package on
in-memory matrices, against the families' own per-cell null, and on the analytic
control of independent random features at widths around the minibatch size."""

from __future__ import annotations


import numpy as np
import pytest

from conftest import require
from support import cka_ref
from support.numerics import cka_bound
from vitcnn_jax.similarity import calibration
from vitcnn_jax.similarity import layer_search
from vitcnn_jax.similarity import matching
from vitcnn_jax.similarity import measures

N, K = 40, 99


def _related(seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Two models' layers that share part of a latent code, at unequal widths."""
  g = np.random.default_rng(seed)
  z = g.normal(size=(N, 6))
  xs = [z @ g.normal(size=(6, 20)) + 0.5 * g.normal(size=(N, 20)), np.tanh(z @ g.normal(size=(6, 12)))]
  ys = [z[:, :3] @ g.normal(size=(3, 30)) + g.normal(size=(N, 30)), g.normal(size=(N, 7)),
        np.tanh(z[:, 2:] @ g.normal(size=(4, 9)))]
  return xs, ys


@pytest.mark.parametrize("estimator, aggregate", [("unbiased", "best"), ("biased", "matched")])
def test_calibrated_scores_equal_the_calibrated_similarity_package(estimator, aggregate):
  """The package's `calibrate_layers`, fed the same permutations and a float64
  CKA, gives the same calibrated score, level and p-value.

  Bound: each of our cells is within `cka_bound` of float64 (and the package's
  float32 cells within 2^-24 of theirs), so every statistic (a max, or a mean
  of matched cells, of such cells) and every order statistic of them (tau) is
  within d of the package's; the score (o - t) / (1 - t) then moves by at most
  2 d / (1 - t) + d / (1 - t)^2. The p-value is exact where no draw lies within
  2 d of the observed statistic (checked)."""
  torch = require("torch")
  cs = require("calibrated_similarity")
  xs, ys = _related(3)
  seed = 5
  got = layer_search.calibrate_layers(xs, ys, measures.Spec(("linear_cka",), estimator=estimator),
                                      aggregate=aggregate, num_null=K, seed=seed)["linear_cka"]
  orders = iter(layer_search.draw_orders(seed, 0, K, np.ones(N, np.float32)))

  def cka(x, y) -> float:
    x, y = x.double().numpy(), y.double().numpy()
    if estimator == "unbiased":
      return cka_ref.np_minibatch_cka([x], [y])
    k, l = ((a - a.mean(0)) @ (a - a.mean(0)).T for a in (x, y))  # the centred Grams
    return float(np.sum(k * l) / np.sqrt(np.sum(k * k) * np.sum(l * l)))

  agg = "max" if aggregate == "best" else (lambda s: torch.tensor(matching.score(s.double().numpy())))
  score, p, tau = cs.calibrate_layers([torch.tensor(x) for x in xs], [torch.tensor(y) for y in ys], cka,
                                      agg=agg, K=K, alpha=0.05,
                                      perm_fn=lambda n, device: torch.tensor(next(orders)))
  d = cka_bound(N, 30) + 2.0 ** -24
  assert np.min(np.abs(got.null - got.raw)) > 2 * d, "a draw within rounding of the observed: p is not decided"
  assert got.p_value == pytest.approx(float(p), abs=1e-7)
  assert abs(got.tau - float(tau)) <= d
  room = 1.0 - float(tau) - d
  assert abs(got.score - float(score)) <= 2 * d / room + d / room ** 2, (got.score, float(score))
  assert 0.0 < got.score < 1.0 and got.p_value < 0.05, got  # related models: a real, partial match


def test_a_distance_is_calibrated_towards_zero():
  """By hand, on draws 0.05, 0.10, ..., 0.95 (K = 19, alpha = 0.1): the level is
  the ceil(0.9 * 20) = 18th smallest of the 20 statistics, of the negated ones
  for a distance (its 3rd smallest), and a distance of 0 scores 1."""
  null = np.arange(1.0, 20.0) / 20
  got = calibration.calibrate(0.025, null, distance=True, alpha=0.1)
  assert got.p_value == pytest.approx(1 / 20) and got.tau == pytest.approx(0.10)
  assert got.score == pytest.approx(0.75)
  mid = calibration.calibrate(0.525, null, distance=True, alpha=0.1)
  assert mid.p_value == pytest.approx(11 / 20) and mid.score == 0.0
  sim = calibration.calibrate(0.925, null, alpha=0.1)
  assert sim.tau == pytest.approx(0.90) and sim.p_value == pytest.approx(2 / 20)
  assert sim.score == pytest.approx(0.25)
  with pytest.raises(ValueError, match="alpha=1.5"):
    calibration.calibrate(0.5, null, alpha=1.5)
  with pytest.raises(FloatingPointError, match="1 of 19 null draws"):
    calibration.calibrate(0.5, np.r_[null[:-1], np.nan])
  with pytest.raises(ValueError, match="aggregate='top'"):
    layer_search.calibrate_layers([null[:, None]], [null[:, None]], aggregate="top")


def test_a_draw_is_the_families_own_null_of_the_same_order():
  """B's stack re-indexed (a draw) gives, for the measures that read each
  per-example array of a layer (linear CKA its Gram, the k-NN measures the
  uncentred Gram, RSA the rows' means), the families' own per-cell null of the
  same order, computed by re-indexing their matrices instead. Bounds: two
  float32 computations of one value, each within CKA's bound (`cka_bound`) or,
  for RSA's correlation of n^2 dissimilarities, three such inner products'; the
  neighbour sets are the same, so their counts add up alike."""
  import jax

  from support.numerics import assert_close, likely, worst
  from vitcnn_jax.similarity import registry
  from vitcnn_jax.similarity import scales
  xs, ys = _related(7)
  names = ("linear_cka", "mutual_knn", "knn_jaccard", "rsa")
  spec = measures.Spec(names, knn_k=5, null=True)
  mask = jax.numpy.ones(N, np.float32)
  a, b = (layer_search._stack(tuple(v), mask, measures.grams.HIGHEST) for v in (xs, ys))
  keys = layer_search.draw_keys(0, 0, 1)
  _, drawn = layer_search._minibatch(a, b, mask, keys, spec, measures.grams.HIGHEST)
  cell = jax.jit(lambda s, k: measures.stack_sums(s, mask, spec, key=k))(registry.Stack.join([a, b]), keys[0])
  host = lambda sums: scales.unscale({k: np.asarray(v) for k, v in sums.items()}, measures.SCALES)
  layers = [f"layer{i}" for i in range(5)]
  draw = measures.values(host({k: v[0] for k, v in drawn.items()}), layers, spec, N)
  null = measures.values(host(cell), layers, spec, N, null=True)
  bounds = {"linear_cka": 2 * cka_bound(N, 30), "rsa": 2 * 3 * likely(N * N), "mutual_knn": worst(N * 5),
            "knn_jaccard": worst(N * 5)}
  for m in names:
    assert_close(draw[m][:2, 2:], null[m][:2, 2:], bounds[m], m)
    assert np.ptp(draw[m][:2, 2:]) > 0, m  # not all equal: a re-index that moved nothing would pass too


def test_independent_features_calibrate_to_zero_at_every_width():
  """The analytic control: two models' layers independent of each other (random
  features, not functions of the same examples) at widths 4, 32 and 256 around
  minibatches of 32. Biased linear CKA's raw score grows with width (towards 1
  as width/n grows: the centred Grams both tend to the centring matrix), while
  for every measure with a null, in R = 10 independent repeats at each width,
  p <= 0.05 in at most 4 (at most 1e-3 likely under a valid null: Binomial(10,
  0.05) gives P(>= 5) = 6e-5 per measure and width) and the median calibrated
  score is 0; every draw set has spread (a null that moved nothing would give
  p = 1 everywhere)."""
  names = tuple(m for m in measures.NAMES if measures.REGISTRY[m].null)
  spec = measures.Spec(names, estimator="biased", knn_k=5, cca_dims=4, subspace_dims=8)
  widths, repeats, n = (4, 32, 256), 10, 32
  raw_cka = {}
  for d in widths:
    got = {m: [] for m in names}
    for r in range(repeats):
      g = np.random.default_rng(1000 * d + r)
      xs, ys = ([g.normal(size=(2 * n, d)) for _ in range(2)] for _ in range(2))
      for m, c in layer_search.calibrate_layers(xs, ys, spec, num_null=19, batch_size=n, seed=r).items():
        got[m].append(c)
    for m, cs in got.items():
      assert sum(c.p_value <= 0.05 for c in cs) <= 4, (d, m, [c.p_value for c in cs])
      assert np.median([c.score for c in cs]) == 0.0, (d, m)
      assert all(np.ptp(c.null) > 0 for c in cs), (d, m)
    raw_cka[d] = np.mean([c.raw for c in got["linear_cka"]])
  assert raw_cka[4] + 0.2 < raw_cka[32] and raw_cka[32] + 0.2 < raw_cka[256], raw_cka
