"""ViT state dicts in timm's layout (`.safetensors`): DeiT, DeiT III, DINO,
DINOv2 (with and without registers), MAE, and CLIP / OpenCLIP / SigLIP image
towers as timm and Hugging Face publish them.

The mapping onto our Flax tree is exact: PyTorch's (out, in) matrices are
transposed, the fused `qkv` matrix is split into query/key/value per head, the
prefix tokens' rows of `pos_embed` are folded into the tokens (our prefix
tokens carry their own embedding), `attn_pool` becomes `MAPHead_0`. What a
state dict cannot say (the GELU, LayerNorm eps, number of heads, and pooling
of a file without class token, fc_norm or attention pool) is assumed from
timm's defaults for the architecture and reported as assumed.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models.formats import timm_config
from vitcnn_jax.models.formats import torch_layout
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading
from vitcnn_jax.models.vit import google

FORMATS = {
    "timm": "timm's VisionTransformer state dict (.safetensors): fused qkv, (out, in) "
            "matrices, pos_embed with or without the prefix tokens' rows, optional "
            "cls_token / reg_token / norm_pre / ls1,ls2 / fc_norm / attn_pool",
}
# Heads of the published widths (head width 64, but SigLIP So400m: 1152 = 16 x 72,
# CLIP bigG: 1664 = 16 x 104); other widths assume 64-wide heads.
HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1152: 16, 1280: 16, 1408: 16, 1536: 24,
          1664: 16}
_ATTN = "MultiHeadDotProductAttention_0"


def detect(flat: dict[str, np.ndarray]) -> str | None:
  if "patch_embed.proj.weight" in flat and any(k.startswith("blocks.") for k in flat):
    return "timm"
  return None


def resample_posemb(pe: np.ndarray, old_grid: tuple[int, int], new_grid: tuple[int, int],
                    weights=preprocess.bicubic_weights) -> np.ndarray:
  """timm's resampling of a loaded embedding to another grid: bicubic,
  antialiased, align_corners=False (`resample_abs_pos_embed`'s defaults); or
  separable with other `weights(n_in, n_out)` matrices."""
  if tuple(old_grid) == tuple(new_grid):
    return pe
  grid = pe.reshape(old_grid[0], old_grid[1], -1).astype(np.float64)
  rows, cols = (weights(o, n) for o, n in zip(old_grid, new_grid))
  grid = np.einsum("ij,jkd,lk->ild", rows, grid, cols)
  return grid.reshape(1, new_grid[0] * new_grid[1], -1).astype(pe.dtype)


def adapt(cfg: dict, r: Reading, native: int | None, path: str) -> None:
  """Splits the attention tensors into heads, then as Google's ViTs, resampling
  the position embedding as timm does."""
  split_heads(cfg, r, path)
  google.adapt(cfg, r, native, path, resample=resample_posemb)


def split_heads(cfg: dict, r: Reading, path: str) -> None:
  """The attention tensors split into `num_heads` heads (a state dict does not
  say how many: an override may change the assumption)."""
  h, d = cfg["num_heads"], cfg["width"]
  if not isinstance(h, int) or h < 1 or d % h:
    raise ValueError(f"{path}: num_heads={h!r} does not divide the width {d}.")
  for k, v in r.params.items():
    if f"{_ATTN}/out/kernel" in k:
      r.params[k] = v.reshape(h, d // h, v.shape[-1])
    elif any(f"{_ATTN}/{q}/" in k for q in ("query", "key", "value")):
      r.params[k] = v.reshape(*v.shape[:-2], h, d // h)


def _heads(kernel: np.ndarray, bias: np.ndarray | None, h: int) -> tuple[np.ndarray, np.ndarray]:
  """(D, H*hd) and (H*hd,) as Flax DenseGeneral's (D, H, hd) and (H, hd)."""
  d, e = kernel.shape
  bias = np.zeros(e, kernel.dtype) if bias is None else bias  # qkv_bias=False: zero biases
  return kernel.reshape(d, h, e // h), bias.reshape(h, e // h)


def attention(keys: Keys, p: dict, ours: str, h: int, qkv: list[tuple[str, slice]],
               proj: str) -> None:
  """q/k/v from (slices of) timm Linears, and the output projection."""
  for name, (src, rows) in zip(("query", "key", "value"), qkv):
    w, b = torch_layout.take_torch_linear(keys, src, bias=False)
    w, b = w[:, rows], None if b is None else b[rows]
    p[f"{ours}/{name}/kernel"], p[f"{ours}/{name}/bias"] = _heads(w, b, h)
  w, b = torch_layout.take_torch_linear(keys, proj)
  p[f"{ours}/out/kernel"], p[f"{ours}/out/bias"] = w.reshape(h, -1, w.shape[1]), b


def mlp(keys: Keys, p: dict, name: str, ours: str) -> tuple[int, str]:
  """(hidden width, kind): fc1 twice as wide as fc2's input is timm's packed SwiGLU."""
  w1, b1 = torch_layout.take_torch_linear(keys, f"{name}.fc1")
  w2, b2 = torch_layout.take_torch_linear(keys, f"{name}.fc2")
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


def _blocks(keys: Keys, p: dict, cfg: dict, ev: dict, assumed: list[str]) -> None:
  idx = keys.indices(r"blocks\.(\d+)\.")
  if not idx or idx[0] != 0:
    raise CheckpointError(f"{keys.path}: no blocks.0.* tensors found.")
  cfg["depth"], ev["depth"] = len(idx), f"blocks.0..{len(idx) - 1}"
  d = cfg["width"]
  s = timm_config.Settings(keys, "timm")
  s.heads(cfg, ev, HEADS.get(d, max(d // 64, 1)))
  assumed += s.assumed
  h = cfg["num_heads"]
  scaled = [keys.has(f"blocks.{i}.ls1.gamma") for i in idx]
  if any(scaled) and not all(scaled):
    raise CheckpointError(f"{keys.path}: layer scale (blocks.N.ls1.gamma) in blocks "
                             f"{[i for i in idx if scaled[i]]} only; expected all or none.")
  cfg["layer_scale"] = all(scaled)
  ev["layer_scale"] = "blocks.N.ls1.gamma" + ("" if all(scaled) else ": absent")
  kinds = set()
  for i in idx:
    src, ours = f"blocks.{i}", f"Transformer/encoderblock_{i}"
    torch_layout.take_torch_norm(keys, p, f"{src}.norm1", f"{ours}/LayerNorm_0")
    attention(keys, p, f"{ours}/MultiHeadDotProductAttention_0", h,
               [(f"{src}.attn.qkv", slice(j * d, (j + 1) * d)) for j in range(3)],
               f"{src}.attn.proj")
    torch_layout.take_torch_norm(keys, p, f"{src}.norm2", f"{ours}/LayerNorm_1")
    kinds.add(mlp(keys, p, f"{src}.mlp", f"{ours}/MlpBlock_0"))
    if cfg["layer_scale"]:
      p[f"{ours}/ls1"] = keys.take(f"{src}.ls1.gamma")
      p[f"{ours}/ls2"] = keys.take(f"{src}.ls2.gamma")
  if len(kinds) > 1:
    raise CheckpointError(f"{keys.path}: the blocks' MLPs differ ({sorted(kinds)}; width, "
                             "kind); one ViT has one MLP shape.")
  (cfg["mlp_dim"], cfg["mlp"]), = kinds
  ev["mlp_dim"] = ev["mlp"] = f"{keys.shape('blocks.0.mlp.fc1.weight')}, " + keys.shape(
      "blocks.0.mlp.fc2.weight")
  if keys.has("norm.weight"):
    torch_layout.take_torch_norm(keys, p, "norm", "Transformer/encoder_norm")
    cfg["fc_norm"], ev["fc_norm"] = False, keys.shape("norm.weight")
  else:
    torch_layout.take_torch_norm(keys, p, "fc_norm", "fc_norm")
    cfg["fc_norm"], ev["fc_norm"] = True, keys.shape("fc_norm.weight")


def _map_head(keys: Keys, p: dict, cfg: dict) -> None:
  latent = keys.take("attn_pool.latent")
  if latent.shape[:2] != (1, 1):
    raise CheckpointError(f"{keys.path}: {keys.shape('attn_pool.latent')}: one latent "
                             "query is supported (timm's latent_len=1).")
  d = cfg["width"]
  p["MAPHead_0/probe"] = latent
  attention(keys, p, "MAPHead_0/MultiHeadDotProductAttention_0", cfg["num_heads"],
             [("attn_pool.q", slice(0, d)), ("attn_pool.kv", slice(0, d)),
              ("attn_pool.kv", slice(d, 2 * d))], "attn_pool.proj")
  torch_layout.take_torch_norm(keys, p, "attn_pool.norm", "MAPHead_0/LayerNorm_0")
  if mlp(keys, p, "attn_pool.mlp", "MAPHead_0/MlpBlock_0") != (cfg["mlp_dim"], cfg["mlp"]):
    raise CheckpointError(f"{keys.path}: {keys.shape('attn_pool.mlp.fc1.weight')} differs "
                             "from the blocks' MLP; our MAP head shares their width.")


def tokens(keys: Keys, p: dict, cfg: dict, ev: dict, assumed: list[str]) -> None:
  """Prefix tokens, pooling and the position embedding (prefix rows folded)."""
  prefix = []
  if keys.has("cls_token"):
    prefix.append(("cls", keys.take("cls_token")))
  cfg["class_token"], ev["class_token"] = bool(prefix), "cls_token" + ("" if prefix else
                                                                         ": absent")
  cfg["num_registers"], ev["num_registers"] = 0, "reg_token: absent"
  cfg["distilled"], ev["distilled"] = keys.has("dist_token"), "dist_token" + (
      "" if keys.has("dist_token") else ": absent")
  if cfg["distilled"]:
    prefix.append(("dist", keys.take("dist_token")))
  if keys.has("reg_token"):
    prefix.append(("reg", keys.take("reg_token")))
    cfg["num_registers"], ev["num_registers"] = prefix[-1][1].shape[1], keys.shape("reg_token")
  pe = keys.take("pos_embed")
  rows, n = pe.shape[1], sum(t.shape[1] for _, t in prefix)
  square = lambda k: k > 0 and math.isqrt(k) ** 2 == k  # noqa: E731
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


def read(keys: Keys) -> Reading:
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  assumed: list[str] = []
  w = keys.take("patch_embed.proj.weight")
  if w.ndim != 4 or w.shape[1] != 3:
    raise CheckpointError(f"{keys.path}: {keys.shape('patch_embed.proj.weight')} is not a "
                             "(width, 3, patch, patch) convolution.")
  p["embedding/kernel"] = w.transpose(2, 3, 1, 0)
  cfg["patch_size"] = w.shape[2] if w.shape[2] == w.shape[3] else tuple(w.shape[2:])
  cfg["width"] = w.shape[0]
  ev["patch_size"] = ev["width"] = keys.shape("patch_embed.proj.weight")
  cfg["patch_bias"] = keys.has("patch_embed.proj.bias")
  ev["patch_bias"] = "patch_embed.proj.bias" + ("" if cfg["patch_bias"] else ": absent")
  if cfg["patch_bias"]:
    p["embedding/bias"] = keys.take("patch_embed.proj.bias")
  cfg["pre_norm"] = keys.has("norm_pre.weight")
  ev["pre_norm"] = "norm_pre.weight" + ("" if cfg["pre_norm"] else ": absent")
  if cfg["pre_norm"]:
    torch_layout.take_torch_norm(keys, p, "norm_pre", "norm_pre")
  _blocks(keys, p, cfg, ev, assumed)
  tokens(keys, p, cfg, ev, assumed)
  if cfg["distilled"] and cfg["pool"] != "token":
    raise CheckpointError(f"{keys.path}: a dist_token needs a cls_token and no fc_norm "
                             "(DeiT's distilled head reads both tokens).")
  if cfg["pool"] == "map":
    _map_head(keys, p, cfg)
  if keys.has("head.weight"):
    for head in ("head", "head_dist")[:1 + cfg["distilled"]]:
      p[f"{head}/kernel"], bias = torch_layout.take_torch_linear(keys, head, bias=False)
      if bias is not None:
        p[f"{head}/bias"] = bias
    cfg["num_classes"], ev["num_classes"] = p["head/kernel"].shape[1], keys.shape("head.weight")
    cfg["head_bias"] = "head/bias" in p
  else:
    cfg["num_classes"], ev["num_classes"] = None, "no head.weight in the file"
  cfg["representation_size"] = None
  # Numerics no tensor records: its config.json's architecture, else timm's defaults
  # (CLIP towers, told by norm_pre: eps 1e-5).
  s = timm_config.Settings(keys, "timm")
  s.get("gelu", cfg, ev, "exact", "timm's default nn.GELU (erf)")
  clip = cfg["pre_norm"]
  s.get("ln_eps", cfg, ev, 1e-5 if clip else 1e-6,
        "CLIP's 1e-5 (the file has norm_pre)" if clip else "timm's ViT default 1e-6")
  if s.config:
    if "pool" in assumed:
      assumed.remove("pool")
      s.pool(cfg, ev, cfg["pool"], ev["pool"])
  return Reading(keys.fmt, cfg, ev, p, tuple(assumed + s.assumed), policy=s.policy())


_NAMES = {  # our sub-tree -> timm's module, per scope: top level, block, MAP head
    "": {"embedding": "patch_embed.proj", "cls": "cls_token", "reg": "reg_token",
         "pos_embedding": "pos_embed", "norm_pre": "norm_pre", "fc_norm": "fc_norm",
         "Transformer/encoder_norm": "norm", "head": "head", "dist": "dist_token",
         "head_dist": "head_dist"},
    "block": {"LayerNorm_0": "norm1", "LayerNorm_1": "norm2", f"{_ATTN}/query": "attn.qkv",
              f"{_ATTN}/key": "attn.qkv", f"{_ATTN}/value": "attn.qkv",
              f"{_ATTN}/out": "attn.proj", "MlpBlock_0/Dense_0": "mlp.fc1",
              "MlpBlock_0/Dense_1": "mlp.fc2", "ls1": "ls1.gamma", "ls2": "ls2.gamma"},
    "map": {"probe": "latent", "LayerNorm_0": "norm", f"{_ATTN}/query": "q",
            f"{_ATTN}/key": "kv", f"{_ATTN}/value": "kv", f"{_ATTN}/out": "proj",
            "MlpBlock_0/Dense_0": "mlp.fc1", "MlpBlock_0/Dense_1": "mlp.fc2"},
}
_QKV = ("query", "key", "value")


def _timm_name(key: str) -> str:
  if m := re.fullmatch(r"Transformer/encoderblock_(\d+)/(.+)", key):
    base, rest, names = f"blocks.{m[1]}.", m[2], _NAMES["block"]
  elif key.startswith("MAPHead_0/"):
    base, rest, names = "attn_pool.", key[len("MAPHead_0/"):], _NAMES["map"]
  else:
    base, rest, names = "", key, _NAMES[""]
  for ours, theirs in names.items():
    if rest == ours or rest.startswith(ours + "/"):
      leaf = rest[len(ours) + 1:]
      return base + theirs + (f".{torch_layout.TORCH_LEAVES[leaf]}" if leaf else "")
  raise ValueError(f"No timm name for parameter {key!r}.")


def _torch_layout(key: str, v: np.ndarray) -> np.ndarray:
  if key == "embedding/kernel":
    return v.transpose(3, 2, 0, 1)
  if f"{_ATTN}/out/kernel" in key:
    return v.reshape(-1, v.shape[-1]).T
  if _ATTN in key:  # query/key/value: (D, H, hd) kernels, (H, hd) biases
    return v.reshape(v.shape[0], -1).T if key.endswith("kernel") else v.reshape(-1)
  return v.T if key.endswith("kernel") else v


def write(model, flat: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
  """Our params under timm's names and layouts: a state dict that timm's ViT,
  built with the model's options and no_embed_class=True, loads strictly."""
  del fmt
  if (model.rope or model.pool == "token_gap" or model.mlp_norm or model.map_heads or model.map_prefix
      or model.attn_norm):
    raise ValueError("timm's VisionTransformer has no rotary embedding, pool 'token_gap', MLP "
                     "norm or attention pool of its own heads; this model is read, not written.")
  if model.posemb != "learn" or model.pool == "0" or model.representation_size or model.no_skip:
    raise ValueError("timm's ViT has no fixed sin-cos embedding, pool '0', pre_logits or "
                     "blocks without skips; save this model as an npz (big_vision).")
  pieces: dict[str, list[tuple[int, np.ndarray]]] = {}
  for k, v in flat.items():
    order = next((i for i, n in enumerate(_QKV) if f"{_ATTN}/{n}/" in k), 0)
    pieces.setdefault(_timm_name(k), []).append((order, _torch_layout(k, v)))
  return {k: np.concatenate([v for _, v in sorted(ps, key=lambda t: t[0])])
          if len(ps) > 1 else ps[0][1] for k, ps in pieces.items()}


READER = Reader(
    formats=FORMATS,
    policy="bicubic_crop0.9_imagenet",  # timm's DeiT and MAE evaluation (zoo names set others)
    detect=detect,
    read=read,
    overridable=("gelu", "ln_eps", "num_heads", "no_skip", "patch_size"),
    adapt=adapt,
    write=write,
    suffix=".safetensors",
)
