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

import re
from typing import Any

import numpy as np

from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models.formats import timm_config
from vitcnn_jax.models.formats import torch_layout
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading
from vitcnn_jax.models.vit import resize
from vitcnn_jax.models.vit import torch_pieces
from vitcnn_jax.models.vit.model import ATTN

FORMATS = {
    "timm": "timm's VisionTransformer state dict (.safetensors): fused qkv, (out, in) "
            "matrices, pos_embed with or without the prefix tokens' rows, optional "
            "cls_token / reg_token / norm_pre / ls1,ls2 / fc_norm / attn_pool",
}


def detect(flat: dict[str, np.ndarray]) -> str | None:
  if "patch_embed.proj.weight" in flat and any(k.startswith("blocks.") for k in flat):
    return "timm"
  return None


def adapt(cfg: dict, r: Reading, native: int | None, path: str) -> None:
  """Splits the attention tensors into heads; a learned position embedding is
  resampled as timm does (bicubic, antialiased: `resample_abs_pos_embed`'s defaults)."""
  torch_pieces.split_heads(cfg, r, path)
  resize.adapt(cfg, r, native, path, preprocess.bicubic_weights)


def _blocks(keys: Keys, p: dict, cfg: dict, ev: dict, assumed: list[str]) -> None:
  idx = keys.indices(r"blocks\.(\d+)\.")
  if not idx or idx[0] != 0:
    raise CheckpointError(f"{keys.path}: no blocks.0.* tensors found.")
  cfg["depth"], ev["depth"] = len(idx), f"blocks.0..{len(idx) - 1}"
  d = cfg["width"]
  s = timm_config.TimmConfig(keys, "timm")
  s.heads(cfg, ev, torch_pieces.usual_heads(d))
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
    torch_pieces.attention(keys, p, f"{ours}/{ATTN}", h,
                           [(f"{src}.attn.qkv", slice(j * d, (j + 1) * d)) for j in range(3)],
                           f"{src}.attn.proj")
    torch_layout.take_torch_norm(keys, p, f"{src}.norm2", f"{ours}/LayerNorm_1")
    kinds.add(torch_pieces.mlp(keys, p, f"{src}.mlp.fc1", f"{src}.mlp.fc2", f"{ours}/MlpBlock_0"))
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
  torch_pieces.attention(keys, p, f"MAPHead_0/{ATTN}", cfg["num_heads"],
                         [("attn_pool.q", slice(0, d)), ("attn_pool.kv", slice(0, d)),
                          ("attn_pool.kv", slice(d, 2 * d))], "attn_pool.proj")
  torch_layout.take_torch_norm(keys, p, "attn_pool.norm", "MAPHead_0/LayerNorm_0")
  if torch_pieces.mlp(keys, p, "attn_pool.mlp.fc1", "attn_pool.mlp.fc2",
                      "MAPHead_0/MlpBlock_0") != (cfg["mlp_dim"], cfg["mlp"]):
    raise CheckpointError(f"{keys.path}: {keys.shape('attn_pool.mlp.fc1.weight')} differs "
                             "from the blocks' MLP; our MAP head shares their width.")


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
  torch_pieces.tokens(keys, p, cfg, ev, assumed)
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
  s = timm_config.TimmConfig(keys, "timm")
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
    "block": {"LayerNorm_0": "norm1", "LayerNorm_1": "norm2", f"{ATTN}/query": "attn.qkv",
              f"{ATTN}/key": "attn.qkv", f"{ATTN}/value": "attn.qkv",
              f"{ATTN}/out": "attn.proj", "MlpBlock_0/Dense_0": "mlp.fc1",
              "MlpBlock_0/Dense_1": "mlp.fc2", "ls1": "ls1.gamma", "ls2": "ls2.gamma"},
    "map": {"probe": "latent", "LayerNorm_0": "norm", f"{ATTN}/query": "q",
            f"{ATTN}/key": "kv", f"{ATTN}/value": "kv", f"{ATTN}/out": "proj",
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
  if f"{ATTN}/out/kernel" in key:
    return v.reshape(-1, v.shape[-1]).T
  if ATTN in key:  # query/key/value: (D, H, hd) kernels, (H, hd) biases
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
    order = next((i for i, n in enumerate(_QKV) if f"{ATTN}/{n}/" in k), 0)
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
