"""Official npz checkpoints in, Flax models out (and back), architecture read from the file.

Formats (detected from the keys):
  vit         google-research/vision_transformer ViT files, incl. AugReg: pre-linen
              block names, `Transformer/posembed_input` with the cls row inside.
  big_vision  big_vision ViT files: `params/` or `opt/target/` prefix, linen
              names, top-level `pos_embedding`, optionally scan-stacked blocks,
              MAP head, bfloat16 arrays stored as void.
  bit         google-research/big_transfer ResNet-v2 files (`resnet/...`).
  big_vision_bit  big_vision `bit_paper` trees (`root_block/conv_root`, ...).
  mixer       vision_transformer / big_vision MLP-Mixer files.

Every tensor of the file is either used or reported: nothing is dropped silently.
"""

from __future__ import annotations

import io
import math
import re
import zipfile
import zlib
from typing import Any, Callable

import jax
import numpy as np
import scipy.ndimage

from vitcnn_jax import fileio
from vitcnn_jax import models as models_lib
from vitcnn_jax.models import bit as bit_lib

Params = dict[str, Any]
FORMATS = ("vit", "big_vision", "bit", "big_vision_bit", "mixer")
_PREFIXES = ("opt/target/", "params/")


class CheckpointError(ValueError):
  """A checkpoint that cannot be read as the model it describes."""


# ---------------------------------------------------------------------------
# Reading files.


def read_npz(path: str) -> dict[str, np.ndarray]:
  """All arrays of an npz file; bfloat16 (stored as void) becomes float32."""
  data = fileio.read_bytes(path)
  bad = (zipfile.BadZipFile, EOFError, OSError, ValueError, zlib.error)
  try:
    loaded = np.load(io.BytesIO(data), allow_pickle=False)
    if not isinstance(loaded, np.lib.npyio.NpzFile):
      raise CheckpointError(f"{path}: holds a single array of shape {np.shape(loaded)}, "
                            "not an npz archive of named arrays.")
    with loaded as z:
      flat = {k: z[k] for k in z.files}
  except bad as e:
    if isinstance(e, CheckpointError):
      raise
    raise CheckpointError(
        f"{path}: not a readable npz archive ({type(e).__name__}: {e}). The file "
        "is truncated or corrupt: download it again and compare its size.") from e
  for k, v in flat.items():
    if v.dtype.kind == "V":
      if v.dtype.itemsize != 2:
        raise CheckpointError(f"{path}: key {k!r} has an unknown void dtype {v.dtype}.")
      import ml_dtypes  # pylint: disable=g-import-not-at-top  (jax dependency)
      v = v.view(ml_dtypes.bfloat16)
    if v.dtype.kind == "f" or v.dtype.name == "bfloat16":
      flat[k] = np.asarray(v, np.float32)
  if not flat:
    raise CheckpointError(f"{path}: the npz archive is empty.")
  return flat


class _Keys:
  """The file's tensors, handed out once each; leftovers are an error."""

  def __init__(self, flat: dict[str, np.ndarray], path: str, fmt: str):
    self.flat, self.path, self.fmt = flat, path, fmt
    self.used: set[str] = set()

  def has(self, key: str) -> bool:
    return key in self.flat

  def take(self, key: str) -> np.ndarray:
    if key not in self.flat:
      raise CheckpointError(
          f"{self.path}: key {key!r} is missing; a {self.fmt} checkpoint with "
          "this architecture needs it. The file is incomplete or of another format.")
    self.used.add(key)
    return self.flat[key]

  def indices(self, pattern: str) -> list[int]:
    """Sorted distinct integers captured by `pattern`, checked to be 0..n-1 or 1..n."""
    found = sorted({int(m.group(1)) for k in self.flat if (m := re.match(pattern, k))})
    if found and found != list(range(found[0], found[0] + len(found))):
      raise CheckpointError(f"{self.path}: numbering of {pattern!r} has gaps: {found}.")
    return found

  def finish(self) -> None:
    left = sorted(set(self.flat) - self.used)
    if left:
      shown = ", ".join(f"{k} {self.flat[k].shape}" for k in left[:10])
      raise CheckpointError(
          f"{self.path}: {len(left)} tensor(s) not used by the {self.fmt} model "
          f"read from this file: {shown}{' ...' if len(left) > 10 else ''}. "
          "Refusing to ignore them; is this a different architecture?")


def _strip_prefix(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """big_vision training checkpoints keep params under `params/` or `opt/target/`."""
  for prefix in _PREFIXES:
    if any(k.startswith(prefix) for k in flat):
      return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
  return flat


def detect_format(flat: dict[str, np.ndarray], path: str = "<arrays>") -> str:
  if any(k.startswith("resnet/") for k in flat):
    return "bit"
  if "root_block/conv_root/kernel" in flat:
    return "big_vision_bit"
  if "stem/kernel" in flat and any(k.startswith("MixerBlock_") for k in flat):
    return "mixer"
  if "embedding/kernel" in flat:
    if ("Transformer/posembed_input/pos_embedding" in flat
        or any("MultiHeadDotProductAttention_1" in k for k in flat)):
      return "vit"
    return "big_vision"
  raise CheckpointError(
      f"{path}: unknown checkpoint format; first keys: {sorted(flat)[:8]}. Expected "
      "a ViT (embedding/kernel), BiT (resnet/... or root_block/...) or Mixer "
      "(stem/kernel + MixerBlock_i) npz from the official repositories.")


# ---------------------------------------------------------------------------
# File trees -> our trees. Each converter returns (config, evidence, params):
# `evidence[field]` names the tensor a config value was read from.

_VIT_BLOCK = {  # our name -> names in files (linen, pre-linen)
    "LayerNorm_0": ("LayerNorm_0",),
    "MultiHeadDotProductAttention_0": ("MultiHeadDotProductAttention_0",
                                       "MultiHeadDotProductAttention_1"),
    "LayerNorm_1": ("LayerNorm_1", "LayerNorm_2"),
    "MlpBlock_0": ("MlpBlock_0", "MlpBlock_3"),
}
_LN = ("scale", "bias")
_TF_GN = {"scale": "gamma", "bias": "beta"}  # big_transfer's GroupNorm names
_DENSE = ("kernel", "bias")
_ATTN = tuple(f"{p}/{l}" for p in ("query", "key", "value", "out") for l in _DENSE)
_MLP = tuple(f"Dense_{i}/{l}" for i in (0, 1) for l in _DENSE)
_VIT_LEAVES = {"LayerNorm_0": _LN, "MultiHeadDotProductAttention_0": _ATTN,
               "LayerNorm_1": _LN, "MlpBlock_0": _MLP}


def _shape(keys: _Keys, key: str) -> str:
  return f"{key} {tuple(keys.flat[key].shape)}"


def _vit_from_file(keys: _Keys) -> tuple[dict, dict, Params]:
  p: Params = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  emb = keys.take("embedding/kernel")
  p["embedding/kernel"], p["embedding/bias"] = emb, keys.take("embedding/bias")
  cfg["patch_size"] = emb.shape[0] if emb.shape[0] == emb.shape[1] else tuple(emb.shape[:2])
  cfg["width"] = emb.shape[-1]
  ev["patch_size"] = ev["width"] = _shape(keys, "embedding/kernel")

  stacked = keys.has("Transformer/encoderblock/LayerNorm_0/scale")
  if stacked:
    depth = keys.flat["Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
    ev["depth"] = _shape(keys, "Transformer/encoderblock/LayerNorm_0/scale")
  else:
    idx = keys.indices(r"Transformer/encoderblock_(\d+)/")
    if not idx or idx[0] != 0:
      raise CheckpointError(f"{keys.path}: no Transformer/encoderblock_0 found.")
    depth = len(idx)
    ev["depth"] = f"Transformer/encoderblock_0..{depth - 1}"
  cfg["depth"] = depth
  for i in range(depth):
    src_block = "Transformer/encoderblock" if stacked else f"Transformer/encoderblock_{i}"
    for ours, theirs in _VIT_BLOCK.items():
      name = next((t for t in theirs if keys.has(f"{src_block}/{t}/{_VIT_LEAVES[ours][0]}")),
                  theirs[-1])
      for leaf in _VIT_LEAVES[ours]:
        arr = keys.take(f"{src_block}/{name}/{leaf}")
        if stacked:
          if arr.shape[0] != depth:
            raise CheckpointError(
                f"{keys.path}: scan-stacked {src_block}/{name}/{leaf} has leading "
                f"axis {arr.shape[0]}, expected depth {depth}.")
          arr = arr[i]
        p[f"Transformer/encoderblock_{i}/{ours}/{leaf}"] = arr
  q = p["Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"]
  cfg["num_heads"] = q.shape[1]
  cfg["mlp_dim"] = p["Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"].shape[1]
  ev["num_heads"] = f"block 0 query/kernel {q.shape}"
  ev["mlp_dim"] = "block 0 MlpBlock Dense_0/kernel"
  for leaf in _LN:
    p[f"Transformer/encoder_norm/{leaf}"] = keys.take(f"Transformer/encoder_norm/{leaf}")

  pe_key = next((k for k in ("Transformer/posembed_input/pos_embedding",
                             "Transformer/pos_embedding", "pos_embedding") if keys.has(k)),
                "pos_embedding")
  pe = keys.take(pe_key)
  if keys.has("cls"):
    cls = keys.take("cls")
    rows = pe.shape[1]
    if pe_key.startswith("Transformer/") or (
        math.isqrt(rows - 1) ** 2 == rows - 1 and math.isqrt(rows) ** 2 != rows):
      # vision_transformer adds the position embedding after prepending cls;
      # folding its first row into cls gives big_vision's equivalent form.
      cls, pe = cls + pe[:, :1], pe[:, 1:]
    p["cls"] = cls
    cfg["pool"] = "token"
    ev["pool"] = _shape(keys, "cls")
  elif keys.has("MAPHead_0/probe"):
    cfg["pool"] = "map"
    ev["pool"] = "MAPHead_0/probe"
    p["MAPHead_0/probe"] = keys.take("MAPHead_0/probe")
    for sub, leaves in (("MultiHeadDotProductAttention_0", _ATTN),
                        ("LayerNorm_0", _LN), ("MlpBlock_0", _MLP)):
      for leaf in leaves:
        p[f"MAPHead_0/{sub}/{leaf}"] = keys.take(f"MAPHead_0/{sub}/{leaf}")
  else:
    cfg["pool"] = "gap"
    ev["pool"] = "no cls and no MAPHead_0 in the file"
  p["pos_embedding"] = pe
  ev["image_size"] = _shape(keys, pe_key)
  g = math.isqrt(pe.shape[1])
  patch = np.broadcast_to(np.array(cfg["patch_size"]), 2)
  cfg["image_size"] = int(g * patch[0]) if g * g == pe.shape[1] and patch[0] == patch[1] else None

  if keys.has("pre_logits/kernel"):
    p["pre_logits/kernel"] = keys.take("pre_logits/kernel")
    p["pre_logits/bias"] = keys.take("pre_logits/bias")
    cfg["representation_size"] = p["pre_logits/kernel"].shape[1]
    ev["representation_size"] = _shape(keys, "pre_logits/kernel")
  else:
    cfg["representation_size"] = None
    ev["representation_size"] = "no pre_logits in the file"
  _take_head(keys, p, cfg, ev)
  return cfg, ev, p


def _take_head(keys: _Keys, p: Params, cfg: dict, ev: dict,
               kernel: str = "head/kernel", bias: str = "head/bias") -> None:
  if keys.has(kernel):
    w = keys.take(kernel)
    w = w.reshape(w.shape[-2:])  # BiT stores a (1, 1, C, K) conv
    p["head/kernel"], p["head/bias"] = w, keys.take(bias)
    cfg["num_classes"] = w.shape[-1]
    ev["num_classes"] = _shape(keys, kernel)
  else:
    cfg["num_classes"] = None
    ev["num_classes"] = f"no {kernel} in the file"


def _bit_from_file(keys: _Keys) -> tuple[dict, dict, Params]:
  bt = keys.fmt == "bit"
  if bt:  # Some files number their convs: standardized_conv2d_3.
    renamed: dict[str, np.ndarray] = {}
    for k, v in keys.flat.items():
      k2 = re.sub(r"/standardized_conv2d_\d+/", "/standardized_conv2d/", k)
      if k2 in renamed:
        raise CheckpointError(f"{keys.path}: {k!r} and another key both map to {k2!r}.")
      renamed[k2] = v
    keys.flat = renamed
  conv = (lambda s: f"resnet/{s}/standardized_conv2d/kernel") if bt else (lambda s: f"{s}/kernel")
  gn = ((lambda s, l: f"resnet/{s}/group_norm/{_TF_GN[l]}") if bt
        else (lambda s, l: f"{s}/{l}"))
  p: Params = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  root_key = conv("root_block") if bt else "root_block/conv_root/kernel"
  root = keys.take(root_key)
  p["root_block/conv_root/kernel"] = root
  width = root.shape[-1] / 64
  cfg["width"] = int(width) if width.is_integer() else width
  ev["width"] = _shape(keys, root_key)
  pre = "resnet/" if bt else ""
  blocks = keys.indices(rf"{pre}block(\d+)/")
  if not blocks or blocks[0] != 1:
    raise CheckpointError(f"{keys.path}: no {pre}block1/ found.")
  depth = []
  for b in blocks:
    units = keys.indices(rf"{pre}block{b}/unit(\d+)/")
    if not units or units[0] != 1:
      raise CheckpointError(f"{keys.path}: {pre}block{b} has no unit01.")
    depth.append(len(units))
    for u in units:
      src = f"block{b}/unit{u:02d}"
      for i, letter in enumerate("abc", 1):
        p[f"{src}/conv{i}/kernel"] = keys.take(conv(f"{src}/{letter}") if bt else f"{src}/conv{i}/kernel")
        for leaf in _LN:
          p[f"{src}/gn{i}/{leaf}"] = keys.take(gn(f"{src}/{letter}", leaf) if bt else f"{src}/gn{i}/{leaf}")
      proj = conv(f"{src}/a/proj") if bt else f"{src}/conv_proj/kernel"
      if keys.has(proj):
        p[f"{src}/conv_proj/kernel"] = keys.take(proj)
  depth = tuple(depth)
  named = [d for d, sizes in bit_lib.DEPTHS.items() if sizes == depth]
  cfg["depth"] = named[0] if named else depth
  ev["depth"] = f"units per block {depth}"
  for leaf in _LN:
    p[f"norm-pre-head/{leaf}"] = keys.take(
        f"resnet/group_norm/{_TF_GN[leaf]}" if bt else f"norm-pre-head/{leaf}")
  if bt:
    _take_head(keys, p, cfg, ev, "resnet/head/conv2d/kernel", "resnet/head/conv2d/bias")
  else:
    _take_head(keys, p, cfg, ev)
  for k in list(p):  # GroupNorm params are (1, 1, 1, C) in some files.
    if "/gn" in k or k.startswith("norm-pre-head"):
      p[k] = p[k].reshape(-1)
  return cfg, ev, p


def _mixer_from_file(keys: _Keys) -> tuple[dict, dict, Params]:
  p: Params = {}
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
  ev = dict(patch_size=_shape(keys, "stem/kernel"), hidden_dim=_shape(keys, "stem/kernel"),
            num_blocks=f"MixerBlock_0..{len(idx) - 1}",
            tokens_mlp_dim=_shape(keys, "MixerBlock_0/token_mixing/Dense_0/kernel"),
            image_size=_shape(keys, "MixerBlock_0/token_mixing/Dense_0/kernel"),
            channels_mlp_dim=_shape(keys, "MixerBlock_0/channel_mixing/Dense_0/kernel"))
  _take_head(keys, p, cfg, ev)
  return cfg, ev, p


_READERS: dict[str, tuple[str, Callable[[_Keys], tuple[dict, dict, Params]]]] = {
    "vit": ("vit", _vit_from_file), "big_vision": ("vit", _vit_from_file),
    "bit": ("bit", _bit_from_file), "big_vision_bit": ("bit", _bit_from_file),
    "mixer": ("mixer", _mixer_from_file),
}


# ---------------------------------------------------------------------------
# Trees.


def unflatten(flat: dict[str, Any]) -> Params:
  tree: Params = {}
  for k, v in flat.items():
    node = tree
    *parents, leaf = k.split("/")
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = v
  return tree


def flatten(tree: Params, prefix: str = "") -> dict[str, Any]:
  flat: dict[str, Any] = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      flat.update(flatten(v, f"{prefix}{k}/"))
    else:
      flat[f"{prefix}{k}"] = v
  return flat


def resample_posemb(pe: np.ndarray, old_grid: tuple[int, int],
                    new_grid: tuple[int, int]) -> np.ndarray:
  """Linear resampling of the grid, as upstream (scipy.ndimage.zoom, order=1)."""
  if tuple(old_grid) == tuple(new_grid):
    return pe
  grid = pe.reshape(old_grid[0], old_grid[1], -1)
  zoom = (new_grid[0] / old_grid[0], new_grid[1] / old_grid[1], 1)
  grid = scipy.ndimage.zoom(grid, zoom, order=1)
  return grid.reshape(1, new_grid[0] * new_grid[1], -1).astype(pe.dtype)


def _expected_shapes(model) -> dict[str, tuple[int, ...]]:
  size = models_lib.common.to_pair(model.image_size)
  images = jax.ShapeDtypeStruct((1, *size, 3), np.float32)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)["params"]
  return {k: tuple(v.shape) for k, v in flatten(shapes).items()}


def check_params(model, params: Params, path: str = "<params>") -> None:
  """Every parameter present with the shape the model needs, and nothing else."""
  want = _expected_shapes(model)
  have = {k: tuple(np.shape(v)) for k, v in flatten(params).items()}
  for k in sorted(set(want) | set(have)):
    if k not in have:
      raise CheckpointError(f"{path}: parameter {k} {want[k]} is missing for {model}.")
    if k not in want:
      raise CheckpointError(f"{path}: parameter {k} {have[k]} is not part of the model.")
    if have[k] != want[k]:
      raise CheckpointError(
          f"{path}: parameter {k} has shape {have[k]} but the architecture read "
          f"from the file needs {want[k]}; the file is internally inconsistent.")


# ---------------------------------------------------------------------------
# Public API.


def load_params(path: str) -> tuple[str, dict, dict, Params]:
  """(family, inferred config, evidence per config field, params) of a file."""
  raw = read_npz(path)
  flat = _strip_prefix(raw)
  fmt = detect_format(flat, path)
  family, reader = _READERS[fmt]
  keys = _Keys(flat, path, fmt)
  cfg, ev, params = reader(keys)
  keys.finish()
  return family, cfg, ev, params


def load_model(path: str, **overrides) -> tuple[Any, Params]:
  """Model and params of an official checkpoint, the architecture read from it.

  Overrides: `resolution` (or `image_size`; a ViT resamples its position
  embedding like upstream), `gelu` ('tanh' default, or 'exact'), `no_skip`,
  or any architecture field, which must then agree with the file.
  """
  family, cfg, ev, flat = load_params(path)
  cls = models_lib.FAMILIES[family]
  fields = {f for f in cls.__dataclass_fields__ if f not in ("parent", "name")}
  if "resolution" in overrides:
    if "image_size" in overrides:
      raise ValueError("Pass either resolution= or image_size=, not both.")
    overrides["image_size"] = overrides.pop("resolution")
  free = {"image_size", "gelu", "no_skip"}
  for k, v in overrides.items():
    if k not in fields:
      raise ValueError(f"load_model({path!r}): unknown override {k}={v!r}; "
                       f"{family} models take {sorted(fields | {'resolution'})}.")
    if k in free or k not in cfg:
      continue
    same = v == cfg[k] or (isinstance(v, (tuple, list)) and tuple(v) == tuple(np.broadcast_to(cfg[k], len(v))))
    if not same:
      raise CheckpointError(
          f"{path}: override {k}={v!r} contradicts the file, which has "
          f"{k}={cfg[k]!r} (from {ev[k]}). Drop the override or use another file.")
  native = cfg.get("image_size")
  cfg.update(overrides)
  if family != "bit" and cfg.get("image_size") is None:
    raise CheckpointError(
        f"{path}: cannot infer a square input size from {ev['image_size']}; pass "
        "resolution=(height, width).")
  if family == "mixer" and native is not None and tuple(np.broadcast_to(cfg["image_size"], 2)) != (native, native):
    raise CheckpointError(
        f"{path}: a Mixer's token-mixing MLP fixes its input to {native}x{native} "
        f"({ev['image_size']}); resolution={cfg['image_size']!r} is not possible.")
  if family == "vit":
    patch = models_lib.common.to_pair(cfg["patch_size"])
    new = models_lib.common.to_pair(cfg["image_size"])
    if new[0] % patch[0] or new[1] % patch[1]:
      raise ValueError(f"resolution {new} is not a multiple of the patch size {patch}.")
    rows = flat["pos_embedding"].shape[1]
    new_grid = (new[0] // patch[0], new[1] // patch[1])
    if new_grid[0] * new_grid[1] != rows:
      if native is None:
        raise CheckpointError(f"{path}: cannot resample a non-square position "
                              f"embedding ({ev['image_size']}) to {new}.")
      old = native // patch[0]
      flat["pos_embedding"] = resample_posemb(flat["pos_embedding"], (old, old), new_grid)
  if family == "bit" and cfg.get("image_size") is None:
    cfg.pop("image_size", None)
  model = cls(**cfg)
  params = unflatten({k: np.asarray(v, np.float32) for k, v in flat.items()})
  check_params(model, params, path)
  return model, jax.tree_util.tree_map(jax.numpy.asarray, params)


# ---------------------------------------------------------------------------
# Export to upstream formats.

_PRELINEN = {"MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
             "LayerNorm_1": "LayerNorm_2", "MlpBlock_0": "MlpBlock_3"}


def _vit_to_vt(model, flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  if model.pool == "map":
    raise ValueError("The vision_transformer format has no MAP head; save with "
                     "format='big_vision'.")
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


def _bit_to_bt(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  out = {}
  for k, v in flat.items():
    if k == "root_block/conv_root/kernel":
      out["resnet/root_block/standardized_conv2d/kernel"] = v
    elif m := re.match(r"(block\d+/unit\d+)/conv([123])/kernel", k):
      out[f"resnet/{m[1]}/{'abc'[int(m[2]) - 1]}/standardized_conv2d/kernel"] = v
    elif m := re.match(r"(block\d+/unit\d+)/conv_proj/kernel", k):
      out[f"resnet/{m[1]}/a/proj/standardized_conv2d/kernel"] = v
    elif m := re.match(r"(block\d+/unit\d+)/gn([123])/(scale|bias)", k):
      out[f"resnet/{m[1]}/{'abc'[int(m[2]) - 1]}/group_norm/{_TF_GN[m[3]]}"] = v
    elif m := re.match(r"norm-pre-head/(scale|bias)", k):
      out[f"resnet/group_norm/{_TF_GN[m[1]]}"] = v
    elif k == "head/kernel":
      out["resnet/head/conv2d/kernel"] = v[None, None]
    elif k == "head/bias":
      out["resnet/head/conv2d/bias"] = v
    else:
      raise ValueError(f"Unexpected BiT parameter {k}.")
  return out


def to_upstream(model, params: Params, format: str | None = None) -> dict[str, np.ndarray]:  # pylint: disable=redefined-builtin
  """Our params as the flat arrays of an upstream file (see FORMATS)."""
  check_params(model, params)
  flat = {k: np.asarray(v, np.float32) for k, v in flatten(params).items()}
  family = model.family
  if format is None:
    format = {"vit": "big_vision" if family == "vit" and model.pool == "map" else "vit",
              "bit": "bit", "mixer": "mixer"}[family]
  allowed = {"vit": ("vit", "big_vision"), "bit": ("bit", "big_vision_bit"),
             "mixer": ("mixer",)}[family]
  if format not in allowed:
    raise ValueError(f"A {family} model saves as one of {allowed}, not {format!r}.")
  if format == "vit":
    return _vit_to_vt(model, flat)
  if format == "big_vision":
    return {f"params/{k}": v for k, v in flat.items()}
  if format == "bit":
    return _bit_to_bt(flat)
  return flat


def save(path: str, model, params: Params, format: str | None = None) -> None:  # pylint: disable=redefined-builtin
  """Writes an npz that `load_model`, upstream code and timm read like an official file."""
  arrays = to_upstream(model, params, format)
  fileio.atomic_write(path, lambda f: np.savez(f, **arrays))
