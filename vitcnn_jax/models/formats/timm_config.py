"""What a timm hub repository's config.json says of its ViT beyond the weights.

timm writes `architecture` (its model function's name, e.g.
`vit_base_patch16_clip_quickgelu_224`), `model_args` (the arguments given beside
it), `global_pool` and `pretrained_cfg` (the evaluation transform). The model
function's name fixes what a state dict cannot say (heads, activation, LayerNorm
eps, DINOv3's rotary base): `ARCHITECTURES` holds those facts of timm's model
functions, checked against timm itself in the tests. Without a config.json (or
for a name not listed), the format's defaults are assumed and reported.
"""

from __future__ import annotations

import re
from typing import Any

from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models.formats.base import Keys, Settings

# Heads of timm's ViT model functions by their size word (vit_<size>_patch...).
_HEADS = {"tiny": 3, "small": 6, "small_plus": 6, "medium": 8, "base": 12, "large": 16,
          "huge": 16, "huge_plus": 20, "giant": 16, "gigantic": 16, "so400m": 16, "7b": 32}
_SIZE = re.compile(r"(?:vit|deit3?|eva02|vit_pe_core)_(small_plus|huge_plus|7b|[a-z0-9]+?)_patch")
_GRID = re.compile(r"_patch(\d+)_(\d+)")  # patch, then input size
_POOLS = {"avg": "gap", "token": "token", "map": "map", "": "token"}


def architecture(name: str) -> dict[str, Any]:
  """The settings timm's model function `name` fixes that a state dict does not
  hold: num_heads (by its size word), gelu, ln_eps, a RoPE ViT's rotary embedding
  (rope, rope_theta, rope_ref, rope_offset) and PE's pool heads, a ResNet's stride
  and BatchNorm eps."""
  out: dict[str, Any] = {}
  if m := _SIZE.match(name):
    if m[1] in _HEADS:
      out["num_heads"] = _HEADS[m[1]]
  if re.fullmatch(r"resnet\d+", name):  # timm's plain ResNets: torchvision's v1.5
    return dict(stride_in="3x3", bn_eps=1e-5)
  if "dinov3" in name:
    out.update(gelu="exact", ln_eps=1e-5, rope="dinov3", rope_theta=100.0, rope_ref=0, rope_offset=0.)
  elif name.startswith("eva02"):  # its RoPE on a 16 x 16 reference grid at every size
    out.update(gelu="exact", ln_eps=1e-6, rope="eva02", rope_theta=1e4, rope_ref=16, rope_offset=0.)
  elif name.startswith("vit_pe_core"):  # reference grid: the native one; 8-head attention pool
    grid = _GRID.search(name)
    out.update(gelu="exact", ln_eps=1e-5, rope="pe", rope_theta=1e4, map_heads=8,
               rope_offset=0. if "gigantic" in name else 1.)
    if grid:
      out["rope_ref"] = int(grid[2]) // int(grid[1])
  elif "siglip" in name:  # SigLIP and SigLIP 2 towers differ in their GELU: left assumed
    out.update(ln_eps=1e-6)
  elif "clip" in name:
    out.update(gelu="quick" if "quickgelu" in name else "exact", ln_eps=1e-5)
  elif name.startswith(("vit_", "deit")) and not any(k in name for k in ("pe_", "eva", "naflex")):
    out.update(gelu="exact", ln_eps=1e-6)  # timm's plain ViTs and DeiTs
  return out


class TimmConfig(Settings):
  """A timm file's settings: its hub config.json's (the architecture's name,
  model_args, pretrained_cfg), else assumed (and recorded so)."""

  def __init__(self, keys: Keys, what: str):
    super().__init__()
    config = keys.meta.config if keys.meta and "architecture" in keys.meta.config else None
    self.config, self.what = config, what
    self.known = architecture(config["architecture"]) if config else {}
    self.args = config.get("model_args") or {} if config else {}

  def get(self, field: str, cfg: dict, ev: dict, default: Any, why: str) -> None:
    """cfg[field] from config.json (its architecture, model_args or pretrained_cfg)."""
    if field == "image_size" and self.config:
      size = self.args.get("img_size") or (self.config.get("pretrained_cfg") or {}).get("input_size")
      if isinstance(size, (int, list, tuple)) and size:
        size = size[-1] if isinstance(size, (list, tuple)) else size
        return self.state(field, cfg, ev, int(size), f"config.json (timm) input size {size}")
    if field in self.known:
      return self.state(field, cfg, ev, self.known[field],
                        f"config.json architecture {self.config['architecture']!r}")
    return self.assume(field, cfg, ev, default,
                       f"not in the weights{' or config.json' * bool(self.config)}; {why}")

  def heads(self, cfg: dict, ev: dict, usual: int) -> None:
    """num_heads: model_args, else the architecture's size where the width agrees
    (64-wide heads, or `usual`, the width's published count), else `usual`, assumed."""
    if "num_heads" in self.args:
      return self.state("num_heads", cfg, ev, int(self.args["num_heads"]),
                        f"config.json model_args num_heads={self.args['num_heads']}")
    h = self.known.get("num_heads")
    if h and h != usual and cfg["width"] != 64 * h:  # a size word of another width (giant, plus)
      self.known = {k: v for k, v in self.known.items() if k != "num_heads"}
    return self.get("num_heads", cfg, ev, usual,
                    f"{usual} for width {cfg['width']} ({self.what}'s published models)")

  def pool(self, cfg: dict, ev: dict, default: str, why: str) -> None:
    pool = self.args.get("global_pool", self.config.get("global_pool")) if self.config else None
    if pool in _POOLS:
      return self.state("pool", cfg, ev, _POOLS[pool], f"config.json global_pool={pool!r}")
    return self.get("pool", cfg, ev, default, why)

  def policy(self) -> tuple[str, str] | None:
    """timm's evaluation transform from pretrained_cfg, as one of our policies."""
    pre = (self.config or {}).get("pretrained_cfg") or {}
    if not isinstance(pre, dict):
      return None
    mean, std = pre.get("mean"), pre.get("std")
    stat = next((k for k, v in preprocess.STATS.items() if mean and std and all(
        abs(a - b) < 1e-6 for a, b in zip((*mean, *std), (*v[0], *v[1])))), None)
    if pre.get("interpolation") != "bicubic" or pre.get("crop_mode", "center") != "center" or not stat:
      return None
    crop = pre.get("crop_pct", 0.875)
    return f"bicubic_crop{crop:g}_{stat}", f"its config.json (timm's pretrained_cfg: crop_pct {crop})"
