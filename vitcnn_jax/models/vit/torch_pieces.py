"""The pieces of a ViT that torch state dicts share, read onto our tree: the
attention (query, key and value from fused or separate Linears, split into
heads), the MLP (plain, packed SwiGLU or gated), the number of heads of the
published widths, and timm's prefix tokens with their position embedding. timm's,
timm's Eva and transformers' readers are built of these."""

from __future__ import annotations

import math

import numpy as np

from vitcnn_jax.models.formats import torch_layout
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reading
from vitcnn_jax.models.vit.model import ATTN

# Heads of the published widths (head width 64, but SigLIP So400m: 1152 = 16 x 72,
# CLIP bigG: 1664 = 16 x 104); other widths assume 64-wide heads.
HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1152: 16, 1280: 16, 1408: 16, 1536: 24,
         1664: 16}


def usual_heads(width: int) -> int:
  """The heads of the published models of this width (a state dict does not say)."""
  return HEADS.get(width, max(width // 64, 1))


def split_heads(cfg: dict, r: Reading, path: str) -> None:
  """The attention tensors split into `num_heads` heads (a state dict does not
  say how many: an override may change the assumption)."""
  h, d = cfg["num_heads"], cfg["width"]
  if not isinstance(h, int) or h < 1 or d % h:
    raise ValueError(f"{path}: num_heads={h!r} does not divide the width {d}.")
  for k, v in r.params.items():
    if f"{ATTN}/out/kernel" in k:
      r.params[k] = v.reshape(h, d // h, v.shape[-1])
    elif any(f"{ATTN}/{q}/" in k for q in ("query", "key", "value")):
      r.params[k] = v.reshape(*v.shape[:-2], h, d // h)


def _heads(kernel: np.ndarray, bias: np.ndarray | None, h: int) -> tuple[np.ndarray, np.ndarray]:
  """(D, H*hd) and (H*hd,) as Flax DenseGeneral's (D, H, hd) and (H, hd)."""
  d, e = kernel.shape
  bias = np.zeros(e, kernel.dtype) if bias is None else bias  # qkv_bias=False: zero biases
  return kernel.reshape(d, h, e // h), bias.reshape(h, e // h)


def attention(keys: Keys, p: dict, ours: str, h: int, qkv: list[tuple[str, slice]],
              proj: str) -> None:
  """q/k/v from (slices of) torch Linears, and the output projection."""
  for name, (src, rows) in zip(("query", "key", "value"), qkv):
    w, b = torch_layout.take_torch_linear(keys, src, bias=False)
    w, b = w[:, rows], None if b is None else b[rows]
    p[f"{ours}/{name}/kernel"], p[f"{ours}/{name}/bias"] = _heads(w, b, h)
  w, b = torch_layout.take_torch_linear(keys, proj)
  p[f"{ours}/out/kernel"], p[f"{ours}/out/bias"] = w.reshape(h, -1, w.shape[1]), b


def mlp(keys: Keys, p: dict, fc1: str, fc2: str, ours: str) -> tuple[int, str]:
  """(hidden width, kind) of the Linears `fc1` then `fc2`: an fc1 twice as wide as
  fc2's input is a packed SwiGLU (timm's, transformers' DINOv2 weights_in)."""
  w1, b1 = torch_layout.take_torch_linear(keys, fc1)
  w2, b2 = torch_layout.take_torch_linear(keys, fc2)
  p[f"{ours}/Dense_0/kernel"], p[f"{ours}/Dense_0/bias"] = w1, b1
  p[f"{ours}/Dense_1/kernel"], p[f"{ours}/Dense_1/bias"] = w2, b2
  if w1.shape[1] == 2 * w2.shape[0]:
    return w2.shape[0], "swiglu"
  return w2.shape[0], "gelu"


def gated_mlp(keys: Keys, p: dict, gate: str, value: str, down: str, ours: str) -> int:
  """A SwiGLU stored as two linears, silu(gate(x)) * value(x), as our packed one
  (the gate's half first); its hidden width."""
  (wg, bg), (wv, bv) = (torch_layout.take_torch_linear(keys, n) for n in (gate, value))
  p[f"{ours}/Dense_0/kernel"], p[f"{ours}/Dense_0/bias"] = np.concatenate([wg, wv], 1), np.concatenate([bg, bv])
  p[f"{ours}/Dense_1/kernel"], p[f"{ours}/Dense_1/bias"] = torch_layout.take_torch_linear(keys, down)
  return wg.shape[1]


def _prefix_tokens(keys: Keys, cfg: dict, ev: dict) -> list[tuple[str, np.ndarray]]:
  """timm's class, distillation and register tokens, in the order they are prepended."""
  prefix = []
  if keys.has("cls_token"):
    prefix.append(("cls", keys.take("cls_token")))
  cfg["class_token"], ev["class_token"] = bool(prefix), "cls_token" + ("" if prefix else ": absent")
  cfg["num_registers"], ev["num_registers"] = 0, "reg_token: absent"
  cfg["distilled"], ev["distilled"] = keys.has("dist_token"), "dist_token" + (
      "" if keys.has("dist_token") else ": absent")
  if cfg["distilled"]:
    prefix.append(("dist", keys.take("dist_token")))
  if keys.has("reg_token"):
    prefix.append(("reg", keys.take("reg_token")))
    cfg["num_registers"], ev["num_registers"] = prefix[-1][1].shape[1], keys.shape("reg_token")
  return prefix


def tokens(keys: Keys, p: dict, cfg: dict, ev: dict, assumed: list[str]) -> None:
  """timm's prefix tokens, pooling and the position embedding (the prefix tokens'
  rows folded into them, as ours keep their own)."""
  prefix = _prefix_tokens(keys, cfg, ev)
  pe = keys.take("pos_embed")
  rows, n = pe.shape[1], sum(t.shape[1] for _, t in prefix)
  square = lambda k: k > 0 and math.isqrt(k) ** 2 == k
  if n and square(rows - n) and not square(rows):  # the prefix tokens' rows come first
    at = 0
    for name, t in prefix:
      p[name] = t + pe[:, at:at + t.shape[1]]
      at += t.shape[1]
    pe = pe[:, n:]
  elif square(rows):  # no_embed_class: the tokens carry no position embedding
    p.update(prefix)
  else:
    raise CheckpointError(
        f"{keys.path}: {keys.shape('pos_embed')} is neither a square grid nor one after "
        f"{n} prefix token row(s) ({[name for name, _ in prefix]}); non-square grids need "
        "resolution=(height, width) and a square embedding.")
  p["pos_embedding"] = pe
  g = math.isqrt(pe.shape[1])
  cfg["posemb"], ev["posemb"] = "learn", keys.shape("pos_embed")
  cfg["image_size"], ev["image_size"] = g * cfg["patch_size"], keys.shape("pos_embed")
  if keys.has("attn_pool.latent"):
    cfg["pool"], ev["pool"] = "map", keys.shape("attn_pool.latent")
  elif cfg["fc_norm"]:
    cfg["pool"], ev["pool"] = "gap", "fc_norm: timm's global_pool 'avg'"
  elif cfg["class_token"]:
    cfg["pool"], ev["pool"] = "token", "cls_token, no fc_norm or attn_pool: timm's 'token'"
  else:
    cfg["pool"] = "gap"
    ev["pool"] = "no cls_token, fc_norm or attn_pool: the spatial tokens' mean"
    assumed.append("pool")
