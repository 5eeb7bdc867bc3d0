"""CKA inputs that would give meaningless numbers: constant layers, nothing processed."""

from __future__ import annotations

import numpy as np
import pytest

from support import upstream_files as uf
from support.library_sums import hsic_matrix
from support.numerics import U32, assert_close, cka_bound, worst
from vitcnn_jax import jobs
from vitcnn_jax.inputs import zoo
from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import layer_checks
from vitcnn_jax.similarity import linear_cka
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import registry
from vitcnn_jax.similarity import scales


def test_identical_images_make_a_constant_layer_an_error_not_cka_one():
  rng = np.random.default_rng(0)
  same = np.repeat(rng.standard_normal((1, 64)).astype(np.float32) * 10 + 3, 16, axis=0)
  m = linear_cka.MinibatchCKA(["varied", "constant"])
  m.update({"varied": rng.standard_normal((16, 64)).astype(np.float32), "constant": same})
  assert abs(float(hsic_matrix([same])[0, 0])) < 1e-20  # rounding, not zero
  with pytest.raises(FloatingPointError, match=r"layer 'constant' is constant over the examples"
                                               r".*are the images identical or blank"):
    m.result()


def test_a_small_but_real_variation_is_not_mistaken_for_a_constant():
  """Centred features are exact in float32 here, so tiny variation on a large
  offset keeps its CKA (the threshold sits far below any real layer)."""
  rng = np.random.default_rng(1)
  base = rng.standard_normal((16, 32)).astype(np.float32)
  m = linear_cka.MinibatchCKA(["a", "b"])
  m.update({"a": base, "b": (1000.0 + 0.1 * base).astype(np.float32)})
  assert m.result().xx[0, 1] > 0.99


def test_an_all_zero_hsic_says_nothing_was_processed():
  with pytest.raises(FloatingPointError, match="no minibatch of at least 4 examples"):
    linear_cka.cka_from_hsic(np.zeros((2, 2)), ["a", "b"])


def test_the_cka_job_on_identical_images_fails_naming_the_layer(tmp_path):
  """A folder of one image copied 16 times: every layer is constant."""
  from PIL import Image
  from configs import cka_vit_resnet
  folder = tmp_path / "same"
  folder.mkdir()
  img = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
  for i in range(16):
    Image.fromarray(img).save(folder / f"{i:02d}.png")
  vit = uf.save(tmp_path / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8))
  config = cka_vit_resnet.get_config("b16_r50,examples=16,batch=8,repeats=1")
  del config.models["resnet"]
  config.models.vit.checkpoint = vit
  config.data = zoo.data_spec("folder", path=str(folder))
  with pytest.raises(FloatingPointError, match=r"layer 'block00/ln1' is constant over the examples"):
    jobs.run(config, str(tmp_path / "wd"))


@pytest.mark.parametrize("scale", [1e15, 1e-15, 2.0 ** 100, 2.0 ** -100])
def test_cka_does_not_depend_on_the_features_scale(scale):
  rng = np.random.default_rng(2)
  x = rng.standard_normal((32, 40)).astype(np.float32)
  y = (x @ rng.standard_normal((40, 24)) + rng.standard_normal((32, 24))).astype(np.float32)
  want = linear_cka.linear_cka(x, y)
  assert 0.3 < want < 0.99
  # Scaling by a power of two is exact; 1e15 moves each entry by one rounding.
  tol = 4 * layer_checks.U32 * 40 if scale in (1e15, 1e-15) else 0.0
  assert abs(linear_cka.linear_cka(x * np.float32(scale), y) - want) <= tol + 1e-12
  big = linear_cka.MinibatchCKA(["x", "y"])
  ref = linear_cka.MinibatchCKA(["x", "y"])
  for i in (0, 16):
    big.update({"x": x[i:i + 16] * np.float32(scale), "y": y[i:i + 16]})
    ref.update({"x": x[i:i + 16], "y": y[i:i + 16]})
  assert abs(big.result().xx[0, 1] - ref.result().xx[0, 1]) <= tol + 1e-12


def _stack(x: np.ndarray, mask: np.ndarray, prescale: bool) -> registry.Stack:
  """One layer's `registry.Stack` on the host, its parts made as the features are or prescaled."""
  import jax
  made = jax.jit(lambda a, m: registry.Stack.of_activations([a], m, prescale=prescale))
  return jax.device_get(made(x, mask))


def test_a_gram_made_as_is_equals_one_made_from_rescaled_features_exactly(gram_path):
  """A layer in range gives the same bits made as its features are and prescaled
  (every scaling a power of two); the same features times 2^100 (whose Gram,
  made as they are, would overflow) say `UNFIT` made as they are, and prescaled
  give the same arrays 100 exponents up. Each against float64."""
  x = np.random.default_rng(5).standard_normal((12, 3, 7)).astype(np.float32) * 3 + 1
  mask = np.ones(12, np.float32)
  mask[9:] = 0
  as_is, first = _stack(x, mask, False), _stack(x, mask, True)
  big, big_first = _stack(x * np.float32(2.0 ** 100), mask, False), _stack(x * np.float32(2.0 ** 100), mask, True)
  assert not grams.needs_prescaling(as_is.e) and grams.needs_prescaling(big.e)
  assert int(big_first.e[0]) == int(as_is.e[0]) + 100
  for field in ("gram", "proj", "rowmean", "mean_sq", "mean_4th", "features"):
    for other in (first, big_first):
      assert np.array_equal(getattr(other, field), getattr(as_is, field)), field
  e0, g0, m0 = int(as_is.e[0]), as_is.gram[0], float(as_is.mean_sq[0])
  want = x[:9].reshape(9, -1).astype(np.float64)
  mean = want.mean(0)
  # Each mean entry a sum of 9 terms and a division (off by d <= 10 u of the mean of |x|),
  # so its square by 2 |mean| d + d²; then squared and 21 squares summed (<= 23 u of their sum).
  d = 10 * U32 * np.abs(want).mean(0)
  bound = np.sum(2 * np.abs(mean) * d + d ** 2) + 23 * U32 * np.sum(mean ** 2)
  assert abs(np.ldexp(m0, 2 * e0) - np.sum(mean ** 2)) <= bound, "the mean's squared norm"
  # Its fourth powers: each entry's off by at most (|mean| + d)^4 - mean^4, then squared
  # twice (2 roundings) and 21 summed (20 u).
  bound = np.sum((np.abs(mean) + d) ** 4 - mean ** 4) + 24 * U32 * np.sum(mean ** 4)
  assert abs(np.ldexp(float(as_is.mean_4th[0]), 4 * e0) - np.sum(mean ** 4)) <= bound, "fourth powers"
  want = want - mean
  assert_close(np.ldexp(g0.astype(np.float64), 2 * e0)[:9, :9], want @ want.T,
               cka_bound(9, 21) * np.abs(want).max() ** 2 * 21, "Gram")
  assert not np.any(g0[9:]) and not np.any(g0[:, 9:])  # padding rows


@pytest.mark.parametrize("value", [0.0, 3.0, 2.0 ** 90], ids=["zeros", "three", "2^90"])
def test_a_layer_the_same_on_every_row_is_in_range_as_it_is(value):
  """Every valid row the same (its centred Gram exact zeros: a blank image's
  layer, a dead unit): in range made as it is, at its mean's scale, not run
  again on every minibatch; the same bits as prescaled, its mean's sums exact."""
  x = np.full((8, 5), value, np.float32)
  mask = np.ones(8, np.float32)
  as_is, first = _stack(x, mask, False), _stack(x, mask, True)
  assert not grams.needs_prescaling(as_is.e)
  for field in ("gram", "proj", "rowmean", "mean_sq", "mean_4th", "e"):
    assert np.array_equal(getattr(first, field), getattr(as_is, field)), field
  assert not np.any(as_is.gram)
  e = int(as_is.e[0])
  assert np.ldexp(float(as_is.mean_sq[0]), 2 * e) == 5 * value ** 2
  assert np.ldexp(float(as_is.mean_4th[0]), 4 * e) == 5 * value ** 4


@pytest.mark.parametrize("slice_bytes", [None, 4], ids=["one slice", "slices of one feature"])
def test_an_exactly_centred_large_feature_keeps_the_fourth_moment_finite(slice_bytes, monkeypatch):
  """A feature constant at 2^60 (its mean exact, so it centres to zero) beside one
  that varies by 1: scaled by the Gram alone the mean's fourth power would
  overflow float32. Made as it is, the layer says `UNFIT` (its mean beyond
  `MEAN_BITS`); prescaled, by its largest |x|, its fourth moment is finite and
  right."""
  if slice_bytes:
    monkeypatch.setattr(grams, "CACHE_SLICE_BYTES", slice_bytes)
  x = np.stack([np.full(8, 2.0 ** 60), np.arange(8) % 3], axis=1).astype(np.float32)
  assert grams.needs_prescaling(_stack(x, np.ones(8, np.float32), False).e)
  got = scales.unscale({k: np.asarray(v) for k, v in hsic.activation_sums([x]).items()}, measures.SCALES)
  want = 8 * np.sum(x.astype(np.float64).mean(0) ** 4)
  assert np.isfinite(got["moments"]).all()
  assert abs(got["moments"][0] / want - 1) < 8 * layer_checks.U32


def test_linear_cka_refuses_nan_one_example_and_constants():
  x = np.random.default_rng(3).standard_normal((8, 5)).astype(np.float32)
  bad = x.copy()
  bad[2, 3] = np.nan
  with pytest.raises(ValueError, match="x holds 1 NaN or inf values"):
    linear_cka.linear_cka(bad, x)
  with pytest.raises(ValueError, match="needs at least 2 examples, got 1"):
    linear_cka.linear_cka(x[:1], x[:1])
  with pytest.raises(FloatingPointError, match="y is constant over the examples"):
    linear_cka.linear_cka(x, np.repeat(x[:1], 8, axis=0))


def test_devices_with_different_scales_share_exponents_exactly():
  """8 devices whose rows differ in scale by up to 2^70: the psum of the results
  brought to the shared exponents equals the float64 sum of each device's own."""
  import jax
  from jax.sharding import PartitionSpec as P
  from vitcnn_jax.run import parallel
  mesh = parallel.mesh()
  n_dev = jax.device_count()
  rng = np.random.default_rng(4)
  x = rng.standard_normal((n_dev, 8, 20)).astype(np.float32)
  x *= (2.0 ** (10 * np.arange(n_dev)))[:, None, None].astype(np.float32)
  y = rng.standard_normal((n_dev, 8, 12)).astype(np.float32)

  def local(a, b):
    out = hsic.activation_sums([a, b], None, parallel.AXIS)
    return {k: (jax.lax.pmax(v, parallel.AXIS) if k == "log2_scale" else jax.lax.psum(v, parallel.AXIS))
            for k, v in out.items()}

  f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(parallel.AXIS), P(parallel.AXIS)),
                            out_specs=P()))
  got = scales.unscale(jax.device_get(f(x.reshape(-1, 20), y.reshape(-1, 12))), measures.SCALES)
  want = sum(scales.unscale(jax.device_get(jax.jit(hsic.activation_sums)([x[d], y[d]])), measures.SCALES)["hsic"]
             for d in range(n_dev))
  scale = np.sqrt(np.outer(np.diag(want), np.diag(want)))
  # Each device's term: two float32 compilations of one HSIC (cka_bound relative to
  # the scale, by Cauchy-Schwarz); then an 8-term float32 psum, exact shifts aside.
  assert_close(got["hsic"] / scale, want / scale, cka_bound(8, 20) + worst(n_dev), "shared exponents")
