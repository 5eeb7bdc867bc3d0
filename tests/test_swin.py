"""Swin Transformers as timm and transformers build them: tiny random models
saved in each layout (timm's state dict with its config.json; transformers'
save_pretrained folder), loaded by us with nothing assumed, matching each
upstream at every stage's output and at the logits."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import hf_ref
import timm_ref
from conftest import compiled
from numerics import VIT_ROUNDINGS, assert_close, network
from vitcnn_jax import checkpoints

torch, timm, T = timm_ref.torch, timm_ref.timm, hf_ref.transformers
TOL = network(VIT_ROUNDINGS)
# 16x16 then 8x8 maps in 4x4 windows: shifted windows and their mask in both stages.
TINY = dict(img_size=32, patch_size=2, embed_dim=8, depths=(2, 2), num_heads=(1, 2), window_size=4)
POINTS = ["stage0/block01/out", "stage1/block01/out"]


def _images() -> np.ndarray:
  return np.random.default_rng(5).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("swin")
  tm = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=5, **TINY)
  tm = hf_ref.randomized(tm, 0)
  timm.models.save_for_hf(tm, str(root / "timm"), safe_serialization=True)
  hm = hf_ref.randomized(T.SwinForImageClassification(T.SwinConfig(
      num_labels=5, image_size=32, patch_size=2, embed_dim=8, depths=[2, 2], num_heads=[1, 2],
      window_size=4)), 1)
  return {"timm": (str(root / "timm"), tm),
          "hf": (hf_ref.save(hm, root / "hf"), hm)}


def _reference(name: str, model, x: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
  pix = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
  with torch.no_grad():
    if name == "timm":
      y, stages = model.patch_embed(pix), []
      for layer in model.layers:
        y = layer(y)
        stages.append(y.numpy())
      return stages, model(pix).numpy()
    out = model(pixel_values=pix, output_hidden_states=True,
                output_hidden_states_before_downsampling=True)
    return [h.numpy().transpose(0, 2, 3, 1) for h in out.reshaped_hidden_states[1:]], out.logits.numpy()


@pytest.mark.parametrize("name", ["timm", "hf"])
def test_swin_matches_its_upstream_at_every_stage(folders, name, caplog):
  folder, model = folders[name]
  with caplog.at_level(logging.WARNING, "vitcnn_jax"):
    c = checkpoints.load(folder)
  assert not c.assumed and "assumed" not in caplog.text, (c.assumed, caplog.text)
  m = c.model
  assert (m.family, m.depths, m.heads, m.window, m.embed_dim, m.image_size) == (
      "swin", (2, 2), (1, 2), 4, 8, 32)
  x = _images()
  stages, logits = _reference(name, model, x)
  out, points = compiled(m, c.params, x, capture=POINTS)
  for point, ref in zip(POINTS, stages):
    assert_close(points[point], ref, TOL * float(np.abs(ref).max()), f"{name} {point}")
  assert_close(out, logits, TOL * float(np.abs(logits).max()), f"{name} logits")


def test_attention_analyses_refuse_a_swin_by_name(folders):
  import vitcnn_jax as vj  # noqa: PLC0415
  images = np.zeros((8, 32, 32, 3), np.uint8)
  with pytest.raises(ValueError, match=r"needs a model with attention it can read.*Swin's is "
                                       r"windowed, which it does not read yet"):
    vj.attention_distance({"vit": {"checkpoint": folders["timm"][0]}}, images, batch_size=8,
                          num_examples=8)


def test_a_map_smaller_than_the_window_is_refused(folders):
  """At 16 px the second stage's map (4x4) still fits the window; at 8 px it is 2x2."""
  c = checkpoints.load(folders["timm"][0], resolution=16)
  out, _ = compiled(c.model, c.params, np.zeros((1, 16, 16, 3), np.float32))
  assert np.isfinite(out).all()
  with pytest.raises(ValueError, match=r"2x2 map is smaller than the 4x4 window"):
    c.model.apply({"params": c.params}, np.zeros((1, 8, 8, 3), np.float32))
