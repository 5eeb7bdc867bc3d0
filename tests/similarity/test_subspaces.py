"""The measures read from each layer's principal subspace (mean CCA, mean squared
CCA, regression R², the angular shape metric, GULP) against float64 NumPy written from
their papers' definitions on the features; their invariances; the degenerate
case of a layer as wide as the minibatch; the null."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from support.library_sums import SIZES, batch_slices, padded_sums, related_layers
from support.library_sums import values_of_one
from support.numerics import assert_close, cka_bound, likely, worst
from support.reference_measures import np_gulp_squared
from vitcnn_jax.run import declaration
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import scales

NAMES = ("mean_cca", "cca_r2", "regression", "shape_metric", "gulp")  # the others: test_more_measures


def np_components(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """An orthonormal basis of the centred layer's top-k principal component scores
  (fewer where its rank is lower), and the centred layer."""
  xc = x - x.mean(0)
  u, s, _ = np.linalg.svd(xc, full_matrices=False)
  rank = int((s > 1e-10 * s[0]).sum())
  return u[:, :min(k, rank)], xc


def np_whitened(x: np.ndarray, alpha: float) -> np.ndarray:
  """Williams et al. (2021): the centred layer, scaled to unit norm, its singular
  values s partially whitened to alpha s + 1 - alpha."""
  xc = x - x.mean(0)
  u, s, vt = np.linalg.svd(xc / np.linalg.norm(xc), full_matrices=False)
  keep = s > 1e-10 * s[0]
  return (u[:, keep] * (alpha * s[keep] + 1 - alpha)) @ vt[keep]


def np_measures(x: np.ndarray, y: np.ndarray, k: int, alpha: float, lam: float = 0.01
                ) -> dict[str, float]:
  """Each measure of the pair (x, y): x the row layer (the predictor), y the column
  (GULP squared: minibatches combine squares)."""
  qx, _ = np_components(x, k)
  qy, yc = np_components(y, k)
  rho = np.linalg.svd(qx.T @ qy, compute_uv=False)  # canonical correlations (Hotelling)
  fewer = min(qx.shape[1], qy.shape[1])
  coef, *_ = np.linalg.lstsq(qx, yc, rcond=None)  # least squares from x's components
  wx, wy = np_whitened(x, alpha), np_whitened(y, alpha)
  return {"mean_cca": rho.sum() / fewer, "cca_r2": (rho ** 2).sum() / fewer,
          "regression": 1 - np.linalg.norm(yc - qx @ coef) ** 2 / np.linalg.norm(yc) ** 2,
          "shape_metric": np.linalg.svd(wx.T @ wy, compute_uv=False).sum()
                          / (np.linalg.norm(wx) * np.linalg.norm(wy)),
          "gulp": np_gulp_squared(x, y, lam)}


def _conditioning(acts, rows_list, k: int) -> tuple[float, float]:
  """From float64: the smallest relative eigengap at the k-th component (what the
  reduced measures' subspaces hang on) and the largest ratio of a layer's top
  eigenvalue to its smallest nonzero one (the shape metric's square roots)."""
  gap, spread = np.inf, 1.0
  for rows in rows_list:
    for a in acts:
      s = np.linalg.svd(a[rows] - a[rows].mean(0), compute_uv=False) ** 2
      s = s[s > 1e-10 * s[0]]
      if len(s) > k:
        gap = min(gap, (s[k - 1] - s[k]) / s[0])
      spread = max(spread, s[0] / s[-1])
  return gap, spread


@pytest.mark.parametrize("alpha", [1.0, 0.4])
def test_each_equals_its_definition_over_unequal_padded_minibatches(alpha):
  acts = related_layers(6)
  dims = (min(SIZES) - 1) // 2
  spec = measures.Spec(NAMES, cca_dims=dims, shape_alpha=alpha)
  got = padded_sums(acts, SIZES, spec)
  values = measures.values(got, ["x", "y", "z"], spec, sum(SIZES))
  rows_list = batch_slices(len(acts[0]), SIZES)
  gap, spread = _conditioning(acts, rows_list, dims)
  # float32: Grams of up to 24 features, eigh's backward error over 16 rows; a subspace
  # moves by that over its eigengap (Davis-Kahan), a square root by its relative spread.
  noise = 8 * (likely(24, 16) + worst(16))
  # A ridge hat matrix moves by at most the Gram's error over the penalty; the distance by
  # that over the Frobenius norm of n rows (‖δR‖_F <= √n ‖δR‖_2).
  bounds = {"mean_cca": noise / gap, "cca_r2": noise / gap, "regression": noise / gap,
            "shape_metric": noise * np.sqrt(spread), "gulp": 2 * np.sqrt(16) * noise / spec.gulp_lambda}
  for i, j in [(0, 1), (1, 0), (0, 2), (1, 2), (2, 2)]:
    ref = [np_measures(acts[i][rows], acts[j][rows], dims, alpha) for rows in rows_list]
    for m in NAMES:
      want = np.mean([r[m] for r in ref])  # a mean over the minibatches (GULP's of squares)
      want = np.sqrt(want) if m == "gulp" else want
      assert_close(values[m][i, j], want, bounds[m], f"{m} {i}-{j} alpha {alpha}")
  assert np.array_equal(got["subspace_count"], 3.0)
  # Every layer is wider than 5 components: reduced in each minibatch.
  np.testing.assert_array_equal(got["subspace_reduced"], [3.0, 3.0, 3.0])


def test_invariances():
  """Orthogonal maps, isotropic scaling and permutations of features leave every
  measure as it was; an invertible linear map of a layer narrower than cca_dims
  leaves the CCA family and the predictor's side of regression as they were and
  moves the shape metric (Procrustes) and the target's side of regression."""
  rng = np.random.default_rng(8)
  n = 41
  x = rng.standard_normal((n, 6))
  y = x[:, :4] @ rng.standard_normal((4, 5)) + 0.6 * rng.standard_normal((n, 5))
  spec = measures.Spec(NAMES, cca_dims=20)
  base = values_of_one([x, y], spec)
  q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
  mixed = q * np.array([3.0, 0.5, 1, 1, 2, 0.7])  # invertible, not orthogonal
  bound = 16 * (likely(6, n) + worst(n))
  for what, moved in (("orthogonal", x @ q), ("scaled", 7.5 * x), ("permuted", x[:, ::-1])):
    got = values_of_one([moved, y], spec)
    for m in NAMES:
      scale = 2 * np.sqrt(n) / spec.gulp_lambda if m == "gulp" else 1.0  # as in the test above
      assert_close(got[m][0, 1], base[m][0, 1], bound * scale, f"{m} under {what} features")
  got = values_of_one([x @ mixed, y], spec)
  for m in ("mean_cca", "cca_r2", "regression"):
    # Directions scaled by up to cond(mixed) carry that much more relative error, squared in a Gram.
    assert_close(got[m][0, 1], base[m][0, 1], bound * np.linalg.cond(mixed) ** 2, f"{m}: invertible map")
  assert abs(got["shape_metric"][0, 1] - base["shape_metric"][0, 1]) > 0.01
  assert abs(got["regression"][1, 0] - base["regression"][1, 0]) > 0.01  # x is now the target
  assert abs(got["gulp"][0, 1] - base["gulp"][0, 1]) > 0.01  # a ridge penalty is not invariant


def test_a_layer_as_wide_as_the_minibatch_is_reduced_not_one():
  """Independent layers of 40 features in minibatches of 16: read whole, every
  canonical correlation would be 1 (Kornblith et al. 2019, Theorem 1); through 7
  components each, they are what 7-dimensional subspaces of independent data give."""
  rng = np.random.default_rng(9)
  x, y = rng.standard_normal((16, 40)), rng.standard_normal((16, 40))
  whole = np_measures(x, y, 16, 1.0)
  assert whole["mean_cca"] > 1 - 1e-9 and whole["regression"] > 1 - 1e-9  # the degenerate case
  got = values_of_one([x, y], measures.Spec(NAMES, cca_dims=7))
  for m in ("mean_cca", "cca_r2", "regression"):
    assert got[m][0, 1] < 0.9, (m, got[m][0, 1])
  assert_close(got["mean_cca"][0, 1], np_measures(x, y, 7, 1.0)["mean_cca"], 1e-3, "reduced")
  config = {"measures": NAMES, "batch_size": 16, "num_examples": 64}
  assert measures.spec_of(_Config(config)).cca_dims == 7  # the default: half the minibatch
  with pytest.raises(ValueError, match=r"config.cca_dims=8: .* smallest here has 16 examples; "
                                       r"use 1..7"):
    measures.spec_of(_Config({**config, "cca_dims": 8}))
  with pytest.raises(ValueError, match=r"config.shape_alpha=0.0 must be in \(0, 1\]"):
    measures.spec_of(_Config({**config, "shape_alpha": 0.0}))
  with pytest.raises(ValueError, match=r"config.gulp_lambda=0.0 must be > 0"):
    measures.spec_of(_Config({**config, "gulp_lambda": 0.0}))
  # GULP at a small penalty: independent wide layers stay apart (at 0 they would be equal).
  assert got["gulp"][0, 1] > 0.5, got["gulp"]


def np_top(x: np.ndarray, w: int) -> np.ndarray:
  """The centred layer's top-w principal component scores, scaled to unit norm."""
  u, s, _ = np.linalg.svd(x - x.mean(0), full_matrices=False)
  return u[:, :w] * s[:w] / np.linalg.norm(s[:w])


def test_procrustes_and_the_shape_metric_read_each_layer_s_top_subspace_dims_components():
  """With subspace_dims below a layer's rank, Procrustes and the shape metric are
  those of each layer's top components scaled to unit norm (float64 from the
  features), and the json's share of variance kept is theirs; the default reads
  32 components, the CCA family's default at most as many."""
  rng = np.random.default_rng(12)
  n, w = 24, 5
  base = rng.standard_normal((n, w)) * np.array([5.0, 4, 3, 2, 1.5])  # 5 strong directions
  x = base @ rng.standard_normal((w, 30)) + 1.5 * rng.standard_normal((n, 30))
  y = base @ rng.standard_normal((w, 30)) + 2.0 * rng.standard_normal((n, 30))
  names = ("procrustes", "shape_metric", "eigenspace_overlap")
  for alpha in (1.0, 0.5):
    spec = measures.Spec(names, cca_dims=3, subspace_dims=w, shape_alpha=alpha)
    got = scales.unscale(jax.device_get(jax.jit(functools.partial(measures.minibatch_sums, spec=spec))(
        [x.astype(np.float32), y.astype(np.float32)], np.ones(n, np.float32))), measures.SCALES)
    values = measures.values(got, ["x", "y"], spec, n)
    tx, ty = np_top(x, w), np_top(y, w)
    nuclear = np.linalg.svd(tx.T @ ty, compute_uv=False).sum()
    whitened = [np_whitened(t, alpha) for t in (tx, ty)]
    shape = (np.linalg.svd(whitened[0].T @ whitened[1], compute_uv=False).sum()
             / np.prod([np.linalg.norm(v) for v in whitened]))
    gap, _ = _conditioning([x, y], [np.arange(n)], w)
    noise = 8 * (likely(30, n) + worst(n)) / gap  # the top subspace moves by this (Davis-Kahan)
    spread = max(v[0] / v[w - 1] for v in (np.linalg.svd(t, compute_uv=False) ** 2 for t in (tx, ty)))
    assert_close(values["shape_metric"][0, 1], shape, noise * np.sqrt(spread), f"shape alpha {alpha}")
    if alpha == 1.0:
      assert_close(values["procrustes"][0, 1], np.sqrt(max(2 - 2 * nuclear, 0.0)), noise, "procrustes")
      assert_close(values["procrustes"][0, 0], 0.0, noise, "procrustes of a layer with itself")
    for i, a in enumerate((x, y)):  # the variance the top w components keep
      s = np.linalg.svd(a - a.mean(0), compute_uv=False) ** 2
      assert_close(got["shape_kept"][i], s[:w].sum() / s.sum(), noise, "variance kept")
      assert_close(got["subspace_kept"][i], s[:3].sum() / s.sum(), noise, "cca_dims' variance kept")
      raw = np.linalg.svd(a, compute_uv=False) ** 2  # the eigenspace overlap's: uncentred
      assert_close(got["overlap_kept"][i], raw[:3].sum() / raw.sum(), noise, "uncentred variance kept")
  assert 0.9 < got["shape_kept"][1] < got["shape_kept"][0] < 0.99
  config = {"measures": names, "batch_size": 256, "num_examples": 512}
  spec = measures.spec_of(_Config(config))
  assert (spec.subspace_dims, spec.cca_dims) == (measures.SUBSPACE_DIMS, 32)
  assert declaration.defaults("cka")["subspace_dims"] == measures.SUBSPACE_DIMS  # the config's too
  assert measures.spec_of(_Config({**config, "subspace_dims": 0})).cca_dims == 127  # every component
  with pytest.raises(ValueError, match=r"config.subspace_dims=-1 must be >= 1, or 0"):
    measures.spec_of(_Config({**config, "subspace_dims": -1}))


class _Config(dict):
  """A config's fields as attributes, `get` as ml_collections has it."""
  __getattr__ = dict.__getitem__


def test_the_null_is_each_measure_with_one_layer_permuted():
  """Above the diagonal the column layer's examples are permuted, below it the row
  layer's: regression and PWCCA, one-way, tell the two apart."""
  acts = related_layers(3, n=16)
  spec = measures.Spec(NAMES, cca_dims=5, null=True)
  key = jax.random.PRNGKey(7)
  mask = np.r_[np.ones(12), np.zeros(4)].astype(np.float32)
  order = np.asarray(measures.permutation(key, mask))
  padded = [np.concatenate([a[:12], np.full((4, a.shape[1]), 5.0)]).astype(np.float32) for a in acts]
  got = scales.unscale(jax.device_get(jax.jit(functools.partial(measures.minibatch_sums, spec=spec))(
      padded, mask, key=key)), measures.SCALES)
  plain = jax.jit(functools.partial(measures.minibatch_sums, spec=measures.Spec(NAMES, cca_dims=5)))
  gap, spread = _conditioning([a[:12] for a in acts] + [a[:12][order[:12]] for a in acts],
                              [slice(0, 12)], 5)
  for b in range(3):
    ref = scales.unscale(jax.device_get(plain([padded[0], padded[b][order]], mask)), measures.SCALES)
    for m in NAMES:
      bound = 8 * (likely(24, 12) + worst(12)) * max(1 / gap, np.sqrt(spread))
      if m == "gulp":  # a square, up to 2 * rank: its error as in the definitions' test, doubled
        bound = 8 * (likely(24, 12) + worst(12)) * 4 * np.sqrt(12) * np.sqrt(2 * 12) / spec.gulp_lambda
      assert_close(got[f"null/{m}"][0, b], ref[m][0, 1], bound, f"null {m} 0-{b}")
      if b:  # below the diagonal the row layer's examples are re-indexed (see layerpairs)
        assert_close(got[f"null/{m}"][b, 0], ref[m][1, 0], bound, f"null {m} {b}-0")


def test_cca_family_regression_and_biased_cka_equal_repsim():
  """repsim 0.1.5 (Kisung You's C++ package, float64) where it defines a measure as
  we do, on one minibatch of layers narrower than cca_dims (nothing reduced): its
  CCA summarised as "pillai" is the mean canonical correlation and as "yanai" the
  mean squared one; its linear regression (its C++ `cpp_linreg`) averages the two
  directions of R² (on centred layers: it does not centre); its Gretton-estimator
  linear CKA is biased CKA. Not compared: its PWCCA weighs by Morcos et al.'s
  absolute projections, not our squared ones; its SVCCA applies the 99% rule to
  an orthonormal basis of each layer, whose directions all carry equal variance,
  so it keeps nearly every one (it equals its CCA), not Raghu et al.'s top components."""
  from conftest import require
  repsim = require("repsim")
  rng = np.random.default_rng(21)
  n, widths = 24, (4, 7, 9)
  centred = lambda a: a - a.mean(0)
  shared = np.linalg.qr(centred(rng.standard_normal((n, max(widths)))))[0]
  acts = []
  for d in widths:  # related layers of known conditioning: singular values from 1 to 0.3
    basis = np.linalg.qr(shared[:, :d] + 0.5 * centred(rng.standard_normal((n, d))))[0]
    rotation = np.linalg.qr(rng.standard_normal((d, d)))[0]
    acts.append(basis * np.linspace(1.0, 0.3, d) @ rotation + rng.standard_normal(d))  # offset rows
  got = values_of_one(acts, measures.Spec(("mean_cca", "cca_r2", "regression"), cca_dims=(n - 1) // 2))
  cka = values_of_one(acts, measures.Spec(("linear_cka",), estimator="biased"))["linear_cka"]
  ref = {"mean_cca": repsim.cca(acts, "pillai"), "cca_r2": repsim.cca(acts, "yanai"),
         # its C++ module binds linear regression; 0.1.5 has no Python wrapper for it
         "regression": require("repsim._repsim").cpp_linreg([centred(a) for a in acts]),
         "linear_cka": repsim.cka(acts, kernel_type="linear", estimator="gretton")}
  # As in the definitions' test: float32 Grams of up to 9 features over 24 rows; the
  # column space moves by that over its smallest eigenvalue relative to its largest.
  spread = max(np.linalg.cond(centred(a)) ** 2 for a in acts)
  noise = 8 * (likely(max(widths), n) + worst(n)) * spread
  bounds = {"mean_cca": noise, "cca_r2": noise, "regression": noise,
            "linear_cka": cka_bound(n, max(widths))}
  both_ways = {"regression": lambda v: (v + v.T) / 2}
  for m, want in ref.items():
    value = cka if m == "linear_cka" else got[m]
    assert_close(both_ways.get(m, lambda v: v)(value), want, bounds[m], f"{m} vs repsim")
