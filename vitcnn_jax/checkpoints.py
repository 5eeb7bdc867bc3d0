"""Official npz checkpoints in, Flax models out (and back): what all formats share.

Each model family owns its formats (`models/vit_io.py`, `bit_io.py`,
`mixer_io.py`: detection, architecture inference with the evidence for each
field, key maps both ways, resolution changes). This module reads npz files,
selects a tower of two-tower files (`file.npz:img`, big_vision's syntax), hands
out tensors through a ledger that insists every tensor is used, dispatches to
the family and checks the result against the model it describes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import re
import zipfile
import zlib
from typing import Any

import jax
import numpy as np

from vitcnn_jax import fileio
from vitcnn_jax import models as models_lib
from vitcnn_jax.models.common import flatten, unflatten

Params = dict[str, Any]
_PREFIXES = ("opt/target/", "params/")
log = logging.getLogger("vitcnn_jax")


class CheckpointError(ValueError):
  """A checkpoint that cannot be read as the model it describes."""


@dataclasses.dataclass
class Reading:
  """What a family's reader found in a file."""
  fmt: str
  config: dict[str, Any]     # model fields read from the file
  evidence: dict[str, str]   # field -> the tensor (or absence) it was read from
  params: dict[str, np.ndarray]  # flat, our names
  assumed: tuple[str, ...] = ()  # fields no tensor decides: defaults, overridable


_DIGESTS: dict[str, str] = {}  # path -> hash of the bytes read_npz last read there


IN_MEMORY = "memory:"  # the "path" of parameters handed over in memory: memory:DIGEST


def params_digest(params) -> str:
  """`IN_MEMORY` + a content hash of a parameter tree, its stand-in for a file's digest."""
  h = hashlib.sha256()
  for key, value in sorted(flatten(params).items()):
    h.update(key.encode())
    h.update(np.ascontiguousarray(np.asarray(value, np.float32)).tobytes())
  return IN_MEMORY + h.hexdigest()[:16]


def digest(path: str) -> str:
  """Content hash of a checkpoint file (`file.npz:tower` hashes the file): the bytes
  this process loaded from it, or read now if it loaded none."""
  if path.startswith(IN_MEMORY):
    return path[len(IN_MEMORY):]
  file, _ = split_tower(path)
  if file not in _DIGESTS:
    _DIGESTS[file] = hashlib.sha256(fileio.read_bytes(file)).hexdigest()[:16]
  return _DIGESTS[file]


def read_npz(path: str) -> dict[str, np.ndarray]:
  """All arrays of an npz file; bfloat16 (stored as void) becomes float32."""
  data = fileio.read_bytes(path)
  _DIGESTS[path] = hashlib.sha256(data).hexdigest()[:16]
  bad = (zipfile.BadZipFile, EOFError, OSError, ValueError, zlib.error)
  try:
    loaded = np.load(io.BytesIO(data), allow_pickle=False)
    if isinstance(loaded, np.lib.npyio.NpzFile):
      with loaded as z:
        flat = {k: z[k] for k in z.files}
  except bad as e:
    raise CheckpointError(
        f"{path}: not a readable npz archive ({type(e).__name__}: {e}). The file "
        "is truncated or corrupt: download it again and compare its size.") from e
  if not isinstance(loaded, np.lib.npyio.NpzFile):
    raise CheckpointError(f"{path}: holds a single array of shape {np.shape(loaded)}, "
                          "not an npz archive of named arrays.")
  for k, v in flat.items():
    if not isinstance(v, np.ndarray):  # np.load hands back other members as bytes
      raise CheckpointError(f"{path}: member {k!r} of the archive is not a .npy array; an "
                            "npz checkpoint holds only arrays.")
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


class Keys:
  """The file's tensors, handed out once each; leftovers are an error."""

  def __init__(self, flat: dict[str, np.ndarray], path: str, fmt: str):
    self.flat, self.path, self.fmt = flat, path, fmt
    self.used: set[str] = set()

  def has(self, key: str) -> bool:
    return key in self.flat

  def shape(self, key: str) -> str:
    """`key (shape)`: the evidence a field was read from."""
    return f"{key} {tuple(self.flat[key].shape)}"

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
      shown = ", ".join(self.shape(k) for k in left[:10])
      raise CheckpointError(
          f"{self.path}: {len(left)} tensor(s) not used by the {self.fmt} model "
          f"read from this file: {shown}{' ...' if len(left) > 10 else ''}. "
          "Refusing to ignore them; is this a different architecture?")


def take_head(keys: Keys, p: dict, cfg: dict, ev: dict,
              kernel: str = "head/kernel", bias: str = "head/bias") -> None:
  """The classifier, if the file has one (two-tower image towers often do not)."""
  if keys.has(kernel):
    w = keys.take(kernel).reshape(keys.flat[kernel].shape[-2:])  # big_transfer: (1, 1, C, K)
    p["head/kernel"], p["head/bias"] = w, keys.take(bias)
    cfg["num_classes"], ev["num_classes"] = w.shape[-1], keys.shape(kernel)
  else:
    cfg["num_classes"], ev["num_classes"] = None, f"no {kernel} in the file"


def _families():
  from vitcnn_jax.models import bit_io, mixer_io, vit_io  # pylint: disable=g-import-not-at-top
  return {"vit": vit_io, "bit": bit_io, "mixer": mixer_io}


def split_tower(path: str) -> tuple[str, str | None]:
  """'file.npz:img' -> ('file.npz', 'img'), big_vision's sub-tree syntax."""
  m = re.fullmatch(r"(.+\.npz):([\w/]+)", str(path))
  return (m[1], m[2]) if m else (str(path), None)


def _select(flat: dict[str, np.ndarray], path: str, tower: str | None) -> dict[str, np.ndarray]:
  """big_vision keeps params under `params/` or `opt/target/`; towers under `name/`.

  Keys beside the params tree (optimizer state, step counters) are left out with
  a logged warning; two different params trees in one file are an error.
  """
  found = [p for p in _PREFIXES if any(k.startswith(p) for k in flat)]
  if found:
    trees = [{k[len(p):]: v for k, v in flat.items() if k.startswith(p)} for p in found]
    if len(trees) == 2 and (trees[0].keys() != trees[1].keys() or any(
        not np.array_equal(v, trees[1][k]) for k, v in trees[0].items())):
      raise CheckpointError(f"{path}: holds two different parameter trees, under "
                            f"{found[0]!r} and {found[1]!r}; save the one you mean alone.")
    left = sorted(k for k in flat if not k.startswith(tuple(found)))
    if left:
      log.warning("%s: reading the parameters under %r; left out %d other keys (%s%s).", path,
                  found[0], len(left), ", ".join(left[:5]), " ..." if len(left) > 5 else "")
    flat = trees[0]
  groups = sorted({k.split("/")[0] for k in flat if "/" in k})
  towers = [g for g in groups if g in ("img", "txt", "image", "text")]
  if tower is None:
    if len(towers) > 1:
      raise CheckpointError(f"{path}: a two-tower checkpoint (towers {towers}); load the image "
                            f"tower as '{path}:img'.")
    return flat
  inner = {k[len(tower) + 1:]: v for k, v in flat.items() if k.startswith(tower + "/")}
  if not inner:
    raise CheckpointError(f"{path}: no tower {tower!r}; the file's sub-trees are {groups}.")
  return inner


def detect(flat: dict[str, np.ndarray], path: str = "<arrays>") -> tuple[str, Any]:
  """(format, family io module) of a flat tree."""
  for io_ in _families().values():
    if fmt := io_.detect(flat):
      return fmt, io_
  raise CheckpointError(f"{path}: unknown checkpoint format; first keys: {sorted(flat)[:8]}. "
                        "Expected an official ViT, BiT or Mixer npz (see README, formats).")


def _file_key(model, key: str, value, fmt: str | None) -> str:
  """The name `key` (ours) has in a file of format `fmt`, for messages."""
  if fmt is None:
    return key
  try:
    return next(iter(_families()[model.family].write(model, {key: np.asarray(value)}, fmt)))
  except Exception:  # pylint: disable=broad-except  (a key the writer maps only with others)
    return key


def check_params(model, params: Params, path: str = "<params>",
                 reading: Reading | None = None) -> None:
  """Every parameter present with the shape the model needs, and nothing else.
  Given the `reading` of a file, errors name the file's keys and say which
  tensors the architecture was read from."""
  size = models_lib.common.to_pair(model.image_size)
  images = jax.ShapeDtypeStruct((1, *size, 3), np.float32)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)["params"]
  want = {k: tuple(v.shape) for k, v in flatten(shapes).items()}
  flat = flatten(params)
  have = {k: tuple(np.shape(v)) for k, v in flat.items()}
  fmt = reading.fmt if reading else None
  read_as = f" {_read_as(reading)}" if reading else ""
  for k in sorted(set(want) | set(have)):
    if k not in have:
      raise CheckpointError(f"{path}: parameter {k} {want[k]} is missing for {model}.{read_as}")
    name = _file_key(model, k, flat[k], fmt)
    if k not in want:
      raise CheckpointError(f"{path}: {name} {have[k]} is not part of the model.{read_as}")
    if have[k] != want[k]:
      raise CheckpointError(
          f"{path}: {name} has shape {have[k]}, but the architecture read from the file "
          f"needs {want[k]}: the file is internally inconsistent.{read_as}")


def _read_as(r: Reading) -> str:
  """Each architecture field with the tensor it was read from, for messages."""
  return "The architecture was read as " + ", ".join(
      f"{f}={r.config[f]!r} (from {e})" for f, e in r.evidence.items()) + "."


def _check_values(flat: dict[str, np.ndarray], path: str) -> None:
  """Model tensors are finite floating-point arrays (bfloat16 is float32 by now)."""
  for k, v in flat.items():
    if v.dtype.kind != "f":
      raise CheckpointError(f"{path}: key {k!r} has dtype {v.dtype}, shape {v.shape}; model "
                            "tensors are floating point. The file is not a model checkpoint "
                            "or was written wrongly.")
    bad = int(v.size - np.count_nonzero(np.isfinite(v)))
    if bad:
      raise CheckpointError(f"{path}: key {k!r} ({v.dtype}, shape {v.shape}) holds {bad} "
                            "non-finite values (NaN or inf); the file is corrupt or comes from "
                            "a diverged run.")


def load_params(path: str) -> tuple[str, Reading]:
  """(family, what its reader found) of `path` or `path:tower`."""
  file, tower = split_tower(path)
  flat = _select(read_npz(file), path, tower)
  _check_values(flat, path)
  fmt, io_ = detect(flat, path)
  keys = Keys(flat, path, fmt)
  try:
    reading = io_.read(keys)
  except CheckpointError:
    raise
  except (ValueError, IndexError, KeyError) as e:  # e.g. a reshape of a malformed tensor
    odd = [keys.shape(k) for k, v in flat.items()
           if (k.endswith("kernel") and v.ndim < 2)
           or (k.rsplit("/", 1)[-1] in ("cls", "pos_embedding", "probe") and v.ndim != 3)]
    raise CheckpointError(
        f"{path}: a malformed {fmt} file: reading it failed with {type(e).__name__}: {e}. "
        + (f"Tensors of an unexpected rank: {', '.join(odd)}." if odd else
           "Compare its tensors with configs/inspect.py on an official file of the same model.")
    ) from e
  keys.finish()
  return io_.FAMILY, reading


def load_model(path: str, **overrides) -> tuple[Any, Params]:
  """Model and params of an official checkpoint, the architecture read from it.

  `path` may name a tower of a two-tower file: 'file.npz:img'. Overrides:
  `resolution` (or `image_size`), the family's OVERRIDABLE fields (numerics
  such as `gelu` or `root_pool_pad`, which default to the file's upstream), a
  field the file cannot decide (logged when assumed), or any architecture
  field, which must then agree with the file.
  """
  family, r = load_params(path)
  io_, cls = _families()[family], models_lib.FAMILIES[family]
  fields = {f for f in cls.__dataclass_fields__ if f not in ("parent", "name")}
  if "resolution" in overrides:
    if "image_size" in overrides:
      raise ValueError("Pass either resolution= or image_size=, not both.")
    overrides["image_size"] = overrides.pop("resolution")
  size = overrides.get("image_size")
  if size is not None and not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                                  and s > 0 for s in np.atleast_1d(np.asarray(size, object))):
    raise ValueError(f"load_model({path!r}): resolution={size!r} must be a positive integer "
                     "or a (height, width) pair of them.")
  for k, v in overrides.items():
    if k not in fields:
      raise ValueError(f"load_model({path!r}): unknown override {k}={v!r}; "
                       f"{family} models take {sorted(fields | {'resolution'})}.")
    if k in ("image_size", *io_.OVERRIDABLE, *r.assumed) or k not in r.config:
      continue
    if not (v == r.config[k] or (isinstance(v, (tuple, list))
                                 and tuple(v) == tuple(np.broadcast_to(r.config[k], len(v))))):
      raise CheckpointError(
          f"{path}: override {k}={v!r} contradicts the file, which has "
          f"{k}={r.config[k]!r} (from {r.evidence[k]}). Drop the override or use another file.")
  for k in set(r.assumed) - set(overrides):
    log.warning("%s: assumed %s=%r (%s); pass %s=... if it was trained otherwise.",
                path, k, r.config[k], r.evidence[k], k)
  native = r.config.get("image_size")
  cfg = {**r.config, **overrides}
  io_.adapt(cfg, r, native, path)
  try:
    model = cls(**cfg)
    params = unflatten({k: np.asarray(v, np.float32) for k, v in r.params.items()})
    check_params(model, params, path, r)
  except CheckpointError:
    raise
  except (ValueError, TypeError) as e:  # the model refuses the architecture read
    raise CheckpointError(f"{path}: the architecture read from the file is not a valid "
                          f"{family} model ({e}). {_read_as(r)}") from e
  return model, jax.tree_util.tree_map(jax.numpy.asarray, params)


def to_upstream(model, params: Params, format: str | None = None) -> dict[str, np.ndarray]:  # pylint: disable=redefined-builtin
  """Our params as the flat arrays of an upstream file (the family's FORMATS)."""
  check_params(model, params)
  io_ = _families()[model.family]
  format = format or io_.default_format(model)
  if format not in io_.FORMATS:
    raise ValueError(f"A {model.family} model saves as one of {sorted(io_.FORMATS)}, "
                     f"not {format!r}.")
  flat = {k: np.asarray(v, np.float32) for k, v in flatten(params).items()}
  return io_.write(model, flat, format)


def save(path: str, model, params: Params, format: str | None = None) -> None:  # pylint: disable=redefined-builtin
  """Writes an npz that `load_model`, upstream code and timm read like an official file."""
  arrays = to_upstream(model, params, format)
  fileio.atomic_write(path, lambda f: np.savez(f, **arrays))
