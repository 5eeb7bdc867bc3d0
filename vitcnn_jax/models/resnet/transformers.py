"""ResNets in Hugging Face transformers' layout (`ResNetModel`,
`ResNetForImageClassification`: microsoft/resnet-*), with their config.json.

Names (under `resnet.` in the classifier): embedder.embedder.{convolution,
normalization}, encoder.stages.S.layers.U.{layer.I.{convolution, normalization},
shortcut.{convolution, normalization}}, classifier.1. A bottleneck's inner width
is a quarter of its stage's `hidden_sizes` entry, as ours. Where the stride sits
is config.json's `downsample_in_bottleneck` (False, the default: in the 3x3,
v1.5); without a config.json it is assumed so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitcnn_jax.models.formats import hf_folder
from vitcnn_jax.models.formats import torch_layout
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading
from vitcnn_jax.models.resnet import model as resnet

FORMATS = {"hf_resnet": "Hugging Face transformers' ResNetModel / ResNetForImageClassification "
                        "(microsoft/resnet-*)"}
POLICY = "hf_bicubic_crop0.875_imagenet"  # microsoft/resnet-*'s ConvNextImageProcessor
_ROOT = "embedder.embedder"


def _base(flat: dict[str, np.ndarray]) -> str | None:
  for base in ("", "resnet."):
    if f"{base}{_ROOT}.convolution.weight" in flat:
      return base
  return None


def detect(flat: dict[str, np.ndarray]) -> str | None:
  return "hf_resnet" if _base(flat) is not None else None


def _conv_bn(keys: Keys, p: dict, name: str, conv: str, bn: str) -> np.ndarray:
  w = torch_layout.take_torch_conv(keys, p, f"{name}.convolution", conv, refused=resnet.NOT_V1)
  torch_layout.take_torch_bn(keys, p, f"{name}.normalization", bn)
  return w


def _settings(keys: Keys, cfg: dict, ev: dict) -> list[str]:
  """What config.json decides (the stride's place); assumed without one."""
  config = keys.meta.config if keys.meta else None
  if config is None:
    cfg["stride_in"] = "3x3"
    ev["stride_in"] = ("not in the weights and no config.json; ResNetConfig's default "
                       "downsample_in_bottleneck=False (the 3x3, v1.5)")
    return ["stride_in"]
  bottleneck = config.get("downsample_in_bottleneck", False)
  cfg["stride_in"] = "1x1" if bottleneck else "3x3"
  ev["stride_in"] = f"config.json downsample_in_bottleneck={bottleneck!r}" if (
      "downsample_in_bottleneck" in config) else "config.json without downsample_in_bottleneck: " \
                                                  "ResNetConfig's default False (the 3x3)"
  for key, want in (("hidden_act", "relu"), ("downsample_in_first_stage", False)):
    if config.get(key, want) != want:
      raise CheckpointError(f"{keys.path}: config.json {key}={config[key]!r}; our ResNet has "
                               f"{key}={want!r}.")
  return []


def read(keys: Keys) -> Reading:
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  base = _base(keys.flat) or ""
  root = f"{base}{_ROOT}"
  stem = _conv_bn(keys, p, root, "conv_root", "bn_root")
  cfg["stem_width"], ev["stem_width"] = stem.shape[0], keys.shape(f"{root}.convolution.weight")
  if stem.shape[2:] != (7, 7):
    raise CheckpointError(f"{keys.path}: {keys.shape(root + '.convolution.weight')}: our "
                             "ResNet's root is a 7x7 conv.")
  stages = keys.indices(rf"{base}encoder\.stages\.(\d+)\.")
  if not stages or stages[0] != 0:
    raise CheckpointError(f"{keys.path}: no {base}encoder.stages.0.* tensors found.")
  first = f"{base}encoder.stages.0.layers.0.layer"
  bottleneck = keys.has(f"{first}.2.convolution.weight")
  cfg["block"] = "bottleneck" if bottleneck else "basic"
  ev["block"] = f"{first}.2.convolution.weight" + ("" if bottleneck else ": absent")
  depth, widths = [], []
  for s in stages:
    units = keys.indices(rf"{base}encoder\.stages\.{s}\.layers\.(\d+)\.")
    if not units or units[0] != 0:
      raise CheckpointError(f"{keys.path}: stage {s} has no layers.0.* tensors.")
    depth.append(len(units))
    for u in units:
      src, ours = f"{base}encoder.stages.{s}.layers.{u}", f"block{s + 1}_unit{u + 1:02d}"
      for i in range(3 if bottleneck else 2):
        w = _conv_bn(keys, p, f"{src}.layer.{i}", f"{ours}/conv{i + 1}", f"{ours}/bn{i + 1}")
        if i == 1 and u == 0:
          widths.append(w.shape[0] if bottleneck else w.shape[1])
      if keys.has(f"{src}.shortcut.convolution.weight"):
        _conv_bn(keys, p, f"{src}.shortcut", f"{ours}/conv_proj", f"{ours}/bn_proj")
  cfg["depth"], ev["depth"] = tuple(depth), f"{base}encoder.stages.S.layers.0..n-1"
  cfg["widths"], ev["widths"] = tuple(widths), f"{base}encoder.stages.S.layers.0.layer.1"
  torch_layout.take_head_torch(keys, p, cfg, ev, "classifier.1")
  assumed = _settings(keys, cfg, ev)
  cfg.update(batchnorm=True, pool_pad=(1, 1), bn_eps=1e-5)
  ev.update(batchnorm=f"{root}.normalization.running_var",
            pool_pad="transformers' ResNet: MaxPool2d(3, 2, padding=1)",
            bn_eps="transformers' ResNet: BatchNorm2d's default 1e-5")
  size = keys.meta and keys.meta.input_size()
  cfg["image_size"], ev["image_size"] = size or (
      224, "not in the file (a conv net runs at any size); 224")
  return Reading(keys.fmt, cfg, ev, p, tuple(assumed) + ("image_size",) * (not size),
                    policy=hf_folder.policy(keys.meta, POLICY, "that of microsoft/resnet-*"))


READER = Reader(
    formats=FORMATS,
    policy=POLICY,
    detect=detect,
    read=read,
    overridable=("stride_in", "bn_eps", "input_order"),
)
