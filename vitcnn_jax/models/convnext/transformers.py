"""ConvNeXts in Hugging Face transformers' layouts, with their config.json:
`ConvNextModel`, `ConvNextV2Model` and their classifiers (facebook/convnext-*,
convnextv2-*), and `DINOv3ConvNextModel` (facebook/dinov3-convnext-*).

ConvNext names (under `convnext.` or `convnextv2.` in the classifiers):
embeddings.{patch_embeddings, layernorm}, encoder.stages.S.{downsampling_layer.0
(norm), downsampling_layer.1 (conv), layers.B.{dwconv, layernorm, pwconv1, grn (v2),
pwconv2, layer_scale_parameter (v1)}}, layernorm (of the pooled features: eps is
config.json's layer_norm_eps, 1e-12 by default, where every other norm has 1e-6),
classifier. DINOv3's: stages.S.{downsample_layers.0/1 (stage 0: the stem's conv and
norm; later: norm and conv), layers.B.{depthwise_conv, layer_norm, pointwise_conv1,
pointwise_conv2, gamma}}, layer_norm (of the pooled features; its pooler output).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from vitcnn_jax.models.convnext import model as convnext
from vitcnn_jax.models.formats import hf_folder
from vitcnn_jax.models.formats import torch_layout
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading

FORMATS = {"hf_convnext": "Hugging Face transformers' ConvNextModel / ConvNextV2Model and their "
                          "classifiers (facebook/convnext-*, convnextv2-*)",
           "hf_dinov3_convnext": "Hugging Face transformers' DINOv3ConvNextModel "
                                 "(facebook/dinov3-convnext-*)"}
POLICY = "hf_bicubic_crop0.875_imagenet"  # ConvNextImageProcessor: crop_pct 0.875 at 224
# format -> where each piece sits, the classifiers' prefixes, its config class's layer_norm_eps
_NAMES: dict[str, dict[str, Any]] = {
    "hf_convnext": dict(stem_conv="embeddings.patch_embeddings", stem_norm="embeddings.layernorm",
                        stage="encoder.stages.{}", down_norm="downsampling_layer.0",
                        down_conv="downsampling_layer.1", dw="dwconv", norm="layernorm",
                        fc1="pwconv1", fc2="pwconv2", gamma="layer_scale_parameter",
                        final="layernorm", wrappers=("", "convnext.", "convnextv2."), eps=1e-12,
                        upstream="ConvNextConfig", all_norms=False),
    "hf_dinov3_convnext": dict(stem_conv="stages.0.downsample_layers.0",
                               stem_norm="stages.0.downsample_layers.1", stage="stages.{}",
                               down_norm="downsample_layers.0", down_conv="downsample_layers.1",
                               dw="depthwise_conv", norm="layer_norm", fc1="pointwise_conv1",
                               fc2="pointwise_conv2", gamma="gamma", final="layer_norm",
                               wrappers=("",), eps=1e-6, upstream="DINOv3ConvNextConfig",
                               all_norms=True),
}


def _base(flat: dict[str, np.ndarray], n: dict[str, Any]) -> str | None:
  first = f"{n['stage'].format(0)}.layers.0.{n['dw']}.weight"
  for base in n["wrappers"]:
    if f"{base}{n['stem_conv']}.weight" in flat and f"{base}{first}" in flat:
      return base
  return None


def detect(flat: dict[str, np.ndarray]) -> str | None:
  return next((fmt for fmt, n in _NAMES.items() if _base(flat, n) is not None), None)


def _stages(keys: Keys, p: dict, cfg: dict, ev: dict, base: str, n: dict[str, Any]) -> None:
  stages = keys.indices(re.escape(base + n["stage"].format("")) + r"(\d+)\.")
  depths, widths = [], []
  for s in stages:
    src = base + n["stage"].format(s)
    if s:
      torch_layout.take_torch_norm(keys, p, f"{src}.{n['down_norm']}", f"stage{s}_downsample_norm")
      torch_layout.take_torch_conv(keys, p, f"{src}.{n['down_conv']}", f"stage{s}_downsample_conv", bias=True)
    blocks = keys.indices(re.escape(src) + r"\.layers\.(\d+)\.")
    depths.append(len(blocks))
    for b in blocks:
      layer, ours = f"{src}.layers.{b}", f"stage{s}_block{b:02d}"
      dw = torch_layout.take_torch_conv(keys, p, f"{layer}.{n['dw']}", f"{ours}/conv_dw", bias=True)
      torch_layout.take_torch_norm(keys, p, f"{layer}.{n['norm']}", f"{ours}/norm")
      torch_layout.take_torch_dense(keys, p, f"{layer}.{n['fc1']}", f"{ours}/fc1")
      torch_layout.take_torch_dense(keys, p, f"{layer}.{n['fc2']}", f"{ours}/fc2")
      if keys.has(f"{layer}.grn.weight"):
        p[f"{ours}/grn/scale"] = keys.take(f"{layer}.grn.weight").reshape(-1)
        p[f"{ours}/grn/bias"] = keys.take(f"{layer}.grn.bias").reshape(-1)
      if keys.has(f"{layer}.{n['gamma']}"):
        p[f"{ours}/gamma"] = keys.take(f"{layer}.{n['gamma']}")
    widths.append(dw.shape[0])
  if not stages or stages[0] != 0 or not all(depths):
    raise CheckpointError(f"{keys.path}: no {base}{n['stage'].format('S')}.layers.0.* tensors.")
  first = f"{base}{n['stage'].format(0)}.layers.0"
  cfg["depths"], ev["depths"] = tuple(depths), f"{base}{n['stage'].format('S')}.layers.0..n-1"
  cfg["widths"], ev["widths"] = tuple(widths), f"{first}.{n['dw']}.weight per stage"
  cfg["kernel_size"], ev["kernel_size"] = dw.shape[-1], keys.shape(f"{first}.{n['dw']}.weight")
  cfg["grn"] = keys.has(f"{first}.grn.weight")
  ev["grn"] = f"{first}.grn.weight" + ("" if cfg["grn"] else ": absent (v1)")
  cfg["layer_scale"] = keys.has(f"{first}.{n['gamma']}")
  ev["layer_scale"] = f"{first}.{n['gamma']}" + ("" if cfg["layer_scale"] else ": absent")


def read(keys: Keys) -> Reading:
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  n = _NAMES[keys.fmt]
  base = _base(keys.flat, n) or ""
  stem = torch_layout.take_torch_conv(keys, p, base + n["stem_conv"], "stem_conv", bias=True)
  cfg["patch_size"], ev["patch_size"] = stem.shape[-1], keys.shape(f"{base}{n['stem_conv']}.weight")
  torch_layout.take_torch_norm(keys, p, base + n["stem_norm"], "stem_norm")
  _stages(keys, p, cfg, ev, base, n)
  torch_layout.take_torch_norm(keys, p, base + n["final"], "head_norm")
  torch_layout.take_head_torch(keys, p, cfg, ev, "classifier")
  assumed = _head_eps(keys, cfg, ev, n)
  size = keys.meta and keys.meta.input_size()
  cfg["image_size"], ev["image_size"] = size or (
      224, "not in the file (a conv net runs at any size); 224")
  return Reading(keys.fmt, cfg, ev, p, tuple(assumed) + ("image_size",) * (not size),
                    policy=hf_folder.policy(keys.meta, POLICY, "that of facebook/convnext-*"))


def _head_eps(keys: Keys, cfg: dict, ev: dict, n: dict[str, Any]) -> list[str]:
  """The pooled features' LayerNorm eps: config.json's layer_norm_eps (assumed
  without one); DINOv3's applies to every norm, which ours fixes at 1e-6."""
  config = keys.meta.config if keys.meta else None
  if config is None:
    cfg["head_eps"] = n["eps"]
    ev["head_eps"] = f"not in the weights and no config.json; {n['upstream']}'s default {n['eps']}"
    return ["head_eps"]
  if config.get("hidden_act", "gelu") != "gelu":
    raise CheckpointError(f"{keys.path}: config.json hidden_act={config['hidden_act']!r}; "
                             "our ConvNeXt has exact GELU.")
  eps = float(config.get("layer_norm_eps", n["eps"]))
  if n["all_norms"] and eps != convnext.EPS:
    raise CheckpointError(f"{keys.path}: config.json layer_norm_eps={eps} for every norm; our "
                             f"ConvNeXt's block norms have {convnext.EPS}.")
  cfg["head_eps"] = eps
  ev["head_eps"] = (f"config.json layer_norm_eps={config['layer_norm_eps']!r}" if "layer_norm_eps"
                    in config else f"config.json without layer_norm_eps: {n['upstream']}'s default {eps}")
  return []


READER = Reader(
    formats=FORMATS,
    policy=POLICY,
    detect=detect,
    read=read,
    adapt=convnext.adapt,
)
