"""ResNet v1 state dicts in timm's and torchvision's layout (`.safetensors`):
conv1, bn1, layerS.U.{conv1..3, bn1..3, downsample.0/1}, fc.

The architecture is read from the tensors: the block from conv3's presence,
the units per stage from the numbering, the widths from each stage's first
3x3 conv. Both libraries put a bottleneck's stride in its 3x3 conv (v1.5) and
use BatchNorm eps 1e-5; neither is in a state dict, so both are assumed (a
Caffe-style port saved under these names takes `stride_in="1x1"`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitcnn_jax.models.formats import timm_config
from vitcnn_jax.models.formats import torch_layout
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading
from vitcnn_jax.models.resnet import model as resnet

FORMATS = {"timm_resnet": "timm's or torchvision's ResNet state dict (.safetensors): conv1, "
                          "bn1, layerS.U.{conv1..3, bn1..3, downsample.0/1}, fc"}


def detect(flat: dict[str, np.ndarray]) -> str | None:
  if "conv1.weight" in flat and "bn1.running_var" in flat and "layer1.0.conv1.weight" in flat:
    return "timm_resnet"
  return None


def read(keys: Keys) -> Reading:
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  stem = torch_layout.take_torch_conv(keys, p, "conv1", "conv_root", refused=resnet.NOT_V1)
  torch_layout.take_torch_bn(keys, p, "bn1", "bn_root")
  cfg["stem_width"], ev["stem_width"] = stem.shape[0], keys.shape("conv1.weight")
  bottleneck = keys.has("layer1.0.conv3.weight")
  cfg["block"] = "bottleneck" if bottleneck else "basic"
  ev["block"] = "layer1.0.conv3.weight" + ("" if bottleneck else ": absent")
  stages = keys.indices(r"layer(\d+)\.")
  if not stages or stages[0] != 1:
    raise CheckpointError(f"{keys.path}: no layer1.* tensors found.")
  depth, widths = [], []
  for s in stages:
    units = keys.indices(rf"layer{s}\.(\d+)\.")
    if not units or units[0] != 0:
      raise CheckpointError(f"{keys.path}: stage {s} has no layer{s}.0.* tensors.")
    depth.append(len(units))
    for u in units:
      src, ours = f"layer{s}.{u}", f"block{s}_unit{u + 1:02d}"
      for i in (1, 2, 3) if bottleneck else (1, 2):
        w = torch_layout.take_torch_conv(keys, p, f"{src}.conv{i}", f"{ours}/conv{i}", refused=resnet.NOT_V1)
        torch_layout.take_torch_bn(keys, p, f"{src}.bn{i}", f"{ours}/bn{i}")
        if i == 2 and u == 0:
          widths.append(w.shape[0] if bottleneck else w.shape[1])
      if keys.has(f"{src}.downsample.0.weight"):
        torch_layout.take_torch_conv(keys, p, f"{src}.downsample.0", f"{ours}/conv_proj", refused=resnet.NOT_V1)
        torch_layout.take_torch_bn(keys, p, f"{src}.downsample.1", f"{ours}/bn_proj")
  cfg["depth"], ev["depth"] = tuple(depth), "layerS.0..n-1"
  cfg["widths"], ev["widths"] = tuple(widths), "layerS.0.conv2.weight"
  torch_layout.take_head_torch(keys, p, cfg, ev, "fc")
  cfg.update(batchnorm=True, pool_pad=(1, 1))
  ev.update(batchnorm="bn1.running_var", pool_pad="torch's MaxPool2d(3, 2, padding=1)")
  s = timm_config.TimmConfig(keys, "timm's ResNet")  # a hub folder's config.json, if any
  s.get("stride_in", cfg, ev, "3x3", "timm's and torchvision's 3x3 (v1.5)")
  s.get("bn_eps", cfg, ev, 1e-5, "torch's BatchNorm2d default 1e-5")
  s.get("image_size", cfg, ev, 224, "a conv net runs at any size; 224")
  return Reading(keys.fmt, cfg, ev, p, tuple(s.assumed), policy=s.policy())


def _torch_module(module: str) -> str:
  """Our module path -> timm's: block2_unit03/bn_proj -> layer2.2.downsample.1."""
  if module in ("conv_root", "bn_root", "head"):
    return {"conv_root": "conv1", "bn_root": "bn1", "head": "fc"}[module]
  unit, layer = module.split("/")
  stage, u = unit[len("block"):].split("_unit")
  layer = {"conv_proj": "downsample.0", "bn_proj": "downsample.1"}.get(layer, layer)
  return f"layer{stage}.{int(u) - 1}.{layer}"


def write(model, flat: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
  """Our params under timm's names and layouts (BatchNorm models only)."""
  del fmt
  if not model.batchnorm:
    raise ValueError("timm's ResNet has BatchNorm; a ResNet with folded BatchNorm has no "
                     "timm state dict.")
  out = {}
  for k, v in flat.items():
    module, _, leaf = k.rpartition("/")
    name = _torch_module(module)
    if leaf == "kernel":
      v = v.transpose(3, 2, 0, 1) if v.ndim == 4 else v.T
      leaf = "weight"
    out[f"{name}.{torch_layout.BN_LEAVES.get(leaf, leaf) if '/bn' in k or module == 'bn_root' else leaf}"] = v
  return out


READER = Reader(
    formats=FORMATS,
    policy=resnet.ResNet.default_policy,
    detect=detect,
    read=read,
    overridable=("stride_in", "bn_eps", "input_order"),
    write=write,
    suffix=".safetensors",
)
