"""BiT ResNet-v2 checkpoint formats: google-research/big_transfer and big_vision.

The two upstreams agree on the arithmetic (weight standardisation eps 1e-10,
GroupNorm 32 groups eps 1e-5) except the root max-pool's padding: zeros in
big_transfer, -inf in big_vision's `bit_paper`. A file is run the way its own
upstream runs it (`BiT.root_pool_pad`).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from vitcnn_jax.models import sizes
from vitcnn_jax.models.bit import model as bit
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading, take_head

FORMATS = {
    "bit": "google-research/big_transfer: resnet/..., standardized_conv2d[_N], GroupNorm "
           "gamma/beta (C,) or (1,1,1,C), head as a 1x1 conv; root pool padded with zeros",
    "big_vision_bit": "big_vision bit_paper: root_block/conv_root, blockB/unitUU/convN, gnN "
                      "(1,1,1,C), norm-pre-head, Dense head; root pool padded with -inf",
}
POOL_PAD = {"bit": "zero", "big_vision_bit": "-inf"}
_LN = ("scale", "bias")
_TF_GN = {"scale": "gamma", "bias": "beta"}  # big_transfer's GroupNorm names


def detect(flat: dict[str, np.ndarray]) -> str | None:
  if any(k.startswith("resnet/") for k in flat):
    return "bit"
  if "root_block/conv_root/kernel" in flat:
    return "big_vision_bit"
  return None


def _bt_names(keys: Keys) -> None:
  """Some big_transfer files number their convs: standardized_conv2d_3."""
  renamed: dict[str, np.ndarray] = {}
  for k, v in keys.flat.items():
    k2 = re.sub(r"/standardized_conv2d_\d+/", "/standardized_conv2d/", k)
    if k2 in renamed:
      raise CheckpointError(f"{keys.path}: {k!r} and another key both map to {k2!r}.")
    renamed[k2] = v
  keys.flat = renamed


def read(keys: Keys) -> Reading:
  bt = keys.fmt == "bit"
  if bt:
    _bt_names(keys)
  conv = (lambda s: f"resnet/{s}/standardized_conv2d/kernel") if bt else (lambda s: f"{s}/kernel")
  gn = (lambda s, l: f"resnet/{s}/group_norm/{_TF_GN[l]}") if bt else (lambda s, l: f"{s}/{l}")
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {"root_pool_pad": POOL_PAD[keys.fmt]}
  ev = {"root_pool_pad": f"{keys.fmt} format ({FORMATS[keys.fmt].split(':')[0]})"}
  root_key = conv("root_block") if bt else "root_block/conv_root/kernel"
  root = keys.take(root_key)
  p["root_block/conv_root/kernel"] = root
  width = root.shape[-1] / 64
  cfg["width"], ev["width"] = int(width) if width.is_integer() else width, keys.shape(root_key)
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
  named = [d for d, units in bit.DEPTHS.items() if units == depth]
  cfg["depth"], ev["depth"] = named[0] if named else depth, f"units per block {depth}"
  for leaf in _LN:
    p[f"norm-pre-head/{leaf}"] = keys.take(f"resnet/group_norm/{_TF_GN[leaf]}" if bt
                                           else f"norm-pre-head/{leaf}")
  if bt:
    take_head(keys, p, cfg, ev, "resnet/head/conv2d/kernel", "resnet/head/conv2d/bias")
  else:
    take_head(keys, p, cfg, ev)
  for k in list(p):  # GroupNorm params are (1, 1, 1, C) in some files.
    if "/gn" in k or k.startswith("norm-pre-head"):
      p[k] = p[k].reshape(-1)
  return Reading(keys.fmt, cfg, ev, p)


def adapt(cfg: dict, r: Reading, native: int | None, path: str) -> None:
  """Fully convolutional: any resolution of at least 32 px runs (the network
  downsamples by 32), and the file records none."""
  del r, native
  if cfg.get("image_size") is None:
    cfg.pop("image_size", None)
  elif min(sizes.to_pair(cfg["image_size"])) < 32:
    raise ValueError(f"{path}: resolution={cfg['image_size']!r}; a BiT ResNet downsamples by 32, "
                     "so it needs at least 32 px.")


def default_format(model) -> str:
  return {pad: fmt for fmt, pad in POOL_PAD.items()}[model.root_pool_pad]


def write(model, flat: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
  if POOL_PAD[fmt] != model.root_pool_pad:
    raise ValueError(f"A {fmt} file is run with its root pool padded by {POOL_PAD[fmt]}, but "
                     f"this model pads with {model.root_pool_pad}: its logits would change. "
                     f"Save as {default_format(model)!r}.")
  if fmt == "big_vision_bit":
    return {f"params/{k}": v.reshape(1, 1, 1, -1) if "/gn" in k or k.startswith("norm-pre-head")
            else v for k, v in flat.items()}
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


READER = Reader(
    formats=FORMATS,
    policy="resize",  # big_transfer's evaluation: bilinear to size x size, [-1, 1]
    detect=detect,
    read=read,
    overridable=("root_pool_pad",),  # set from the format, may be overridden
    adapt=adapt,
    write=write,
    suffix=".npz",
    default_format=default_format,
)
