"""timm hub folders (timm's `save_for_hf`: config.json beside model.safetensors):
RoPE ViTs in timm's Eva layout (DINOv3, EVA-02, the Perception Encoder), a CLIP
ViT, a ResNet and a ConvNeXt, built by timm's own model functions and loaded by us
with nothing assumed, matching timm at every block and at the output."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest

from conftest import compiled, load_stating_everything
from support import timm_ref
from support.numerics import VIT_ROUNDINGS, assert_close, network
from vitcnn_jax import checkpoints
from vitcnn_jax.models.formats import timm_config

torch, timm = timm_ref.torch, timm_ref.timm
TOL = network(VIT_ROUNDINGS)
TINY = dict(embed_dim=48, depth=2, num_heads=3, img_size=32, patch_size=8)

# name -> (timm model function, its arguments, what our model shows)
MODELS = {
    "dinov3": ("vit_small_patch16_dinov3", dict(num_classes=5),
               dict(rope="dinov3", num_registers=4, ln_eps=1e-5, pool="gap", layer_scale=True)),
    "dinov3_qkvb_swiglu": ("vit_small_plus_patch16_dinov3_qkvb", dict(global_pool="token"),
                           dict(rope="dinov3", mlp="swiglu", pool="token")),
    "eva02_tiny": ("eva02_tiny_patch14_224", dict(num_classes=5),
                   dict(rope="eva02", rope_ref=16, mlp="swiglu", pool="gap", fc_norm=True, ln_eps=1e-6)),
    "eva02_base": ("eva02_base_patch14_224", dict(num_classes=0),
                   dict(rope="eva02", mlp="swiglu", mlp_norm=True, num_classes=None)),
    "eva02_clip": ("eva02_base_patch16_clip_224", dict(num_classes=5),
                   dict(rope="eva02", rope_ref=16, attn_norm=True, mlp_norm=True, pool="token")),
    "pe_core": ("vit_pe_core_base_patch16_224", dict(num_classes=8),
                dict(rope="pe", rope_ref=14, rope_offset=1.0, pool="map", map_heads=8,
                     map_prefix=True, pre_norm=True, patch_bias=False, ln_eps=1e-5)),
    "clip_quickgelu": ("vit_base_patch16_clip_quickgelu_224", dict(num_classes=4),
                       dict(gelu="quick", ln_eps=1e-5, pre_norm=True)),
}


def _images(size: int = 32) -> np.ndarray:
  return np.random.default_rng(2).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)


def _randomized(model):
  g = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.ndim == 1 or "token" in name:
        p.add_(0.2 * torch.randn(p.shape, generator=g))
  return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("timm_hub")
  out = {}
  for name, (fn, kwargs, _) in MODELS.items():
    model = _randomized(timm.create_model(fn, pretrained=False, **TINY, **kwargs))
    timm.models.save_for_hf(model, str(root / name), safe_serialization=True)
    out[name] = (str(root / name), model)
  return out


def _blocks(model, x: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
  """timm's block outputs (hooks) and output."""
  outs = []
  hooks = [b.register_forward_hook(lambda m, i, o: outs.append(o.numpy())) for b in model.blocks]
  with torch.no_grad():
    final = model(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
  for h in hooks:
    h.remove()
  return outs, final


@pytest.mark.parametrize("name", sorted(MODELS))
def test_timm_hub_folder_matches_timm_with_nothing_assumed(folders, name, caplog):
  folder, model = folders[name]
  c = load_stating_everything(folder, caplog, MODELS[name][2])
  assert c.model.num_heads == 3 and "model_args" in c.evidence["num_heads"]
  assert "config.json" in c.policy_from
  x = _images()
  blocks, final = _blocks(model, x)
  m = c.model
  out, points = compiled(m, c.params, x, capture="block*/out")
  for i, ref in enumerate(blocks):
    assert_close(points[f"block{i:02d}/out"], ref, TOL * float(np.abs(ref).max()), f"{name} block {i}")
  assert_close(out, final, TOL * float(np.abs(final).max()), f"{name} output")
  if m.attn_norm:  # its heads are normed together: no head has a contribution of its own
    with pytest.raises(ValueError, match="joined outputs"):
      m.head_projection(c.params, 0)


def test_a_dinov3_file_without_config_json_assumes_and_says_so(folders, tmp_path, caplog):
  folder, _ = folders["dinov3"]
  shutil.copy(os.path.join(folder, "model.safetensors"), tmp_path / "w.safetensors")
  with caplog.at_level(logging.WARNING, "vitcnn_jax"):
    c = checkpoints.load(str(tmp_path / "w.safetensors"), num_heads=3)
  assert c.fmt == "timm_eva" and {"ln_eps", "rope_theta", "pool"} <= set(c.assumed)
  assert "assumed rope_theta=100.0" in caplog.text


def test_other_resolutions_recompute_the_rotary_embedding_as_timm(folders):
  folder, model = folders["dinov3"]
  x = _images(48)
  _, final = _blocks(model, x)  # timm's DINOv3 is dynamic: RoPE for the 6x6 grid
  c = checkpoints.load(folder, resolution=48)
  out, _ = compiled(c.model, c.params, x)
  assert_close(out, final, TOL * float(np.abs(final).max()), "48 px")


@pytest.mark.parametrize("fn", ["vit_small_patch16_dinov3", "vit_base_patch16_dinov3", "eva02_large_patch14_448",
                                "vit_pe_core_large_patch14_336", "eva02_small_patch14_336",
                                "vit_huge_plus_patch16_dinov3", "vit_7b_patch16_dinov3",
                                "vit_base_patch16_224", "vit_large_patch14_clip_quickgelu_224",
                                "vit_so400m_patch14_siglip_224", "vit_medium_patch16_gap_256",
                                "vit_base_patch16_siglip_224", "vit_huge_patch14_clip_224"])
def test_the_architecture_table_is_timms(fn):
  """What `timm_config.architecture` says of a model function equals what timm
  builds (on the meta device: no memory)."""
  with torch.device("meta"):
    model = timm.create_model(fn, pretrained=False)
  said = timm_config.architecture(fn)
  block = model.blocks[0]
  assert said["num_heads"] == block.attn.num_heads, fn
  assert said["ln_eps"] == block.norm1.eps, fn
  act = type(block.mlp.act).__name__ if hasattr(block.mlp, "act") else "SiLU"
  gelu = {"GELU": "tanh" if getattr(block.mlp.act, "approximate", "none") == "tanh" else "exact",
          "QuickGELU": "quick", "GELUTanh": "tanh", "SiLU": said.get("gelu")}[act]
  assert said.get("gelu", gelu) == gelu, (fn, act)  # SigLIP's is left assumed


@pytest.mark.parametrize("fn,kwargs,family", [
    ("resnet18", dict(channels=(8, 16, 24, 32), stem_width=8), "resnet"),
    ("convnext_tiny", dict(depths=(1, 1, 1, 1), dims=(8, 16, 24, 32)), "convnext")])
def test_timm_cnn_hub_folders_load_with_nothing_assumed(fn, kwargs, family, tmp_path, caplog):
  """A timm hub folder of a ResNet or ConvNeXt: its config.json's architecture and
  pretrained_cfg say what the state dict cannot (stride, BatchNorm eps, input size,
  preprocessing); the same file alone assumes them, and says so."""
  model = _randomized(timm.create_model(fn, pretrained=False, num_classes=3, **kwargs))
  timm.models.save_for_hf(model, str(tmp_path / "hub"), safe_serialization=True)
  with caplog.at_level(logging.WARNING, "vitcnn_jax"):
    c = checkpoints.load(str(tmp_path / "hub"))
  assert c.model.family == family and not c.assumed and "assumed" not in caplog.text
  assert c.model.image_size == 224 and "config.json" in c.policy_from
  x = _images(64)
  with torch.no_grad():
    ref = model(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
  out, _ = compiled(c.model, c.params, x)
  assert_close(out, ref, network(20_000) * float(np.abs(ref).max()), fn)
  shutil.copy(tmp_path / "hub" / "model.safetensors", tmp_path / "w.safetensors")
  assert "image_size" in checkpoints.load(str(tmp_path / "w.safetensors")).assumed


def test_a_size_word_of_another_width_leaves_the_heads_assumed():
  """`vit_giant_patch14_dinov2` is 1536 wide with 24 heads, where timm's plain
  `giant` ViTs have 16 at 1408: the table's word does not decide against the width."""
  from vitcnn_jax.models.formats import base, hf_folder
  meta = hf_folder.Meta({"architecture": "vit_giant_patch14_dinov2"}, {}, "f")
  s = timm_config.TimmConfig(base.Keys({}, "f", "timm", meta=meta), "timm")
  cfg, ev = {"width": 1536}, {}
  s.heads(cfg, ev, 24)
  assert cfg["num_heads"] == 24 and s.assumed == ["num_heads"]
  s = timm_config.TimmConfig(base.Keys({}, "f", "timm", meta=meta), "timm")
  cfg = {"width": 1024}  # a 64-wide-head reading of the same word is kept
  s.heads(cfg, ev, 16)
  assert cfg["num_heads"] == 16 and not s.assumed


def test_an_eva_architecture_of_unknown_rotary_embedding_is_refused(folders, tmp_path):
  import json
  shutil.copytree(folders["eva02_tiny"][0], tmp_path / "m")
  config = json.loads((tmp_path / "m" / "config.json").read_text())
  (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "architecture": "eva_giant_patch14_224"}))
  with pytest.raises(checkpoints.CheckpointError, match=r"'eva_giant_patch14_224' is an Eva-layout model "
                                                        r"whose rotary embedding \(if any\) we do not know"):
    checkpoints.load(str(tmp_path / "m"))
