"""What every checkpoint format shares, imported by the families' readers:
errors, what a reader found (`Reading`), the key ledger (`Keys`), npz reading,
value checks, content digests, and parameters handed over in memory."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import os
import re
import tempfile
import zipfile
import zlib
from typing import Any

import numpy as np

from vitcnn_jax import fileio
from vitcnn_jax.models.common import flatten

Params = dict[str, Any]
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
  sources: dict[str, str] = dataclasses.field(default_factory=dict)  # ours -> file key, where
  # no writer maps it back (a block of a scan-stacked tree), for messages
  policy: tuple[str, str] | None = None  # (policy, where it is stated): the preprocessing
  # the file's own settings give (a preprocessor_config.json), else its format's


_DIGESTS: dict[str, str] = {}  # path -> hash of the bytes read_bytes last read there


IN_MEMORY = "memory:"  # the "path" of parameters handed over in memory: memory:DIGEST
_REMEMBERED: dict[str, tuple[Any, Params]] = {}  # memory:DIGEST -> (model, params)


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
  if file not in _DIGESTS and os.path.isdir(file):  # a model folder: its weights and settings
    names = [n for n in os.listdir(file) if n.endswith((".safetensors", ".json"))]
    _DIGESTS[file] = _combined(file, names)
  if file not in _DIGESTS:
    _DIGESTS[file] = hashlib.sha256(fileio.read_bytes(file)).hexdigest()[:16]
  beside = os.path.join(os.path.dirname(file), "config.json")  # it may decide the architecture
  if str(file).endswith(".safetensors") and not fileio.is_remote(file) and os.path.exists(beside):
    return hashlib.sha256(f"{_DIGESTS[file]};{_combined(os.path.dirname(file), ['config.json'])}"
                          .encode()).hexdigest()[:16]
  return _DIGESTS[file]


def _combined(folder: str, names: list[str]) -> str:
  h = hashlib.sha256()
  for name in sorted(names):
    h.update(f"{name}:{digest(os.path.join(folder, name))};".encode())
  return h.hexdigest()[:16]


_PICKLES = (".pth", ".pt", ".bin", ".ckpt", ".pkl", ".pickle")


def read_bytes(path: str) -> bytes:
  """A checkpoint file's bytes (their digest kept for `digest`). Pickles (`.pth`,
  `.bin`) are refused unread."""
  if str(path).lower().endswith(_PICKLES):
    raise CheckpointError(
        f"{path}: a PyTorch pickle; pickles can run code when loaded, so they are never "
        "read. Use the model's .safetensors file (timm and Hugging Face publish one for "
        "each model), or convert it with safetensors.torch.save_file(state_dict, ...).")
  data = fileio.read_bytes(path)
  _DIGESTS[path] = hashlib.sha256(data).hexdigest()[:16]
  return data


def decode_arrays(path: str, data: bytes) -> dict[str, np.ndarray]:
  """All arrays of an npz or safetensors file (told apart by their bytes), as
  float32 where floating point."""
  if str(path).lower().endswith(".safetensors") or _is_safetensors(data):
    flat = _read_safetensors(path, data)
    # BatchNorm's step counters and the integer index buffers older transformers files
    # carry (CLIP's position_ids, Swin's relative_position_index) are not weights.
    return {k: v for k, v in flat.items() if not k.endswith(_INDEX_BUFFERS)}
  return _read_npz(path, data)


_INDEX_BUFFERS = (".num_batches_tracked", ".position_ids", ".relative_position_index")


def _is_safetensors(data: bytes) -> bool:
  """An 8-byte little-endian header length, then a JSON object."""
  n = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
  return 8 < 8 + n <= len(data) and data[8:9] == b"{"


def _read_safetensors(path: str, data: bytes) -> dict[str, np.ndarray]:
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  try:
    if not fileio.is_remote(path):
      flat = safetensors.numpy.load_file(path)
    else:  # its NumPy reader takes bfloat16 only from a file
      with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        f.write(data)
        f.flush()
        flat = safetensors.numpy.load_file(f.name)
  except Exception as e:  # pylint: disable=broad-except  (SafetensorError, or a bad header)
    raise CheckpointError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e}). "
                          "It is truncated or corrupt: download it again.") from e
  if not flat:
    raise CheckpointError(f"{path}: the safetensors file holds no tensors.")
  return {k: np.asarray(v, np.float32) if v.dtype.kind == "f" or v.dtype.name == "bfloat16"
          else v for k, v in flat.items()}


def _read_npz(path: str, data: bytes) -> dict[str, np.ndarray]:
  """All arrays of an npz file; bfloat16 (stored as void) becomes float32."""
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
  pickled = [k for k in flat if k.endswith(".pkl")]
  if pickled:  # torch.save writes a zip archive too
    raise CheckpointError(f"{path}: a PyTorch archive (member {pickled[0]!r}) holding a pickle, "
                          "which is never read; use the model's .safetensors file instead.")
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

  def __init__(self, flat: dict[str, np.ndarray], path: str, fmt: str, prefix: str = "",
               graph: Any = None, meta: Any = None):
    self.flat, self.path, self.fmt = flat, path, fmt
    self.prefix = prefix  # what the file puts before every key (`params/`), for messages
    self.graph = graph  # an ONNX file's `onnx_file.Graph`, else None
    self.meta = meta  # the settings beside the weights (`hf_folder.Meta`), else None
    self.used: set[str] = set()

  def has(self, key: str) -> bool:
    return key in self.flat

  def shape(self, key: str) -> str:
    """`key (shape)`: the evidence a field was read from, named as the file names it."""
    named = self.graph.described.get(self.prefix + key) if self.graph else None
    return f"{named or key} {tuple(self.flat[key].shape)}"

  def take(self, key: str) -> np.ndarray:
    if key not in self.flat:
      raise CheckpointError(
          f"{self.path}: key {self.prefix + key!r} is missing; a {self.fmt} checkpoint with "
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
      shown = ", ".join(self.shape(k) if self.graph else self.prefix + self.shape(k)
                        for k in left[:10])
      raise CheckpointError(
          f"{self.path}: {len(left)} tensor(s) not used by the {self.fmt} model "
          f"read from this file: {shown}{' ...' if len(left) > 10 else ''}. "
          "Refusing to ignore them; is this a different architecture?")


def take_head(keys: Keys, p: dict, cfg: dict, ev: dict,
              kernel: str = "head/kernel", bias: str = "head/bias") -> None:
  """The classifier, if the file has one (two-tower image towers often do not)."""
  if keys.has(kernel):
    w = keys.take(kernel)
    if not (w.ndim == 2 or (w.ndim == 4 and w.shape[:2] == (1, 1))):
      raise CheckpointError(f"{keys.path}: {keys.prefix}{keys.shape(kernel)} should be a 2-D "
                            "(width, classes) kernel, or (1, 1, width, classes) as big_transfer "
                            "writes it. The file is malformed.")
    w = w.reshape(w.shape[-2:])
    p["head/kernel"], p["head/bias"] = w, keys.take(bias)
    cfg["num_classes"], ev["num_classes"] = w.shape[-1], keys.shape(kernel)
  else:
    cfg["num_classes"], ev["num_classes"] = None, f"no {kernel} in the file"


def take_head_torch(keys: Keys, p: dict, cfg: dict, ev: dict, name: str = "head") -> None:
  """A torch Linear classifier `name`, if the file has one."""
  if keys.has(f"{name}.weight"):
    p["head/kernel"], p["head/bias"] = take_torch_linear(keys, name)
    cfg["num_classes"], ev["num_classes"] = p["head/kernel"].shape[1], keys.shape(f"{name}.weight")
  else:
    cfg["num_classes"], ev["num_classes"] = None, f"no {name}.weight in the file"


# PyTorch state dicts (timm's safetensors): torch's leaf names, and its layouts read as Flax's.
TORCH_LEAVES = {"kernel": "weight", "scale": "weight", "bias": "bias"}  # ours -> torch's


def take_torch_norm(keys: Keys, p: dict, name: str, ours: str) -> None:
  """A torch LayerNorm (or GRN) `name`: weight and bias as our scale and bias."""
  p[f"{ours}/scale"], p[f"{ours}/bias"] = keys.take(f"{name}.weight"), keys.take(f"{name}.bias")


def take_torch_linear(keys: Keys, name: str, bias: bool = True
                      ) -> tuple[np.ndarray, np.ndarray | None]:
  """A torch Linear `name` as a Flax (in, out) kernel and its bias (None where
  `bias` is False and the file has none)."""
  w = keys.take(f"{name}.weight")
  if w.ndim != 2:
    raise CheckpointError(f"{keys.path}: {keys.shape(name + '.weight')} is not a matrix.")
  b = keys.take(f"{name}.bias") if bias or keys.has(f"{name}.bias") else None
  return w.T, b


def split_tower(path: str) -> tuple[str, str | None]:
  """'file.npz:img' -> ('file.npz', 'img'), big_vision's sub-tree syntax (and
  'file.onnx:backbone', a sub-module of an ONNX model)."""
  m = re.fullmatch(r"(.+\.(?:npz|onnx)):([\w/.]+)", str(path))
  return (m[1], m[2]) if m else (str(path), None)


def check_values(flat: dict[str, np.ndarray], path: str) -> None:
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




def remember(model, params: Params) -> str:
  """A `memory:DIGEST` path under which `checkpoints.load_model` finds this model
  and these params: in-memory models then take the same path as files."""
  path = params_digest(params)
  _REMEMBERED[path] = (model, params)
  return path


def forget(path: str) -> None:
  """Drops what `remember` kept under `path` (the caller's params may then be freed)."""
  _REMEMBERED.pop(path, None)


def recall(path: str) -> tuple[Any, Params]:
  """The model and params `remember` gave `path`."""
  if path not in _REMEMBERED:
    raise CheckpointError(f"{path}: no model was handed over in memory under this name in this "
                          "process; pass the (model, params) pair again.")
  return _REMEMBERED[path]
