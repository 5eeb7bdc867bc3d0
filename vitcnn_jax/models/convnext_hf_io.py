"""ConvNeXts in Hugging Face transformers' layout (`ConvNextModel`,
`ConvNextV2Model` and their classifiers: facebook/convnext-*, convnextv2-*),
with their config.json.

Names (under `convnext.` or `convnextv2.` in the classifiers):
embeddings.{patch_embeddings, layernorm}, encoder.stages.S.{downsampling_layer.0
(norm), downsampling_layer.1 (conv), layers.B.{dwconv, layernorm, pwconv1, grn (v2),
pwconv2, layer_scale_parameter (v1)}}, layernorm (of the pooled features: eps is
config.json's layer_norm_eps, 1e-12 by default, where every other norm has 1e-6),
classifier.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from vitcnn_jax.models import convnext_io
from vitcnn_jax.models import io

FORMATS = {"hf_convnext": "Hugging Face transformers' ConvNextModel / ConvNextV2Model and their "
                          "classifiers (facebook/convnext-*, convnextv2-*)"}
SUFFIX = None  # read, never written
POLICY = "hf_bilinear_crop0.875_imagenet"  # ConvNextImageProcessor: crop_pct 0.875 at 224
OVERRIDABLE = ()
_STEM = "embeddings.patch_embeddings"


def _base(flat: dict[str, np.ndarray]) -> str | None:
  for base in ("", "convnext.", "convnextv2."):
    if f"{base}{_STEM}.weight" in flat and f"{base}encoder.stages.0.layers.0.dwconv.weight" in flat:
      return base
  return None


def detect(flat: dict[str, np.ndarray]) -> str | None:
  return "hf_convnext" if _base(flat) is not None else None


def read(keys: io.Keys) -> io.Reading:
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  base = _base(keys.flat) or ""
  conv, dense = convnext_io.conv, convnext_io.dense
  stem = conv(keys, p, base + _STEM, "stem_conv")
  cfg["patch_size"], ev["patch_size"] = stem.shape[-1], keys.shape(f"{base}{_STEM}.weight")
  io.take_torch_norm(keys, p, f"{base}embeddings.layernorm", "stem_norm")
  stages = keys.indices(rf"{base}encoder\.stages\.(\d+)\.")
  depths, widths = [], []
  for s in stages:
    src = f"{base}encoder.stages.{s}"
    if s:
      io.take_torch_norm(keys, p, f"{src}.downsampling_layer.0", f"stage{s}_downsample_norm")
      conv(keys, p, f"{src}.downsampling_layer.1", f"stage{s}_downsample_conv")
    blocks = keys.indices(re.escape(src) + r"\.layers\.(\d+)\.")
    depths.append(len(blocks))
    for b in blocks:
      layer, ours = f"{src}.layers.{b}", f"stage{s}_block{b:02d}"
      dw = conv(keys, p, f"{layer}.dwconv", f"{ours}/conv_dw")
      io.take_torch_norm(keys, p, f"{layer}.layernorm", f"{ours}/norm")
      dense(keys, p, f"{layer}.pwconv1", f"{ours}/fc1")
      dense(keys, p, f"{layer}.pwconv2", f"{ours}/fc2")
      if keys.has(f"{layer}.grn.weight"):
        p[f"{ours}/grn/scale"] = keys.take(f"{layer}.grn.weight").reshape(-1)
        p[f"{ours}/grn/bias"] = keys.take(f"{layer}.grn.bias").reshape(-1)
      if keys.has(f"{layer}.layer_scale_parameter"):
        p[f"{ours}/gamma"] = keys.take(f"{layer}.layer_scale_parameter")
    widths.append(dw.shape[0])
  if not stages or stages[0] != 0 or not all(depths):
    raise io.CheckpointError(f"{keys.path}: no {base}encoder.stages.S.layers.0.* tensors found.")
  first = f"{base}encoder.stages.0.layers.0"
  cfg["depths"], ev["depths"] = tuple(depths), f"{base}encoder.stages.S.layers.0..n-1"
  cfg["widths"], ev["widths"] = tuple(widths), f"{base}encoder.stages.S.layers.0.dwconv.weight"
  cfg["kernel_size"], ev["kernel_size"] = dw.shape[-1], keys.shape(f"{first}.dwconv.weight")
  cfg["grn"] = keys.has(f"{first}.grn.weight")
  ev["grn"] = f"{first}.grn.weight" + ("" if cfg["grn"] else ": absent (v1)")
  cfg["layer_scale"] = keys.has(f"{first}.layer_scale_parameter")
  ev["layer_scale"] = f"{first}.layer_scale_parameter" + ("" if cfg["layer_scale"] else ": absent")
  io.take_torch_norm(keys, p, f"{base}layernorm", "head_norm")
  if keys.has("classifier.weight"):
    w = dense(keys, p, "classifier", "head")
    cfg["num_classes"], ev["num_classes"] = w.shape[1], keys.shape("classifier.weight")
  else:
    cfg["num_classes"], ev["num_classes"] = None, "no classifier in the file"
  assumed = _head_eps(keys, cfg, ev)
  size = keys.meta and keys.meta.input_size()
  cfg["image_size"], ev["image_size"] = size or (
      224, "not in the file (a conv net runs at any size); 224")
  return io.Reading(keys.fmt, cfg, ev, p, tuple(assumed) + ("image_size",) * (not size),
                    policy=keys.meta and keys.meta.policy())


def _head_eps(keys: io.Keys, cfg: dict, ev: dict) -> list[str]:
  """The pooled features' LayerNorm eps: config.json's layer_norm_eps (assumed
  without one)."""
  assumed: list[str] = []
  config = keys.meta.config if keys.meta else None
  if config is None:
    cfg["head_eps"] = 1e-12
    ev["head_eps"] = "not in the weights and no config.json; ConvNextConfig's default layer_norm_eps 1e-12"
    assumed.append("head_eps")
  else:
    if config.get("hidden_act", "gelu") != "gelu":
      raise io.CheckpointError(f"{keys.path}: config.json hidden_act={config['hidden_act']!r}; "
                               "our ConvNeXt has exact GELU.")
    cfg["head_eps"] = float(config.get("layer_norm_eps", 1e-12))
    ev["head_eps"] = (f"config.json layer_norm_eps={config['layer_norm_eps']!r}" if "layer_norm_eps"
                      in config else "config.json without layer_norm_eps: ConvNextConfig's default 1e-12")
  return assumed


adapt = convnext_io.adapt


def default_format(model) -> str:
  del model
  return "hf_convnext"


def write(model, flat: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
  """Reading only: our ConvNeXts save as timm safetensors."""
  del model, flat
  raise ValueError(f"Format {fmt!r} is read, not written; save as .safetensors (timm's layout).")
