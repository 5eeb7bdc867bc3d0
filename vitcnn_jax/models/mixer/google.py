"""MLP-Mixer checkpoints: vision_transformer and big_vision write the same names
(`stem`, `MixerBlock_i`, `pre_head_layer_norm`, `head`) and the same arithmetic."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vitcnn_jax.models import sizes
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading, take_head

FORMATS = {"mixer": "vision_transformer / big_vision MLP-Mixer: stem, MixerBlock_i/"
                    "{token,channel}_mixing, pre_head_layer_norm; the token MLP fixes the size"}
_LN = ("scale", "bias")
_MLP = tuple(f"Dense_{i}/{l}" for i in (0, 1) for l in ("kernel", "bias"))


def detect(flat: dict[str, np.ndarray]) -> str | None:
  if "stem/kernel" in flat and any(k.startswith("MixerBlock_") for k in flat):
    return "mixer"
  return None


def read(keys: Keys) -> Reading:
  p: dict[str, np.ndarray] = {}
  stem = keys.take("stem/kernel")
  p["stem/kernel"], p["stem/bias"] = stem, keys.take("stem/bias")
  idx = keys.indices(r"MixerBlock_(\d+)/")
  if not idx or idx[0] != 0:
    raise CheckpointError(f"{keys.path}: no MixerBlock_0 found.")
  for i in idx:
    for sub, leaves in (("LayerNorm_0", _LN), ("token_mixing", _MLP),
                        ("LayerNorm_1", _LN), ("channel_mixing", _MLP)):
      for leaf in leaves:
        p[f"MixerBlock_{i}/{sub}/{leaf}"] = keys.take(f"MixerBlock_{i}/{sub}/{leaf}")
  for leaf in _LN:
    p[f"pre_head_layer_norm/{leaf}"] = keys.take(f"pre_head_layer_norm/{leaf}")
  tok = p["MixerBlock_0/token_mixing/Dense_0/kernel"]
  patch = stem.shape[0] if stem.shape[0] == stem.shape[1] else tuple(stem.shape[:2])
  g = math.isqrt(tok.shape[0])
  cfg: dict[str, Any] = dict(
      patch_size=patch, hidden_dim=stem.shape[-1], num_blocks=len(idx),
      tokens_mlp_dim=tok.shape[1],
      channels_mlp_dim=p["MixerBlock_0/channel_mixing/Dense_0/kernel"].shape[1],
      image_size=g * stem.shape[0] if g * g == tok.shape[0] and stem.shape[0] == stem.shape[1] else None)
  token_kernel = keys.shape("MixerBlock_0/token_mixing/Dense_0/kernel")
  ev = dict(patch_size=keys.shape("stem/kernel"), hidden_dim=keys.shape("stem/kernel"),
            num_blocks=f"MixerBlock_0..{len(idx) - 1}", tokens_mlp_dim=token_kernel,
            image_size=token_kernel,
            channels_mlp_dim=keys.shape("MixerBlock_0/channel_mixing/Dense_0/kernel"))
  take_head(keys, p, cfg, ev)
  return Reading(keys.fmt, cfg, ev, p)


def adapt(cfg: dict, r: Reading, native: int | None, path: str) -> None:
  """The token-mixing MLP fixes the number of tokens, so the resolution too."""
  if cfg.get("image_size") is None:
    raise CheckpointError(
        f"{path}: cannot infer a square input size from {r.evidence['image_size']}; pass "
        "resolution=(height, width).")
  if native is not None and sizes.to_pair(cfg["image_size"]) != (native, native):
    raise CheckpointError(
        f"{path}: a Mixer's token-mixing MLP fixes its input to {native}x{native} "
        f"({r.evidence['image_size']}); resolution={cfg['image_size']!r} is not possible.")


def write(model, flat: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
  del model, fmt
  return flat


READER = Reader(
    formats=FORMATS,
    policy="resize",  # the Mixer release's evaluation, as vision_transformer's
    detect=detect,
    read=read,
    overridable=("gelu",),  # tanh GELU like every upstream
    adapt=adapt,
    write=write,
    suffix=".npz",
)
