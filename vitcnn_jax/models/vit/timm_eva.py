"""RoPE ViTs in timm's `Eva` layout (`.safetensors`): DINOv3, EVA-02 and the
Perception Encoder (PE core) as timm publishes them.

Names: patch_embed.proj, cls_token, reg_token, pos_embed (EVA-02, PE; the prefix
tokens' rows first), norm_pre (PE), blocks.N.{norm1, attn.qkv (with attn.q_bias and
attn.v_bias, the key's zero; or a whole attn.qkv.bias, PE's) or attn.{q,k,v}_proj
(EVA-02 B/L, the key without bias), attn.proj, gamma_1, norm2, mlp.fc1/fc2 (packed
SwiGLU when fc1 is twice as wide) or mlp.fc1_g/fc1_x[/norm]/fc2, gamma_2}, norm or
fc_norm, attn_pool (PE), head. Rotary embeddings of the patch tokens: DINOv3's,
EVA-02's or PE's (`vit.rotary`); the last two rotate pairs of neighbouring dims,
which the reader turns into ours by reordering each head's query and key dims.

What the weights cannot say (which rotary embedding and its reference grid, heads,
LayerNorm eps, the pool's heads, timm's pooling) comes from the timm config.json
beside the file (`timm_config.py`), else is assumed (DINOv3's without a
`pos_embed`, else EVA-02's, or PE's with an attention pool) and reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models.formats import timm_config
from vitcnn_jax.models.formats import torch_layout
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading
from vitcnn_jax.models.vit import resize
from vitcnn_jax.models.vit import torch_pieces
from vitcnn_jax.models.vit.model import ATTN

FORMATS = {"timm_eva": "timm's Eva state dict (.safetensors) of a RoPE ViT (DINOv3, EVA-02, "
                       "Perception Encoder): q_bias/v_bias or q/k/v_proj, gamma_1/gamma_2, "
                       "SwiGLU fc1_g/fc1_x, rotary embeddings"}
_EVA_ONLY = ("blocks.0.gamma_1", "blocks.0.attn.q_bias", "blocks.0.mlp.fc1_g.weight",
             "blocks.0.attn.q_proj.weight")
# Without a config.json: (rope, theta, ref, offset, eps, why), told by what the file has.
_GUESSES = {"dinov3": ("dinov3", 100.0, 0, 0., 1e-5, "no pos_embed: DINOv3's"),
            "eva02": ("eva02", 1e4, 16, 0., 1e-6, "a pos_embed, no attn_pool: EVA-02's"),
            "pe": ("pe", 1e4, 0, 1., 1e-5, "a pos_embed and an attn_pool: the Perception Encoder's")}


_PE = ("cls_token", "norm_pre.weight", "attn_pool.latent")  # a class token, pre-norm and a pool


def detect(flat: dict[str, np.ndarray]) -> str | None:
  """Eva's own names, or a ViT without pos_embed (DINOv3's), or PE's signature: a
  class token beside a pre-norm and an attention pool (no timm ViT has the three)."""
  if "patch_embed.proj.weight" in flat and (any(k in flat for k in _EVA_ONLY) or (
      "pos_embed" not in flat and "blocks.0.attn.qkv.weight" in flat) or all(k in flat for k in _PE)):
    return "timm_eva"
  return None


def _qkv(keys: Keys, src: str, d: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """(kernel (D, D), bias) of the query, key and value, from whichever form the file has."""
  if keys.has(f"{src}.attn.q_proj.weight"):
    return [torch_layout.take_torch_linear(keys, f"{src}.attn.{q}_proj", bias=False) for q in "qkv"]
  w = keys.take(f"{src}.attn.qkv.weight")
  if w.shape != (3 * d, d):
    raise CheckpointError(f"{keys.path}: {keys.shape(src + '.attn.qkv.weight')} should be "
                             f"({3 * d}, {d}).")
  if keys.has(f"{src}.attn.qkv.bias"):
    b = keys.take(f"{src}.attn.qkv.bias")
    biases = [b[j * d:(j + 1) * d] for j in range(3)]
  else:
    biases = [keys.take(f"{src}.attn.{q}_bias") if keys.has(f"{src}.attn.{q}_bias") else None
              for q in "qkv"]
  return [(w[j * d:(j + 1) * d].T, biases[j]) for j in range(3)]


def _attention(keys: Keys, p: dict, src: str, ours: str, d: int) -> None:
  """q, k, v and the output projection as one head (`adapt` splits them)."""
  for name, (w, b) in zip(("query", "key", "value"), _qkv(keys, src, d)):
    b = np.zeros(d, w.dtype) if b is None else b
    p[f"{ours}/{name}/kernel"], p[f"{ours}/{name}/bias"] = w.reshape(d, 1, d), b.reshape(1, d)
  w, b = torch_layout.take_torch_linear(keys, f"{src}.attn.proj")
  p[f"{ours}/out/kernel"], p[f"{ours}/out/bias"] = w.reshape(1, d, d), b


def _mlp(keys: Keys, p: dict, src: str, ours: str) -> tuple[int, str, bool]:
  """(hidden width, kind, inner norm): timm's SwiGLU (silu(fc1_g) * fc1_x) as our packed one."""
  if not keys.has(f"{src}.mlp.fc1_g.weight"):
    return (*torch_pieces.mlp(keys, p, f"{src}.mlp.fc1", f"{src}.mlp.fc2", ours), False)
  hidden = torch_pieces.gated_mlp(keys, p, f"{src}.mlp.fc1_g", f"{src}.mlp.fc1_x", f"{src}.mlp.fc2",
                                  ours)
  norm = keys.has(f"{src}.mlp.norm.weight")
  if norm:
    torch_layout.take_torch_norm(keys, p, f"{src}.mlp.norm", f"{ours}/norm")
  return hidden, "swiglu", norm


def _blocks(keys: Keys, p: dict, cfg: dict, ev: dict) -> None:
  idx = keys.indices(r"blocks\.(\d+)\.")
  if not idx or idx[0] != 0:
    raise CheckpointError(f"{keys.path}: no blocks.0.* tensors found.")
  cfg["attn_norm"] = keys.has("blocks.0.attn.norm.weight")  # EVA-02's CLIP towers
  ev["attn_norm"] = "blocks.0.attn.norm.weight" + ("" if cfg["attn_norm"] else ": absent")
  cfg["depth"], ev["depth"] = len(idx), f"blocks.0..{len(idx) - 1}"
  d, kinds = cfg["width"], set()
  cfg["layer_scale"] = keys.has("blocks.0.gamma_1")
  ev["layer_scale"] = "blocks.0.gamma_1" + ("" if cfg["layer_scale"] else ": absent")
  for i in idx:
    src, ours = f"blocks.{i}", f"Transformer/encoderblock_{i}"
    torch_layout.take_torch_norm(keys, p, f"{src}.norm1", f"{ours}/LayerNorm_0")
    _attention(keys, p, src, f"{ours}/{ATTN}", d)
    if cfg["attn_norm"]:
      torch_layout.take_torch_norm(keys, p, f"{src}.attn.norm", f"{ours}/{ATTN}/norm")
    torch_layout.take_torch_norm(keys, p, f"{src}.norm2", f"{ours}/LayerNorm_1")
    kinds.add(_mlp(keys, p, src, f"{ours}/MlpBlock_0"))
    if cfg["layer_scale"]:
      p[f"{ours}/ls1"], p[f"{ours}/ls2"] = keys.take(f"{src}.gamma_1"), keys.take(f"{src}.gamma_2")
  if len(kinds) > 1:
    raise CheckpointError(f"{keys.path}: the blocks' MLPs differ ({sorted(kinds)}).")
  (cfg["mlp_dim"], cfg["mlp"], cfg["mlp_norm"]), = kinds
  ev["mlp_dim"] = ev["mlp"] = ev["mlp_norm"] = keys.shape("blocks.0.mlp.fc2.weight")


def _rope(keys: Keys, s: timm_config.TimmConfig, cfg: dict, ev: dict) -> None:
  """Which rotary embedding: config.json's architecture, else told by the file."""
  if s.config and "rope" not in s.known:
    raise CheckpointError(
        f"{keys.path}: config.json architecture {s.config['architecture']!r} is an Eva-layout model "
        "whose rotary embedding (if any) we do not know; DINOv3's, EVA-02's and PE core's are read.")
  guess = "dinov3" if not keys.has("pos_embed") else "pe" if keys.has("attn_pool.latent") else "eva02"
  rope, theta, ref, offset, eps, why = _GUESSES[guess]
  s.get("rope", cfg, ev, rope, f"{why} rotary embedding")
  s.get("rope_theta", cfg, ev, theta, f"{why} base")
  s.get("rope_ref", cfg, ev, ref if guess != "pe" else cfg["image_size"] // cfg["patch_size"],
        f"{why} reference grid")
  s.get("rope_offset", cfg, ev, offset, f"{why} index offset")
  s.get("ln_eps", cfg, ev, eps, f"{why} LayerNorm eps")


def _pool(keys: Keys, p: dict, s: timm_config.TimmConfig, cfg: dict, ev: dict) -> None:
  """PE's attention pool (its own heads, over every token), else timm's pooling."""
  if not keys.has("attn_pool.latent"):
    s.pool(cfg, ev, "gap", "timm's Eva default global_pool 'avg': the patch tokens' mean")
    return
  d = cfg["width"]
  cfg["pool"], cfg["map_prefix"], ev["pool"] = "map", True, keys.shape("attn_pool.latent")
  ev["map_prefix"] = "timm's attn_pool reads every token"
  s.get("map_heads", cfg, ev, 8, "the Perception Encoder's 8")
  p["MAPHead_0/probe"] = keys.take("attn_pool.latent")
  torch_pieces.attention(keys, p, f"MAPHead_0/{ATTN}", 1,
                         [("attn_pool.q", slice(0, d)), ("attn_pool.kv", slice(0, d)),
                          ("attn_pool.kv", slice(d, 2 * d))], "attn_pool.proj")
  torch_layout.take_torch_norm(keys, p, "attn_pool.norm", "MAPHead_0/LayerNorm_0")
  torch_pieces.mlp(keys, p, "attn_pool.mlp.fc1", "attn_pool.mlp.fc2", "MAPHead_0/MlpBlock_0")


def _embedding(keys: Keys, p: dict, cfg: dict, ev: dict) -> None:
  w = keys.take("patch_embed.proj.weight")
  p["embedding/kernel"] = w.transpose(2, 3, 1, 0)
  cfg["width"], cfg["patch_size"] = w.shape[0], w.shape[2]
  ev["width"] = ev["patch_size"] = keys.shape("patch_embed.proj.weight")
  cfg["patch_bias"] = keys.has("patch_embed.proj.bias")
  if cfg["patch_bias"]:
    p["embedding/bias"] = keys.take("patch_embed.proj.bias")
  cfg["pre_norm"] = keys.has("norm_pre.weight")
  if cfg["pre_norm"]:
    torch_layout.take_torch_norm(keys, p, "norm_pre", "norm_pre")
  ev["pre_norm"] = "norm_pre.weight" + ("" if cfg["pre_norm"] else ": absent")


def read(keys: Keys) -> Reading:
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {"distilled": False, "representation_size": None}
  ev: dict[str, str] = {}
  assumed: list[str] = []
  _embedding(keys, p, cfg, ev)
  s = timm_config.TimmConfig(keys, "timm's Eva")
  s.heads(cfg, ev, torch_pieces.usual_heads(cfg["width"]))
  cfg["fc_norm"] = keys.has("fc_norm.weight")
  torch_layout.take_torch_norm(keys, p, "fc_norm" if cfg["fc_norm"] else "norm",
                     "fc_norm" if cfg["fc_norm"] else "Transformer/encoder_norm")
  ev["fc_norm"] = "fc_norm.weight" + ("" if cfg["fc_norm"] else ": absent")
  if keys.has("pos_embed"):  # the prefix tokens' rows folded into them, as timm's ViTs
    torch_pieces.tokens(keys, p, cfg, ev, assumed)
    cfg.pop("pool")  # `_pool`'s
    assumed.clear()
  else:
    cfg.update(posemb="none", class_token=keys.has("cls_token"), num_registers=0)
    ev["posemb"] = "no pos_embed: rotary embeddings only"
    p.update((n, keys.take(t)) for n, t in (("cls", "cls_token"), ("reg", "reg_token")) if keys.has(t))
    if "reg" in p:
      cfg["num_registers"], ev["num_registers"] = p["reg"].shape[1], keys.shape("reg_token")
    s.get("image_size", cfg, ev, 256, "timm's DINOv3 input size 256")
  _rope(keys, s, cfg, ev)
  _blocks(keys, p, cfg, ev)
  _pool(keys, p, s, cfg, ev)
  torch_layout.take_head_torch(keys, p, cfg, ev)
  s.get("gelu", cfg, ev, "exact", "timm's nn.GELU (erf)")
  return Reading(keys.fmt, cfg, ev, p, tuple(assumed + s.assumed), policy=s.policy())


def adapt(cfg: dict, r: Reading, native: int | None, path: str) -> None:
  """Heads split (the pool's into its own count); for EVA-02's and PE's rotations
  of dims 2i and 2i+1, each head's query and key dims reordered, evens then odds:
  ours rotates dims i and i + hd/2, and a query-key dot product is the same in
  either order. A learned position embedding resampled as timm does."""
  pool = {k: r.params.pop(k) for k in list(r.params) if k.startswith("MAPHead_0/")}
  torch_pieces.split_heads(cfg, r, path)
  if pool:
    torch_pieces.split_heads({**cfg, "num_heads": cfg.get("map_heads") or cfg["num_heads"]},
                             Reading(r.fmt, {}, {}, pool), path)
    r.params.update(pool)
  if cfg.get("rope") in ("eva02", "pe"):
    hd = cfg["width"] // cfg["num_heads"]
    order = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])
    for k in r.params:
      if k.startswith("Transformer/") and (f"{ATTN}/query/" in k or f"{ATTN}/key/" in k):
        r.params[k] = r.params[k][..., order]
  resize.adapt(cfg, r, native if "pos_embedding" in r.params else None, path,
               preprocess.bicubic_weights)


READER = Reader(
    formats=FORMATS,
    policy="bicubic_crop1_imagenet",  # timm's DINOv3 evaluation: 256, bicubic, no crop
    detect=detect,
    read=read,
    narrows=("timm",),  # an Eva file has timm ViT's patch_embed and blocks too
    overridable=("ln_eps", "num_heads", "rope_theta", "rope_ref", "rope_offset", "map_heads"),
    adapt=adapt,
)
