"""Results files, written atomically so an interrupted run never leaves half a file."""

from __future__ import annotations

import hashlib
import io
import json
import os
from typing import Any

import numpy as np

from vitcnn_jax import fileio


def write_json(path: str, obj: Any) -> None:
  data = json.dumps(obj, indent=1, sort_keys=False).encode()
  fileio.atomic_write(path, lambda f: f.write(data))


def workdir_path(workdir: str, name: str) -> str:
  return os.path.join(workdir, name)


def write_npz(path: str, **arrays: Any) -> None:
  def write(f):
    np.savez(f, **arrays)
  fileio.atomic_write(path, write)


def read_state(path: str, fingerprint: str) -> dict[str, np.ndarray] | None:
  """A saved accumulator state, or None; a state from another config is an error."""
  if not fileio.exists(path):
    return None
  with np.load(io.BytesIO(fileio.read_bytes(path)), allow_pickle=False) as z:
    state = {k: z[k] for k in z.files}
  if str(state.get("fingerprint")) != fingerprint:
    raise ValueError(
        f"{path} holds the state of a run with a different config; use a new --workdir "
        "or delete the file to start over.")
  return state


def fingerprint(obj: Any) -> str:
  """Stable hash of the parts of a config that determine the result."""
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
