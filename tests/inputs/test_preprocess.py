"""Preprocessing against torch's resize and analytic cases."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require
from vitcnn_jax.inputs import preprocess

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
  np.testing.assert_allclose(np.asarray(preprocess.normalize(x, "resize")),
                             [[-1.0, (127 - 127.5) / 127.5, 1.0]], atol=1e-7)
  rgb = np.array([[[0, 128, 255]]], np.uint8)
  got = np.asarray(preprocess.normalize(rgb, "bicubic_crop1_clip"))
  want = (np.array([0, 128, 255]) / 255 - np.array([0.48145466, 0.4578275, 0.40821073])) / \
      np.array([0.26862954, 0.26130258, 0.27577711])
  np.testing.assert_allclose(got[0, 0], want, rtol=4 * np.finfo(np.float32).eps, atol=1e-6)


@pytest.mark.parametrize("crop_pct,mean", [(0.875, "imagenet"), (1.0, "clip"), (0.9, "imagenet")])
@pytest.mark.parametrize("shape", [(300, 400), (413, 250), (100, 100), (40, 60)])
def test_timm_policies_match_timms_eval_transform(crop_pct, mean, shape):
  """timm's eval transform (PIL bicubic resize, center crop, normalise) as the
  reference. PIL's filter weights are fixed-point (22 bits): a sum that lands
  within about 1e-5 of a rounding boundary may round the other way, so a rare
  pixel may differ by one grey level (1/255/std after normalising)."""
  from support import torchvision_cpu  # test-only: timm imports torchvision
  torchvision_cpu.declare_detection_ops()
  timm_data = require("timm.data")
  from PIL import Image  # test-only, with timm
  img = np.random.default_rng(5).integers(0, 256, (*shape, 3), dtype=np.uint8)
  stats = {"imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
           "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))}
  tf = timm_data.create_transform(input_size=(3, 64, 64), interpolation="bicubic", crop_pct=crop_pct,
                                  mean=stats[mean][0], std=stats[mean][1], is_training=False)
  ref = tf(Image.fromarray(img)).numpy().transpose(1, 2, 0)
  policy = f"bicubic_crop{crop_pct:g}_{mean}"
  ours = np.asarray(preprocess.normalize(preprocess.preprocess_image(img, 64, policy), policy))
  level = 1 / 255 / min(stats[mean][1])
  assert ours.shape == ref.shape == (64, 64, 3)
  assert np.abs(ours - ref).max() <= 1.01 * level
  assert np.mean(np.abs(ours - ref) > level / 2) < 0.005  # all but a rare pixel agree exactly


@pytest.mark.parametrize("shape", [(300, 400), (256, 256), (500, 333)])
def test_squash_crop_caffe_matches_open_nsfws_pipeline(shape):
  """open_nsfw's preprocessing as its package writes it (PIL bilinear to 256 x 256,
  the crop at 16, BGR minus (104, 117, 123)) without its JPEG round trip. Within
  one grey level: PIL rounds each of its two passes to uint8, and for some shapes
  (taller than wide here) it runs them in the other order than ours, which moves
  a rounding in about a fifth of the pixels; a wrong filter, crop or mean moves many
  pixels by several levels. The photo crops the analyses use are square: no resize."""
  from PIL import Image
  img = np.random.default_rng(6).integers(0, 256, (*shape, 3), dtype=np.uint8)
  squashed = Image.fromarray(img).resize((256, 256), resample=Image.Resampling.BILINEAR)
  bgr = np.asarray(squashed.crop((16, 16, 240, 240)), np.float32)[..., ::-1] - [104, 117, 123]
  policy = "squash_crop0.875_caffe"
  ours = np.asarray(preprocess.normalize(preprocess.preprocess_image(img, 224, policy), policy))
  assert ours.shape == (224, 224, 3)
  diff = np.abs(ours[..., ::-1] - bgr)
  assert diff.max() <= 1 + 1e-4 and np.mean(diff > 0.5) < (0.25 if shape[0] > shape[1] else 0.005)


def test_area_policy_resizes_the_longer_side_and_pads_centred():
  img = np.random.default_rng(7).integers(0, 256, (448, 224, 3), dtype=np.uint8)
  out = preprocess.preprocess_image(img, 224, "area_imagenet")
  block = np.round(img.reshape(224, 2, 112, 2, 3).mean(axis=(1, 3)))  # 2 x 2 means, rounded
  np.testing.assert_array_equal(out[:, 56:168], block)
  assert not out[:, :56].any() and not out[:, 168:].any()  # black padding, centred


def test_policy_names_are_checked():
  for good in ("resize", "resize_small_crop", "bicubic_crop0.875_imagenet", "bicubic_crop1_clip",
               "bicubic_crop1.0_half", "squash_crop0.875_caffe", "area_imagenet"):
    preprocess.check_policy(good)
  for bad in ("bicubic", "bicubic_crop1.5_imagenet", "bicubic_crop0.9_imagnet", "crop0.9"):
    with pytest.raises(ValueError, match=rf"policy={bad!r} is not one of .*bicubic_crop0.875"):
      preprocess.check_policy(bad)
  assert "mean (0.485, 0.456, 0.406)" in preprocess.describe("bicubic_crop0.875_imagenet")


def test_bad_input():
  with pytest.raises(ValueError, match="shape"):
    preprocess.preprocess_image(np.zeros((4, 4, 2)), 8)
  with pytest.raises(ValueError, match="policy='crop' is not one of"):
    preprocess.preprocess_image(np.zeros((4, 4, 3)), 8, "crop")
