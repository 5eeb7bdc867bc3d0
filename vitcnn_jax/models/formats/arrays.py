"""A checkpoint file's bytes and arrays: npz and safetensors told apart by their
bytes, pickles refused unread, values checked, and the content digest a run's
identity keeps (`path:tower` and model folders included)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
import zipfile
import zlib

import numpy as np

from vitcnn_jax import fileio
from vitcnn_jax.models.formats import in_memory
from vitcnn_jax.models.formats.base import CheckpointError

_DIGESTS: dict[str, str] = {}  # path -> hash of the bytes read_bytes last read there


def split_tower(path: str) -> tuple[str, str | None]:
  """'file.npz:img' -> ('file.npz', 'img'), big_vision's sub-tree syntax (and
  'file.onnx:backbone', a sub-module of an ONNX model)."""
  m = re.fullmatch(r"(.+\.(?:npz|onnx)):([\w/.]+)", str(path))
  return (m[1], m[2]) if m else (str(path), None)


def _folder_files(folder: str) -> list[str]:
  """A model folder's files that decide it: its weights and settings."""
  return sorted(n for n in os.listdir(folder) if n.endswith((".safetensors", ".json")))


def _settings_beside(file: str) -> str | None:
  """The config.json beside a local safetensors file, which may decide its architecture."""
  beside = os.path.join(os.path.dirname(file), "config.json")
  if str(file).endswith(".safetensors") and not fileio.is_remote(file) and os.path.exists(beside):
    return beside
  return None


def digest(path: str) -> str:
  """Content hash of a checkpoint file (`file.npz:tower` hashes the file): the bytes
  this process loaded from it, or read now if it loaded none."""
  if path.startswith(in_memory.IN_MEMORY):
    return path[len(in_memory.IN_MEMORY):]
  file, _ = split_tower(path)
  if file not in _DIGESTS and os.path.isdir(file):
    _DIGESTS[file] = _combined(file, _folder_files(file))
  if file not in _DIGESTS:
    _DIGESTS[file] = hashlib.sha256(fileio.read_bytes(file)).hexdigest()[:16]
  if _settings_beside(file):
    return hashlib.sha256(f"{_DIGESTS[file]};{_combined(os.path.dirname(file), ['config.json'])}"
                          .encode()).hexdigest()[:16]
  return _DIGESTS[file]


def stamp(path: str) -> list | None:
  """The size and modification time (ns) of each local file whose bytes `digest`
  reads for `path`: unchanged, its digest is unchanged too (a file rewritten in
  place at the same size and the same nanosecond aside), so a caller holding an
  earlier digest and stamp need not read the bytes again. None for a remote or
  in-memory checkpoint, or a missing file."""
  file, _ = split_tower(path)
  if path.startswith(in_memory.IN_MEMORY) or fileio.is_remote(file) or not os.path.exists(file):
    return None
  if os.path.isdir(file):
    files = [os.path.join(file, n) for n in _folder_files(file)]
  else:
    files = [file, *filter(None, [_settings_beside(file)])]
  stats = [os.stat(f) for f in files]
  return [[f, st.st_size, st.st_mtime_ns] for f, st in zip(files, stats)]


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
  import safetensors.numpy
  try:
    if not fileio.is_remote(path):
      flat = safetensors.numpy.load_file(path)
    else:  # its NumPy reader takes bfloat16 only from a file
      with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        f.write(data)
        f.flush()
        flat = safetensors.numpy.load_file(f.name)
  except Exception as e:  # SafetensorError, or a bad header
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
      import ml_dtypes  # jax dependency
      v = v.view(ml_dtypes.bfloat16)
    if v.dtype.kind == "f" or v.dtype.name == "bfloat16":
      flat[k] = np.asarray(v, np.float32)
  if not flat:
    raise CheckpointError(f"{path}: the npz archive is empty.")
  return flat


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

