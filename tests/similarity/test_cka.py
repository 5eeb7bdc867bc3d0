"""CKA against the reference values of methods.md and a float64 NumPy implementation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.cka_ref import np_hsic1, np_minibatch_cka
from support.library_sums import hsic_matrix
from support.numerics import assert_close, cka_bound, likely, worst
from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import linear_cka
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import scales


# --- float64 NumPy reference, written from the formulas (Song et al. 2012) -----


def np_linear_cka_biased(x: np.ndarray, y: np.ndarray) -> float:
  x = x.reshape(len(x), -1).astype(np.float64)
  y = y.reshape(len(y), -1).astype(np.float64)
  x, y = x - x.mean(0), y - y.mean(0)
  return float(np.linalg.norm(x.T @ y) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


@pytest.fixture
def demo_data():
  np.random.seed(1337)
  x = np.random.randn(100, 10)
  y = np.random.randn(100, 10) + x
  return x, y


# --- reference values (methods.md §1, Kornblith's Demo.ipynb data) --------------


def test_reference_values(demo_data):
  x, y = demo_data
  # The float64 reference reproduces the published values to their printed digits.
  assert abs(np_linear_cka_biased(x, y) - 0.55761) <= 5e-6
  assert abs(np_hsic1(x, y) - 9.895955787) <= 5e-10
  # Ours (float32) agrees with it within the arithmetic's bound.
  bound = cka_bound(100, 10)
  assert_close(linear_cka.linear_cka(x, y), np_linear_cka_biased(x, y), bound, "linear CKA")
  assert abs(linear_cka.linear_cka(x, y) - 0.55761) <= 5e-6 + bound
  assert abs(linear_cka.linear_cka(x, y, debiased=True) - 0.51346) <= 5e-6 + bound
  hs = hsic_matrix([x.astype(np.float32), y.astype(np.float32)])[0, 1]
  assert_close(hs / np_hsic1(x, y), 1.0, cka_bound(100, 10), "HSIC1, relative")


def test_minibatch_reference_value(demo_data):
  x, y = demo_data
  m = linear_cka.MinibatchCKA(["x"], ["y"])
  for i in range(10):
    m.update({"x": x[i * 10:(i + 1) * 10]}, {"y": y[i * 10:(i + 1) * 10]})
  r = m.result()
  ref = np_minibatch_cka(np.split(x, 10), np.split(y, 10))
  assert abs(ref - 0.54373) <= 5e-6
  assert_close(r.xy[0, 0], ref, cka_bound(10, 10), "minibatch CKA")
  # Self-CKA is the same HSIC divided by itself: float64 on the host, exactly 1.
  np.testing.assert_allclose([r.xx[0, 0], r.yy[0, 0]], 1.0, atol=1e-12)


# --- agreement with float64 NumPy on several layers ---------------------------------


def _layers(rng, n):
  base = rng.standard_normal((n, 6))
  return {
      "a": base @ rng.standard_normal((6, 20)) + 0.1 * rng.standard_normal((n, 20)),
      "b": np.tanh(base @ rng.standard_normal((6, 3))),
      "c": rng.standard_normal((n, 4, 5)) + base[:, :1, None],  # tokens x channels
      "d": rng.standard_normal((n, 64)),
  }


def test_minibatch_matches_float64_numpy_all_pairs_unequal_batches(gram_path):
  rng = np.random.default_rng(0)
  sizes = [16, 16, 9, 23]  # unequal minibatches need the per-batch 1/(n(n-3))
  batches_x = [_layers(rng, n) for n in sizes]
  batches_y = [{k + "y": v[:, ::-1] ** 2 + 0.5 * v for k, v in b.items() if k != "c"} for b in batches_x]
  names_x, names_y = list(batches_x[0]), list(batches_y[0])
  m = linear_cka.MinibatchCKA(names_x, names_y)
  for bx, by in zip(batches_x, batches_y):
    m.update({k: v.astype(np.float32) for k, v in bx.items()},
             {k: v.astype(np.float32) for k, v in by.items()})
  r = m.result()
  bound = cka_bound(max(sizes), 64)  # the widest layer has 64 features
  for i, a in enumerate(names_x):
    for j, b in enumerate(names_x):
      ref = np_minibatch_cka([bx[a] for bx in batches_x], [bx[b] for bx in batches_x])
      assert_close(r.xx[i, j], ref, bound, f"xx {a} {b}")
    for j, b in enumerate(names_y):
      ref = np_minibatch_cka([bx[a] for bx in batches_x], [by[b] for by in batches_y])
      assert_close(r.xy[i, j], ref, bound, f"xy {a} {b}")


def test_stacked_layers_equal_the_same_layers_one_by_one(gram_path):
  """`stacked_sums` (each stack's layers made by one batched program, as
  localization's tokens and patches are) is `minibatch_sums` of the same layers in
  order: padding rows, 3-D layers, and in one stack a layer at 1e20 beside ones
  at 1, whose scales the batched program finds apart."""
  rng = np.random.default_rng(2)
  mask = np.r_[np.ones(13), np.zeros(3)].astype(np.float32)
  big = np.array([1.0, 1e20, 1.0])[:, None, None, None]
  stacks = [rng.standard_normal((4, 16, 5)).astype(np.float32),
            (big * rng.standard_normal((3, 16, 3, 2)) + 0.5).astype(np.float32)]
  layers = [a for s in stacks for a in s]
  got = jax.device_get(jax.jit(hsic.stacked_sums)([jnp.asarray(s) for s in stacks], jnp.asarray(mask)))
  want = jax.device_get(jax.jit(hsic.activation_sums)([jnp.asarray(a) for a in layers], jnp.asarray(mask)))
  np.testing.assert_array_equal(got["log2_scale"], want["log2_scale"])  # exponents from the same bits
  assert want["log2_scale"][5] > 60  # the layer at 1e20 was scaled apart from the others
  got, want = scales.unscale(got, measures.SCALES), scales.unscale(want, measures.SCALES)
  names = [str(i) for i in range(len(layers))]
  cka = lambda s: linear_cka.cka_from_hsic(s["hsic"], names, s["moments"] / 13)
  # Two float32 computations of the same sums (batched and one by one), on the CKA scale.
  assert_close(cka(got), cka(want), 2 * cka_bound(13, 6), "stacked vs one by one")
  assert_close(got["moments"] / want["moments"], 1.0, 2 * worst(6), "fourth moments, relative")


def test_masked_padding_equals_the_unpadded_batch(gram_path):
  rng = np.random.default_rng(1)
  acts = [rng.standard_normal((11, 7)).astype(np.float32), rng.standard_normal((11, 3, 2)).astype(np.float32)]
  padded = [np.concatenate([a, rng.standard_normal((5,) + a.shape[1:]).astype(np.float32)]) for a in acts]
  mask = np.r_[np.ones(11), np.zeros(5)]
  want = hsic_matrix(acts)
  # Both sides are float32 with different padding: twice the bound, on the HSIC scale.
  assert_close(hsic_matrix(padded, mask), want, 2 * cka_bound(16, 7) * np.abs(want).max(),
               "masked HSIC")
  assert float(np.abs(hsic_matrix(padded, np.zeros(16))).max()) == 0.0  # an all-padding device


def test_full_batch_matches_numpy_and_invariances():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((50, 30))
  y = x @ rng.standard_normal((30, 12)) + rng.standard_normal((50, 12))
  bound = cka_bound(50, 30)
  assert_close(linear_cka.linear_cka(x, y), np_linear_cka_biased(x, y), bound, "full batch")
  q, _ = np.linalg.qr(rng.standard_normal((30, 30)))
  for f in (lambda v: v @ q, lambda v: 7.5 * v):  # both sides float32: twice the bound
    assert_close(linear_cka.linear_cka(f(x), y), linear_cka.linear_cka(x, y), 2 * bound, "invariance")
    assert_close(linear_cka.linear_cka(f(x), y, debiased=True), linear_cka.linear_cka(x, y, debiased=True),
                 2 * bound, "invariance, debiased")
  # The same dot over its own square root: a product, a sqrt and a division.
  assert_close(linear_cka.linear_cka(x, x), 1.0, worst(3), "self")
  assert_close(linear_cka.linear_cka(x, x, debiased=True), 1.0, worst(3), "self, debiased")
  m = linear_cka.MinibatchCKA(["x", "xq", "xs"])
  for i in range(5):
    xb = x[i * 10:(i + 1) * 10].astype(np.float32)
    m.update({"x": xb, "xq": xb @ q.astype(np.float32), "xs": 3 * xb})
  # x @ q in float32 perturbs xq by likely(30) relative before the CKA's own error.
  assert_close(m.result().xx, 1.0, 2 * cka_bound(10, 30) + likely(30), "minibatch invariance")


def test_independent_data_is_near_zero_unbiased():
  rng = np.random.default_rng(3)
  m = linear_cka.MinibatchCKA(["x"], ["y"])
  for _ in range(20):
    m.update({"x": rng.standard_normal((64, 32))}, {"y": rng.standard_normal((64, 32))})
  assert abs(float(m.result().xy[0, 0])) < 0.02


def test_errors_name_the_layer_and_the_batch():
  m = linear_cka.MinibatchCKA(["good", "flat"])
  with pytest.raises(ValueError, match="batch of 3 examples.*at least 4"):
    m.update({"good": np.ones((3, 2)), "flat": np.ones((3, 2))})
  with pytest.raises(KeyError, match=r"lacks layer\(s\) \['flat'\]"):
    m.update({"good": np.ones((8, 2))})
  with pytest.raises(ValueError, match="disagree on the batch size"):
    m.update({"good": np.ones((8, 2)), "flat": np.ones((9, 2))})
  with pytest.raises(ValueError, match="before any update"):
    m.result()
  rng = np.random.default_rng(4)
  m.update({"good": rng.standard_normal((8, 2)), "flat": np.ones((8, 2))})
  with pytest.raises(FloatingPointError, match="layer 'flat'.*constant"):
    m.result()
  bad = np.eye(2)
  bad[1, 1] = np.nan
  with pytest.raises(FloatingPointError, match="layer 'b'.*NaN"):
    linear_cka.cka_from_hsic(bad, ["a", "b"])
  with pytest.raises(ValueError, match="needs at least 4"):
    linear_cka.linear_cka(np.ones((3, 2)), np.ones((3, 2)), debiased=True)


def test_float32_accuracy_with_a_large_feature_offset(gram_path):
  """Features with a large common offset (like post-residual activations): a plain
  float32 Gram loses most of the CKA to cancellation; centring features first
  keeps the error within the float32 bound of the centred problem."""
  rng = np.random.default_rng(5)
  n, d = 32, 256
  x = (1000 + rng.standard_normal((n, d))).astype(np.float32)
  y = (x + rng.standard_normal((n, d))).astype(np.float32)
  # Reference on exactly the float32 inputs, centred in float64 (exact invariance).
  xs, ys = x.astype(np.float64), y.astype(np.float64)
  ref = np_minibatch_cka([xs - xs.mean(0)], [ys - ys.mean(0)])
  bound = cka_bound(n, d)
  m = linear_cka.MinibatchCKA(["x"], ["y"])
  m.update({"x": x}, {"y": y})
  assert_close(m.result().xy[0, 0], ref, bound, "centred Gram, offset 1000")
  # The test can tell: the uncentred float32 Gram misses by far more than the bound.
  k, l = (grams.center_unbiased(jnp.matmul(a, a.T, precision=grams.HIGHEST)) for a in (x, y))
  dot = lambda a, b: jnp.vdot(a.ravel(), b.ravel(), precision=grams.HIGHEST)
  plain = float(dot(k, l) / jnp.sqrt(dot(k, k) * dot(l, l)))
  assert abs(plain - ref) > 100 * bound, (plain, ref, bound)
