"""Swin state dicts: timm's (`.safetensors`: patch_embed.{proj, norm},
layers.S.{downsample.{norm, reduction} (S > 0), blocks.B.{norm1,
attn.{relative_position_bias_table, qkv, proj}, norm2, mlp.fc1/fc2}}, norm, head.fc)
and transformers' (`SwinModel`, `SwinForImageClassification` under `swin.`:
embeddings.{patch_embeddings.projection, norm}, encoder.layers.S.{blocks.B.
{layernorm_before, attention.self.{query, key, value, relative_position_bias_table},
attention.output.dense, layernorm_after, intermediate.dense, output.dense},
downsample.{norm, reduction} (the merge that starts stage S + 1)}, layernorm,
classifier).

Everything is read from the tensors: widths, depths, heads (the bias tables'
columns), the window (their rows, (2w - 1)**2), the MLP ratio; the resolution
from config.json (transformers' image_size, timm's input size) where there is
one, else 224, assumed.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from vitcnn_jax.models.formats import hf_folder
from vitcnn_jax.models.formats import timm_config
from vitcnn_jax.models.formats import torch_layout
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading
from vitcnn_jax.models.swin import model as swin

FORMATS = {"timm_swin": "timm's SwinTransformer state dict (.safetensors)",
           "hf_swin": "Hugging Face transformers' SwinModel / SwinForImageClassification folder"}
# format -> where each piece sits: stem conv and norm, stage, block, a block's parts,
# the merge (relative to the stage it starts: timm's own, transformers' previous).
_NAMES: dict[str, dict[str, Any]] = {
    "timm_swin": dict(wrappers=("",), conv="patch_embed.proj", stem_norm="patch_embed.norm",
                      stage="layers.{}", merge_at=0, norm1="norm1", norm2="norm2",
                      table="attn.relative_position_bias_table", proj="attn.proj", fc1="mlp.fc1",
                      fc2="mlp.fc2", final="norm", head="head.fc"),
    "hf_swin": dict(wrappers=("", "swin."), conv="embeddings.patch_embeddings.projection",
                    stem_norm="embeddings.norm", stage="encoder.layers.{}", merge_at=-1,
                    norm1="layernorm_before", norm2="layernorm_after",
                    table="attention.self.relative_position_bias_table",
                    proj="attention.output.dense", fc1="intermediate.dense", fc2="output.dense",
                    final="layernorm", head="classifier"),
}


def _base(flat: dict[str, np.ndarray], n: dict[str, Any]) -> str | None:
  table = f"{n['stage'].format(0)}.blocks.0.{n['table']}"
  return next((w for w in n["wrappers"] if f"{w}{n['conv']}.weight" in flat and f"{w}{table}" in flat),
              None)


def detect(flat: dict[str, np.ndarray]) -> str | None:
  return next((fmt for fmt, n in _NAMES.items() if _base(flat, n) is not None), None)


def _qkv(keys: Keys, p: dict, src: str, ours: str, fmt: str) -> None:
  if fmt == "timm_swin":
    w, b = torch_layout.take_torch_linear(keys, f"{src}.attn.qkv")
    c = w.shape[0]
    for j, name in enumerate(("query", "key", "value")):
      p[f"{ours}/{name}/kernel"], p[f"{ours}/{name}/bias"] = w[:, j * c:(j + 1) * c], b[j * c:(j + 1) * c]
    return
  for name in ("query", "key", "value"):
    p[f"{ours}/{name}/kernel"], p[f"{ours}/{name}/bias"] = torch_layout.take_torch_linear(
        keys, f"{src}.attention.self.{name}")


def _stage(keys: Keys, p: dict, base: str, s: int, n: dict[str, Any], fmt: str) -> tuple[int, int, int]:
  """A stage's blocks: (depth, heads, window)."""
  src = base + n["stage"].format(s)
  blocks = keys.indices(re.escape(src) + r"\.blocks\.(\d+)\.")
  if not blocks or blocks[0] != 0:
    raise CheckpointError(f"{keys.path}: no {src}.blocks.0.* tensors found.")
  shapes = set()
  for b in blocks:
    blk, ours = f"{src}.blocks.{b}", f"stage{s}_block{b:02d}"
    torch_layout.take_torch_norm(keys, p, f"{blk}.{n['norm1']}", f"{ours}/LayerNorm_0")
    table = keys.take(f"{blk}.{n['table']}")
    side = math.isqrt(table.shape[0])
    if side * side != table.shape[0] or side % 2 == 0:
      raise CheckpointError(f"{keys.path}: {keys.shape(blk + '.' + n['table'])} is not a "
                               "((2w-1)**2, heads) relative position bias table.")
    shapes.add(table.shape)
    p[f"{ours}/attn/rel_bias"] = table
    _qkv(keys, p, blk, f"{ours}/attn", fmt)
    p[f"{ours}/attn/out/kernel"], p[f"{ours}/attn/out/bias"] = torch_layout.take_torch_linear(
        keys, f"{blk}.{n['proj']}")
    torch_layout.take_torch_norm(keys, p, f"{blk}.{n['norm2']}", f"{ours}/LayerNorm_1")
    for j, part in enumerate(("fc1", "fc2")):
      p[f"{ours}/MlpBlock_0/Dense_{j}/kernel"], p[f"{ours}/MlpBlock_0/Dense_{j}/bias"] = (
          torch_layout.take_torch_linear(keys, f"{blk}.{n[part]}"))
  if len(shapes) > 1:
    raise CheckpointError(f"{keys.path}: the blocks of {src} have bias tables {sorted(shapes)}.")
  (rows, heads), = shapes
  return len(blocks), heads, (math.isqrt(rows) + 1) // 2


def read(keys: Keys) -> Reading:
  fmt, p, cfg, ev = keys.fmt, {}, {}, {}
  n = _NAMES[fmt]
  base = _base(keys.flat, n) or ""
  w = keys.take(f"{base}{n['conv']}.weight")
  p["patch_embed/kernel"], p["patch_embed/bias"] = w.transpose(2, 3, 1, 0), keys.take(f"{base}{n['conv']}.bias")
  cfg["embed_dim"], cfg["patch_size"] = w.shape[0], w.shape[2]
  ev["embed_dim"] = ev["patch_size"] = keys.shape(f"{base}{n['conv']}.weight")
  torch_layout.take_torch_norm(keys, p, base + n["stem_norm"], "patch_norm")
  stages = keys.indices(re.escape(base + n["stage"].format("")) + r"(\d+)\.")
  depths, heads, windows = zip(*(_stage(keys, p, base, s, n, fmt) for s in stages))
  for s in stages[1:]:  # the merge that starts stage s
    src = base + n["stage"].format(s + n["merge_at"])
    torch_layout.take_torch_norm(keys, p, f"{src}.downsample.norm", f"stage{s}_merge_norm")
    p[f"stage{s}_merge/kernel"] = keys.take(f"{src}.downsample.reduction.weight").T
  if len(set(windows)) > 1:
    raise CheckpointError(f"{keys.path}: the stages' windows differ ({windows}); ours has one.")
  table = f"{base}{n['stage'].format(0)}.blocks.0.{n['table']}"
  cfg["depths"], ev["depths"] = tuple(depths), f"{base}{n['stage'].format('S')}.blocks.0..n-1"
  cfg["heads"], ev["heads"] = tuple(heads), f"the bias tables' columns ({keys.shape(table)})"
  cfg["window"], ev["window"] = windows[0], f"the bias tables' rows, (2w-1)**2 ({keys.shape(table)})"
  fc1 = keys.flat[f"{base}{n['stage'].format(0)}.blocks.0.{n['fc1']}.weight"]
  cfg["mlp_ratio"], ev["mlp_ratio"] = fc1.shape[0] / fc1.shape[1], keys.shape(
      f"{base}{n['stage'].format(0)}.blocks.0.{n['fc1']}.weight")
  torch_layout.take_torch_norm(keys, p, base + n["final"], "norm")
  torch_layout.take_head_torch(keys, p, cfg, ev, n["head"])
  return Reading(fmt, cfg, ev, p, tuple(_settings(keys, cfg, ev, fmt)), policy=_policy(keys, fmt))


def _settings(keys: Keys, cfg: dict, ev: dict, fmt: str) -> list[str]:
  """LayerNorm eps and resolution: config.json's, else the upstreams' 1e-5 and 224."""
  config = keys.meta.config if keys.meta else None
  cfg["ln_eps"], ev["ln_eps"] = 1e-5, "torch's LayerNorm default, as both upstreams build Swin"
  if fmt == "hf_swin" and config:
    if config.get("hidden_act", "gelu") != "gelu" or config.get("use_absolute_embeddings"):
      raise CheckpointError(f"{keys.path}: config.json hidden_act={config.get('hidden_act')!r}, "
                               f"use_absolute_embeddings={config.get('use_absolute_embeddings')!r}; "
                               "our Swin has exact GELU and no absolute embedding.")
    if float(config.get("layer_norm_eps", 1e-5)) != 1e-5:  # its stem's and merges' stay at 1e-5
      raise CheckpointError(f"{keys.path}: config.json layer_norm_eps={config['layer_norm_eps']}; "
                               "transformers' Swin norms its blocks with it but its stem and merges "
                               "with 1e-5, and our Swin has one eps.")
    ev["ln_eps"] = "config.json layer_norm_eps=1e-05 (transformers' stem and merges: 1e-5 too)"
    size = keys.meta.input_size()
    cfg["image_size"], ev["image_size"] = size or (
        (int(config["image_size"]), f"config.json image_size={config['image_size']}")
        if "image_size" in config else (224, "config.json without image_size: SwinConfig's default 224"))
    return []
  if fmt == "timm_swin" and config and "architecture" in config:
    timm_config.TimmConfig(keys, "timm's Swin").get("image_size", cfg, ev, 224, "")
    if "image_size" in ev and ev["image_size"].startswith("config.json"):
      return []
  cfg["image_size"], ev["image_size"] = 224, "not in the weights; 224, Swin's usual input"
  return ["image_size"]


def _policy(keys: Keys, fmt: str) -> tuple[str, str] | None:
  if fmt == "hf_swin":
    return hf_folder.policy(keys.meta, "hf_bicubic_squash_imagenet", "that of microsoft/swin-*")
  return timm_config.TimmConfig(keys, "timm's Swin").policy()


READER = Reader(
    formats=FORMATS,
    policy=swin.Swin.default_policy,
    detect=detect,
    read=read,
    overridable=("ln_eps",),
)
