"""ConvNeXt state dicts in timm's layout (`.safetensors`), v1 and v2.

The architecture is read from the tensors: widths from each stage's convs,
depths from the block numbering, v2 from `mlp.grn`, v1's layer scale from
`gamma`; the stem's patch size and the depthwise kernel from their shapes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitcnn_jax.models.convnext import model as convnext
from vitcnn_jax.models.formats import timm_config
from vitcnn_jax.models.formats import torch_layout
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading

FORMATS = {"timm_convnext": "timm's ConvNeXt state dict (.safetensors): stem.0/1, "
                            "stages.S.downsample.0/1, stages.S.blocks.B.{conv_dw, norm, "
                            "mlp.fc1, mlp.grn (v2), mlp.fc2, gamma (v1)}, head.norm, head.fc"}


def detect(flat: dict[str, np.ndarray]) -> str | None:
  if "stem.0.weight" in flat and any(k.startswith("stages.") for k in flat):
    return "timm_convnext"
  return None


def read(keys: Keys) -> Reading:
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  stem = torch_layout.take_torch_conv(keys, p, "stem.0", "stem_conv", bias=True)
  cfg["patch_size"], ev["patch_size"] = stem.shape[-1], keys.shape("stem.0.weight")
  torch_layout.take_torch_norm(keys, p, "stem.1", "stem_norm")
  stages = keys.indices(r"stages\.(\d+)\.")
  if not stages or stages[0] != 0:
    raise CheckpointError(f"{keys.path}: no stages.0.* tensors found.")
  depths, widths = [], []
  for s in stages:
    if s:
      torch_layout.take_torch_norm(keys, p, f"stages.{s}.downsample.0", f"stage{s}_downsample_norm")
      torch_layout.take_torch_conv(keys, p, f"stages.{s}.downsample.1", f"stage{s}_downsample_conv", bias=True)
    blocks = keys.indices(rf"stages\.{s}\.blocks\.(\d+)\.")
    if not blocks or blocks[0] != 0:
      raise CheckpointError(f"{keys.path}: stage {s} has no stages.{s}.blocks.0.* tensors.")
    depths.append(len(blocks))
    for b in blocks:
      src, ours = f"stages.{s}.blocks.{b}", f"stage{s}_block{b:02d}"
      dw = torch_layout.take_torch_conv(keys, p, f"{src}.conv_dw", f"{ours}/conv_dw", bias=True)
      torch_layout.take_torch_norm(keys, p, f"{src}.norm", f"{ours}/norm")
      torch_layout.take_torch_dense(keys, p, f"{src}.mlp.fc1", f"{ours}/fc1")
      torch_layout.take_torch_dense(keys, p, f"{src}.mlp.fc2", f"{ours}/fc2")
      if keys.has(f"{src}.mlp.grn.weight"):
        torch_layout.take_torch_norm(keys, p, f"{src}.mlp.grn", f"{ours}/grn")
      if keys.has(f"{src}.gamma"):
        p[f"{ours}/gamma"] = keys.take(f"{src}.gamma")
    widths.append(dw.shape[0])
  cfg["depths"], ev["depths"] = tuple(depths), "stages.S.blocks.0..n-1"
  cfg["widths"] = tuple(widths)
  ev["widths"] = "stages.S.blocks.0.conv_dw.weight (width, 1, k, k)"
  cfg["kernel_size"], ev["kernel_size"] = dw.shape[-1], keys.shape(
      f"stages.{stages[-1]}.blocks.0.conv_dw.weight")
  cfg["grn"] = keys.has("stages.0.blocks.0.mlp.grn.weight")
  ev["grn"] = "stages.0.blocks.0.mlp.grn.weight" + ("" if cfg["grn"] else ": absent (v1)")
  cfg["layer_scale"] = keys.has("stages.0.blocks.0.gamma")
  ev["layer_scale"] = "stages.0.blocks.0.gamma" + ("" if cfg["layer_scale"] else ": absent")
  torch_layout.take_torch_norm(keys, p, "head.norm", "head_norm")
  torch_layout.take_head_torch(keys, p, cfg, ev, "head.fc")
  s = timm_config.TimmConfig(keys, "timm's ConvNeXt")  # a hub folder's config.json, if any
  s.get("image_size", cfg, ev, 224, "a conv net runs at any size; 224")
  return Reading(keys.fmt, cfg, ev, p, tuple(s.assumed), policy=s.policy())


_NAMES = {"stem_conv": "stem.0", "stem_norm": "stem.1", "head_norm": "head.norm",
          "head": "head.fc"}
_BLOCK = {"conv_dw": "conv_dw", "norm": "norm", "fc1": "mlp.fc1", "fc2": "mlp.fc2",
          "grn": "mlp.grn", "gamma": "gamma"}


def write(model, flat: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
  """Our params under timm's ConvNeXt names and layouts."""
  del fmt
  if model.head_eps != convnext.EPS:
    raise ValueError(f"timm's ConvNeXt norms its pooled features with eps {convnext.EPS}, this "
                     f"model with {model.head_eps}: it has no timm state dict.")
  out = {}
  for k, v in flat.items():
    module, _, leaf = k.rpartition("/")
    if module.startswith("stage") and "_block" in module:
      stage, block = module.split("/")[0].split("_block")
      sub = module.split("/")[1] if "/" in module else leaf
      name = f"stages.{stage[5:]}.blocks.{int(block)}.{_BLOCK[sub]}"
    elif module.startswith("stage"):  # stageS_downsample_{norm,conv}
      stage, _, part = module.partition("_downsample_")
      name = f"stages.{stage[5:]}.downsample.{0 if part == 'norm' else 1}"
    else:
      name = _NAMES[module]
    if k.endswith("gamma"):
      out[name] = v
      continue
    if leaf == "kernel":
      v = v.transpose(3, 2, 0, 1) if v.ndim == 4 else v.T
    out[f"{name}.{torch_layout.TORCH_LEAVES[leaf]}"] = v
  return out


READER = Reader(
    formats=FORMATS,
    policy=convnext.ConvNeXt.default_policy,  # timm's ConvNeXt evaluation
    detect=detect,
    read=read,
    adapt=convnext.adapt,
    write=write,
    suffix=".safetensors",
)
