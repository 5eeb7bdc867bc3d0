"""Every analysis on the families that transformers' folders bring: a RoPE ViT
with registers (DINOv3), a Swin and a ResNet, each saved by transformers, each
analysis where its definition applies (a Swin's attention in its windows, measured
on the image; per-token analyses refuse its maps)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import NO_FIGURES
from support import hf_ref
import vitcnn_jax as vj

T = hf_ref.transformers
N = 16


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  root = tmp_path_factory.mktemp("hf_analyses")
  vit = T.DINOv3ViTModel(T.DINOv3ViTConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                           intermediate_size=96, image_size=32, patch_size=8,
                                           num_register_tokens=2))
  resnet = T.ResNetModel(T.ResNetConfig(embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1]))
  swin = T.SwinModel(T.SwinConfig(image_size=32, patch_size=2, embed_dim=8, depths=[2, 2],
                                  num_heads=[1, 2], window_size=4))
  return {"vit": {"checkpoint": hf_ref.save(hf_ref.randomized(vit), root / "vit")},
          "swin": {"checkpoint": hf_ref.save(hf_ref.randomized(swin, 2), root / "swin")},
          "resnet": {"checkpoint": hf_ref.save(hf_ref.randomized(resnet, 1), root / "resnet"),
                     "resolution": 32}}


@pytest.fixture(scope="module")
def images():
  rng = np.random.default_rng(0)
  return rng.integers(0, 256, (N, 32, 32, 3)).astype(np.uint8), np.arange(N) % 2


def test_every_analysis_runs_on_a_rope_vit_with_registers_a_swin_and_a_transformers_resnet(
    models, images):
  grey, labels = images
  small = dict(batch_size=8, num_examples=N, **NO_FIGURES)
  r = vj.cka(models, grey, layers="blocks", repeats=1, **small)
  np.testing.assert_allclose(np.diag(r["cka_vit_vit"]), 1, atol=1e-5)
  assert np.isfinite(r["cka_resnet_vit"]).all()
  assert np.isfinite(r["cka_swin_vit"]).all() and r["cka_swin_swin"].shape == (4, 4)
  r = vj.skip_ratio(models, grey, **small)
  assert r["vit_ratio"].shape == (2, 2, 1 + 2 + 16) and (r["vit_ratio"] > 0).all()
  assert np.isfinite(r["swin_ratio"]).all() and (r["swin_ratio"] > 0).all()
  assert r.summary["models"]["vit"]["prefix_tokens"] == ["cls", "reg", "reg"]
  r = vj.pc_share(models, grey, layers="blocks", **small)
  assert r.summary["models"].keys() == models.keys()
  r = vj.receptive_field(models, grey, num_examples=4, batch_size=4, **NO_FIGURES)
  assert r["vit_maps"].shape[1:] == (32, 32) and np.isfinite(r["resnet_maps"]).all()
  assert np.isfinite(r["swin_maps"]).all() and r["swin_maps"].shape[1:] == (32, 32)
  r = vj.attention_distance({"vit": models["vit"], "swin": models["swin"]}, grey, **small)
  d = r["mean_distance_vit"]  # blocks x heads, in pixels: between one patch and the grid's extent
  assert d.shape == (2, 3) and (d > 0).all() and (d < 32 * np.sqrt(2)).all()
  d, s = r["mean_distance_swin"], r.summary["models"]["swin"]
  # Stages of 1 and 2 heads (the missing one NaN); within 4x4 windows of 2 then 4 px tokens.
  assert d.shape == (4, 2) and np.isnan(d[:2, 1]).all() and s["heads"] == [1, 1, 2, 2]
  assert [len(h) for h in s["mean_distance_px"]] == [1, 1, 2, 2] and s["windowed"]
  assert (d[:2, 0] < 3 * 2 * np.sqrt(2)).all() and (d[2:] < 3 * 4 * np.sqrt(2)).all()
  assert s["uniform_ceiling_px"][2] == pytest.approx(2 * s["uniform_ceiling_px"][0])
  r = vj.localization({"vit": models["vit"]}, grey, **small)
  assert r.summary["prefix_tokens"] == ["cls", "reg", "reg"]
  r = vj.head_subsets({"vit": {**models["vit"], "capture": "all"},
                       "resnet": {**models["resnet"], "capture": "block1/**"}}, grey, **small)
  assert np.isfinite(r["cka"]).all()
  r = vj.head_subsets({"vit": {**models["swin"], "capture": "all"},
                       "resnet": {**models["resnet"], "capture": "block1/**"}}, grey, block=2,
                      subset_size=1, **small)
  assert np.isfinite(r["cka"]).all() and r.summary["subsets"] in ([[0], [1]], [[1], [0]])
  r = vj.linear_probe(models, grey, labels=labels, test=(grey, labels), layers="blocks",
                      batch_size=8, shots=2, seeds=1, **NO_FIGURES)
  assert set(r.summary["models"]) == set(models)


def test_per_token_analyses_refuse_a_swin(models, images):
  with pytest.raises(ValueError, match=r"models\['vit'\]: this analysis needs a model with tokens, "
                                       r"and a Swin has none"):
    vj.localization({"vit": models["swin"]}, images[0], batch_size=8, num_examples=N)
