"""Preprocessing against torch's resize and analytic cases."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require
from vitcnn_jax import preprocess

torch = require("torch")


def test_bilinear_matches_torch_half_pixel_resize():
  img = np.random.default_rng(0).uniform(0, 255, (37, 53, 3))
  for size in [(16, 16), (64, 80), (37, 20)]:
    ours = preprocess.resize(img, size, "bilinear")
    t = torch.from_numpy(img.transpose(2, 0, 1)[None])
    ref = torch.nn.functional.interpolate(t, size=size, mode="bilinear", align_corners=False,
                                          antialias=False)[0].numpy().transpose(1, 2, 0)
    np.testing.assert_allclose(ours, ref, atol=1e-9)


def test_area_is_block_mean_for_integer_factors_and_exact_overlap_otherwise():
  img = np.random.default_rng(1).uniform(0, 255, (12, 18, 3))
  ours = preprocess.resize(img, (4, 6), "area")
  np.testing.assert_allclose(ours, img.reshape(4, 3, 6, 3, 3).mean(axis=(1, 3)), atol=1e-9)
  # 3 -> 2 pixels: each output averages 1.5 input pixels.
  row = np.array([0.0, 30.0, 90.0])[None, :, None]
  np.testing.assert_allclose(preprocess.resize(row, (1, 2), "area")[0, :, 0],
                             [(0 + 0.5 * 30) / 1.5, (0.5 * 30 + 90) / 1.5])


def test_policies_shapes_dtypes_and_gray_to_rgb():
  gray = np.random.default_rng(2).integers(0, 256, (28, 28), dtype=np.uint8)
  out = preprocess.preprocess_image(gray, 32, "resize")
  assert out.shape == (32, 32, 3) and out.dtype == np.uint8
  assert (out[..., 0] == out[..., 2]).all()
  wide = np.random.default_rng(3).integers(0, 256, (300, 500, 3), dtype=np.uint8)
  out = preprocess.preprocess_image(wide, 224, "resize_small_crop")
  assert out.shape == (224, 224, 3) and out.dtype == np.uint8
  same = preprocess.preprocess_image(wide[:224, :224], 224, "resize")
  np.testing.assert_array_equal(same, wide[:224, :224])


def test_resize_small_crop_is_the_central_crop_of_the_short_side_resize():
  img = np.random.default_rng(4).integers(0, 256, (128, 256, 3), dtype=np.uint8)
  out = preprocess.preprocess_image(img, 112, "resize_small_crop")  # short side -> 128
  np.testing.assert_array_equal(out, img[8:120, 72:184])


def test_value_range():
  x = np.array([[0, 127, 255]], np.uint8)
  np.testing.assert_allclose(np.asarray(preprocess.to_model_range(x)),
                             [[-1.0, (127 - 127.5) / 127.5, 1.0]], atol=1e-7)


def test_bad_input():
  with pytest.raises(ValueError, match="shape"):
    preprocess.preprocess_image(np.zeros((4, 4, 2)), 8)
  with pytest.raises(ValueError, match="Unknown preprocessing policy 'crop'"):
    preprocess.preprocess_image(np.zeros((4, 4, 3)), 8, "crop")
