"""Results files, written atomically so an interrupted run never leaves half a file."""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from typing import Any

import numpy as np

from vitcnn_jax import fileio


def write_json(path: str, obj: Any) -> None:
  data = json.dumps(obj, indent=1, sort_keys=False).encode()
  fileio.atomic_write(path, lambda f: f.write(data))


def non_finite(arrays: dict[str, np.ndarray] | None, summary: Any) -> dict[str, int]:
  """Where a run's results hold NaN or inf: "NAME.npz:ARRAY" or "NAME.json:a.b[3]"
  -> how many values. Every analysis checks its own numbers; this is the last
  net, so that no such value is written without saying where."""
  out = {}
  for k, v in (arrays or {}).items():
    v = np.asarray(v)
    if np.issubdtype(v.dtype, np.floating) and not np.isfinite(v).all():
      out[f"npz:{k}"] = int(v.size - np.isfinite(v).sum())

  def walk(node: Any, where: str) -> None:
    if isinstance(node, dict):
      for k, v in node.items():
        walk(v, f"{where}.{k}" if where else str(k))
    elif isinstance(node, (list, tuple)):
      for i, v in enumerate(node):
        walk(v, f"{where}[{i}]")
    elif isinstance(node, (float, np.floating)) and not np.isfinite(node):
      out[f"json:{where}"] = 1

  walk(summary, "")
  return out


def flag_non_finite(name: str, arrays: dict[str, np.ndarray] | None, summary: dict) -> dict:
  """`summary` with `non_finite` (where NaN or inf sit, see `non_finite`) if any,
  said in the log too: flagged where it is written."""
  bad = non_finite(arrays, summary)
  if not bad:
    return summary
  print(f"WARNING: {name}'s results hold NaN or inf values at {sorted(bad)[:8]}"
        f"{' ...' if len(bad) > 8 else ''} (the json's non_finite lists them all): an analysis "
        "left a value undefined without saying why. Please report it with the config.")
  return {**summary, "non_finite": bad}


def workdir_path(workdir: str, name: str) -> str:
  return os.path.join(workdir, name)


def write_npz(path: str, **arrays: Any) -> None:
  def write(f):
    np.savez(f, **arrays)
  fileio.atomic_write(path, write)


def read_state(path: str, identity: dict[str, Any]) -> dict[str, np.ndarray] | None:
  """A saved state, or None; a state of another run (`identity`: what determines the
  result, by part) is an error naming the parts that differ."""
  if not fileio.exists(path):
    return None
  try:
    with np.load(io.BytesIO(fileio.read_bytes(path)), allow_pickle=False) as z:
      state = {k: z[k] for k in z.files}
    saved = json.loads(str(state["identity"]))
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    raise ValueError(f"{path}: not a readable state file ({type(e).__name__}: {e}); delete it "
                     "to start over (its partial results are lost).") from e
  if saved != json.loads(json.dumps(identity, default=str)):
    differ = sorted(k for k in set(saved) | set(identity)
                    if json.dumps(saved.get(k), sort_keys=True, default=str)
                    != json.dumps(identity.get(k), sort_keys=True, default=str))
    raise ValueError(
        f"{path} holds the state of another run: its {', '.join(differ)} differ from this "
        "run's. Resuming would mix the two. Use a new --workdir, or delete the file to "
        "start over.")
  return state


def fingerprint(obj: Any) -> str:
  """Stable hash of the parts of a config that determine the result."""
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
