"""ViT checkpoint formats: google-research/vision_transformer and big_vision.

Both upstreams compute the same function (LayerNorm eps 1e-6, tanh GELU,
Flax attention, posemb resampling by scipy zoom order 1); they differ in names,
in where the position embedding lives, and in big_vision's extra options
(MAP pooling, `pool_type="0"`, fixed sin-cos embeddings, scan-stacked blocks).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading, take_head
from vitcnn_jax.models.vit import resize
from vitcnn_jax.models.vit.model import ATTN

# tanh GELU like every upstream; `no_skip` for ablation models; `patch_size` as FlexiViT.
FORMATS = {
    "vit": "google-research/vision_transformer ViT and AugReg: pre-linen names, cls row "
           "inside Transformer/posembed_input (folded into cls), pool token or gap, "
           "optional pre_logits",
    "big_vision": "big_vision ViT: params/ or opt/target/ prefix, top-level pos_embedding "
                  "(absent: fixed sincos2d), scan-stacked blocks, pool tok/gap/map/0 "
                  "(gap and 0 look alike: gap assumed), bfloat16 arrays",
}
_BLOCK = {  # our name -> names in files (linen, pre-linen)
    "LayerNorm_0": ("LayerNorm_0",),
    ATTN: (ATTN, "MultiHeadDotProductAttention_1"),
    "LayerNorm_1": ("LayerNorm_1", "LayerNorm_2"),
    "MlpBlock_0": ("MlpBlock_0", "MlpBlock_3"),
}
_PRELINEN = {ours: names[-1] for ours, names in _BLOCK.items()}
_LN = ("scale", "bias")
_DENSE = ("kernel", "bias")
_ATTN_LEAVES = tuple(f"{p}/{l}" for p in ("query", "key", "value", "out") for l in _DENSE)
_MLP = tuple(f"Dense_{i}/{l}" for i in (0, 1) for l in _DENSE)
_LEAVES = {"LayerNorm_0": _LN, ATTN: _ATTN_LEAVES, "LayerNorm_1": _LN, "MlpBlock_0": _MLP}
_POSEMB_KEYS = ("Transformer/posembed_input/pos_embedding", "Transformer/pos_embedding",
                "pos_embedding")


def detect(flat: dict[str, np.ndarray]) -> str | None:
  if "embedding/kernel" not in flat:
    return None
  if ("Transformer/posembed_input/pos_embedding" in flat
      or any("MultiHeadDotProductAttention_1" in k for k in flat)):
    return "vit"
  return "big_vision"


def _blocks(keys: Keys, p: dict, cfg: dict, ev: dict, sources: dict[str, str]) -> None:
  stacked = keys.has("Transformer/encoderblock/LayerNorm_0/scale")
  if stacked:
    depth = keys.flat["Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
    ev["depth"] = keys.shape("Transformer/encoderblock/LayerNorm_0/scale")
  else:
    idx = keys.indices(r"Transformer/encoderblock_(\d+)/")
    if not idx or idx[0] != 0:
      raise CheckpointError(f"{keys.path}: no Transformer/encoderblock_0 found.")
    depth = len(idx)
    ev["depth"] = f"Transformer/encoderblock_0..{depth - 1}"
  cfg["depth"] = depth
  for i in range(depth):
    src = "Transformer/encoderblock" if stacked else f"Transformer/encoderblock_{i}"
    for ours, theirs in _BLOCK.items():
      name = next((t for t in theirs if keys.has(f"{src}/{t}/{_LEAVES[ours][0]}")), theirs[-1])
      for leaf in _LEAVES[ours]:
        arr = keys.take(f"{src}/{name}/{leaf}")
        if stacked:
          if arr.shape[0] != depth:
            raise CheckpointError(
                f"{keys.path}: scan-stacked {src}/{name}/{leaf} has leading axis "
                f"{arr.shape[0]}, expected depth {depth}.")
          arr = arr[i]
          sources[f"Transformer/encoderblock_{i}/{ours}/{leaf}"] = (
              f"{keys.prefix}{src}/{name}/{leaf} (entry {i} of its leading, per-block axis)")
        p[f"Transformer/encoderblock_{i}/{ours}/{leaf}"] = arr
  q = p[f"Transformer/encoderblock_0/{ATTN}/query/kernel"]
  cfg["num_heads"], ev["num_heads"] = q.shape[1], f"block 0 query/kernel {q.shape}"
  cfg["mlp_dim"] = p["Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"].shape[1]
  ev["mlp_dim"] = "block 0 MlpBlock Dense_0/kernel"
  for leaf in _LN:
    p[f"Transformer/encoder_norm/{leaf}"] = keys.take(f"Transformer/encoder_norm/{leaf}")


def _pool(keys: Keys, p: dict, cfg: dict, ev: dict, assumed: list[str],
          pe: np.ndarray | None, pe_key: str | None) -> np.ndarray | None:
  """The pooling (class token, MAP head, or neither), its tensors, and the position
  embedding without a vision_transformer file's class-token row (folded into cls)."""
  if keys.has("cls"):
    cls = keys.take("cls")
    if pe is not None and (pe_key.startswith("Transformer/") or (
        math.isqrt(pe.shape[1] - 1) ** 2 == pe.shape[1] - 1 and math.isqrt(pe.shape[1]) ** 2 != pe.shape[1])):
      # vision_transformer adds the position embedding after prepending cls;
      # folding its first row into cls gives big_vision's equivalent form.
      rows = pe.shape[1]
      if math.isqrt(rows) ** 2 == rows and math.isqrt(rows - 1) ** 2 != rows - 1:
        raise CheckpointError(
            f"{keys.path}: {pe_key} {pe.shape} has {rows} rows, a whole "
            f"{math.isqrt(rows)}x{math.isqrt(rows)} grid, but with a class token ('cls') "
            "a vision_transformer file has one more row, for the class token, first. The "
            "file is malformed (its class-token row is missing).")
      cls, pe = cls + pe[:, :1], pe[:, 1:]
    p["cls"], cfg["pool"], ev["pool"] = cls, "token", keys.shape("cls")
  elif keys.has("MAPHead_0/probe"):
    cfg["pool"], ev["pool"] = "map", "MAPHead_0/probe"
    p["MAPHead_0/probe"] = keys.take("MAPHead_0/probe")
    for sub, leaves in ((ATTN, _ATTN_LEAVES), ("LayerNorm_0", _LN), ("MlpBlock_0", _MLP)):
      for leaf in leaves:
        p[f"MAPHead_0/{sub}/{leaf}"] = keys.take(f"MAPHead_0/{sub}/{leaf}")
  elif keys.fmt == "vit":
    rows = pe.shape[1]
    if math.isqrt(rows) ** 2 != rows and math.isqrt(rows - 1) ** 2 == rows - 1:
      raise CheckpointError(
          f"{keys.path}: key 'cls' is missing: {pe_key} {pe.shape} has a class-token row "
          f"before its {math.isqrt(rows - 1)}x{math.isqrt(rows - 1)} grid, so the model "
          "pools its class token, but the file has no 'cls' tensor. The file is incomplete.")
    cfg["pool"], ev["pool"] = "gap", "no cls in a vision_transformer file: classifier 'gap'"
  else:
    cfg["pool"] = "gap"
    ev["pool"] = ("no cls and no MAPHead_0: big_vision's pool_type 'gap' and '0' leave the "
                  "same tensors; 'gap' is its default")
    assumed.append("pool")
  return pe


def read(keys: Keys) -> Reading:
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  assumed: list[str] = []
  sources: dict[str, str] = {}
  emb = keys.take("embedding/kernel")
  p["embedding/kernel"], p["embedding/bias"] = emb, keys.take("embedding/bias")
  cfg["patch_size"] = emb.shape[0] if emb.shape[0] == emb.shape[1] else tuple(emb.shape[:2])
  cfg["width"] = emb.shape[-1]
  ev["patch_size"] = ev["width"] = keys.shape("embedding/kernel")
  _blocks(keys, p, cfg, ev, sources)
  if keys.has("pre_logits/kernel"):
    p["pre_logits/kernel"] = keys.take("pre_logits/kernel")
    p["pre_logits/bias"] = keys.take("pre_logits/bias")
    cfg["representation_size"] = p["pre_logits/kernel"].shape[1]
    ev["representation_size"] = keys.shape("pre_logits/kernel")
  else:
    cfg["representation_size"], ev["representation_size"] = None, "no pre_logits in the file"
  take_head(keys, p, cfg, ev)

  pe_key = next((k for k in _POSEMB_KEYS if keys.has(k)), None)
  if pe_key is None and keys.fmt == "big_vision" and cfg["width"] % 4 == 0:
    # Every other tensor was present (the ledger took them above): a complete
    # big_vision file without a learned embedding was trained with posemb="sincos2d".
    pe = None
    cfg["posemb"], cfg["image_size"] = "sincos2d", 224
    ev["posemb"] = ("no pos_embedding in an otherwise complete big_vision file: fixed 2-D "
                    "sin-cos, computed for the grid in use")
    ev["image_size"] = ("not recorded by a sincos2d file, which runs at any size; big_vision's "
                        "default 224 for the data")
    assumed.append("image_size")
  else:
    pe = keys.take(pe_key or "pos_embedding")
    cfg["posemb"], ev["posemb"] = "learn", keys.shape(pe_key)
    if pe.ndim != 3 or pe.shape[0] != 1 or pe.shape[2] != cfg["width"]:
      raise CheckpointError(
          f"{keys.path}: {keys.prefix}{keys.shape(pe_key)} should be (1, tokens, "
          f"{cfg['width']}), the width read from {ev['width']}. The file is malformed.")
  pe = _pool(keys, p, cfg, ev, assumed, pe, pe_key)
  if pe is not None:
    p["pos_embedding"] = pe
    g = math.isqrt(pe.shape[1])
    square = g * g == pe.shape[1] and np.ndim(cfg["patch_size"]) == 0
    cfg["image_size"] = int(g * cfg["patch_size"]) if square else None
    ev["image_size"] = keys.shape(pe_key)
  return Reading(keys.fmt, cfg, ev, p, tuple(assumed), sources)


def adapt(cfg: dict, r: Reading, native: int | None, path: str) -> None:
  """The resolution checked; a learned embedding resampled as both upstreams do."""
  resize.adapt(cfg, r, native, path, resize.SCIPY_LINEAR)


def default_format(model) -> str:
  plain = model.pool in ("token", "gap") and model.posemb == "learn"
  return "vit" if plain else "big_vision"


# Options of later ViTs that Google's files cannot hold (their value in Google's ViTs).
_TIMM_ONLY = dict(num_registers=0, distilled=False, pre_norm=False, fc_norm=False, mlp="gelu", ln_eps=1e-6,
                  layer_scale=False, patch_bias=True, head_bias=True, rope="", mlp_norm=False,
                  map_heads=0, map_prefix=False, attn_norm=False)


def write(model, flat: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
  other = {k: getattr(model, k) for k, v in _TIMM_ONLY.items() if getattr(model, k) != v}
  if model.class_token not in (None, model.pool == "token"):
    other["class_token"] = model.class_token
  if model.posemb == "none" or model.pool == "token_gap":
    other.update(posemb=model.posemb, pool=model.pool)
  if other:
    raise ValueError(f"Google's ViT formats have no {other}; save as .safetensors (timm's "
                     "layout).")
  if fmt == "big_vision":
    return {f"params/{k}": v for k, v in flat.items()}
  if default_format(model) != "vit":
    raise ValueError(f"The vision_transformer format has no pool={model.pool!r} / "
                     f"posemb={model.posemb!r}; save with format='big_vision'.")
  out = {}
  for k, v in flat.items():
    m = re.match(r"Transformer/encoderblock_(\d+)/([^/]+)/(.*)", k)
    if m:
      out[f"Transformer/encoderblock_{m[1]}/{_PRELINEN.get(m[2], m[2])}/{m[3]}"] = v
    elif k == "pos_embedding":
      if model.pool == "token":  # cls already holds its position embedding.
        v = np.concatenate([np.zeros_like(v[:, :1]), v], axis=1)
      out["Transformer/posembed_input/pos_embedding"] = v
    else:
      out[k] = v
  return out


READER = Reader(
    formats=FORMATS,
    policy="resize",  # vision_transformer's evaluation and big_vision's SigLIP: [-1, 1]
    detect=detect,
    read=read,
    overridable=("gelu", "no_skip", "patch_size"),
    adapt=adapt,
    write=write,
    suffix=".npz",
    default_format=default_format,
)
