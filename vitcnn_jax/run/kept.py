"""A model's pass, kept on disk: each minibatch's statistics of every captured layer.

Every measure reads a layer of a minibatch through its `registry.Stack` (the
Gram of its centred rows, three per-example vectors and four numbers), so a
model's pass can be run once and its stacks kept; any set of kept passes over
the same examples is then compared without running a model again (`combining`).

A kept pass is a folder:

- `manifest.json`, written first: the format and its version, the model
  (checkpoint and its digest, capture list, preprocessing, input size, the
  config fields that chose them, and what comparisons read of its anatomy), the
  sample (the source's identity and each repeat's examples, in order), the
  protocol (minibatch size, examples, repeats, seed, Gram precision) and the
  size of what is kept;
- `r{repeat}_b{minibatch}.npz` for each minibatch, written atomically: the
  stack's arrays, the mask, the examples' indices and the SHA-256 of the uint8
  pixels the source gave for them (before any model's preprocessing);
- `complete.json`, written last: the SHA-256 of every minibatch file. A pass
  without it is unfinished (it resumes from the files that exist) and is never
  read; a file whose bytes do not match is refused by name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import zipfile
from typing import Any, Iterator

import numpy as np

from vitcnn_jax import fileio
from vitcnn_jax.run import results

FORMAT, VERSION = "vitcnn_jax kept pass", 2
MANIFEST, COMPLETE = "manifest.json", "complete.json"
# The stack's arrays (`registry.Stack`'s fields) and what identifies the minibatch.
STACK = ("gram", "proj", "rowmean", "mean_sq", "mean_4th", "features", "e")
SAMPLE = ("mask", "indices", "pixels")
# What every kept pass compared with another must share (the model is what differs).
SHARED = ("format", "version", "protocol", "sample")


class KeptError(ValueError):
  """A kept pass that cannot be read or combined: the message says which and why."""


def minibatch_file(repeat: int, minibatch: int) -> str:
  return f"r{repeat:03d}_b{minibatch:05d}.npz"


def pixel_digest(images: list[np.ndarray]) -> str:
  """SHA-256 of a minibatch's uint8 images as the source gave them, in order
  (shapes included: a crop of another size is other pixels)."""
  h = hashlib.sha256()
  for img in images:
    a = np.ascontiguousarray(img)
    h.update(f"{a.shape}{a.dtype.str};".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def bytes_per_minibatch(layers: int, rows: int) -> int:
  """Disk bytes of one minibatch's stack (float32 Grams and vectors, uncompressed)."""
  return 4 * layers * (rows * rows + 2 * rows + 4) + 16 * rows + 64


def describe_size(num: int) -> str:
  for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
    if num >= scale:
      return f"{num / scale:.1f} {unit}"
  return f"{num} B"


@dataclasses.dataclass(frozen=True)
class Pass:
  """A kept pass's folder and its manifest."""
  folder: str
  manifest: dict

  @property
  def name(self) -> str:
    return self.manifest["model"]["name"]

  @property
  def layers(self) -> list[str]:
    return self.manifest["model"]["points"]

  def minibatches(self, repeat: int) -> int:
    return self.manifest["sample"]["repeats"][repeat]["minibatches"]

  def path(self, repeat: int, minibatch: int) -> str:
    return os.path.join(self.folder, minibatch_file(repeat, minibatch))

  def write_manifest(self) -> None:
    results.write_json(os.path.join(self.folder, MANIFEST), self.manifest)

  def write_minibatch(self, repeat: int, minibatch: int, arrays: dict[str, np.ndarray]) -> None:
    missing = [k for k in STACK + SAMPLE if k not in arrays]
    if missing:
      raise ValueError(f"a kept minibatch needs {missing}")
    results.write_npz(self.path(repeat, minibatch), **arrays)

  def written(self, repeat: int) -> list[int]:
    """The minibatches of `repeat` whose files exist and open (a resumed pass skips them)."""
    return [b for b in range(self.minibatches(repeat)) if _opens(self.path(repeat, b))]

  def complete(self) -> None:
    """Records every minibatch file's digest: the pass is finished and readable."""
    digests = {minibatch_file(r, b): _sha256(self.path(r, b))
               for r, rep in enumerate(self.manifest["sample"]["repeats"])
               for b in range(rep["minibatches"])}
    results.write_json(os.path.join(self.folder, COMPLETE), {"files": digests})

  def read(self, repeat: int, minibatch: int, digests: dict[str, str]) -> dict[str, np.ndarray]:
    """One minibatch's arrays, its bytes checked against the completion record."""
    path, name = self.path(repeat, minibatch), minibatch_file(repeat, minibatch)
    if not fileio.exists(path):
      raise KeptError(f"{path}: missing from a finished kept pass. Delete {self.folder} and run "
                      "the model's pass again.")
    data = fileio.read_bytes(path)
    if hashlib.sha256(data).hexdigest() != digests.get(name):
      raise KeptError(f"{path}: its bytes differ from those recorded in {COMPLETE} when the pass "
                      f"finished (torn, truncated or changed since). Delete {self.folder} and run "
                      "the model's pass again.")
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
      return {k: z[k] for k in z.files}


def _sha256(path: str) -> str:
  return hashlib.sha256(fileio.read_bytes(path)).hexdigest()


def _opens(path: str) -> bool:
  if not fileio.exists(path):
    return False
  try:
    with np.load(io.BytesIO(fileio.read_bytes(path)), allow_pickle=False) as z:
      return all(k in z.files for k in STACK + SAMPLE)
  except (OSError, ValueError, EOFError, zipfile.BadZipFile):
    return False


def read_json(path: str) -> Any:
  try:
    return json.loads(fileio.read_bytes(path))
  except (OSError, ValueError) as e:
    raise KeptError(f"{path}: not a readable kept-pass record ({type(e).__name__}: {e}).") from e


def open_pass(folder: str) -> tuple[Pass, dict[str, str]]:
  """A finished kept pass and its files' digests, or a `KeptError` saying why not."""
  manifest_path = os.path.join(folder, MANIFEST)
  if not fileio.exists(manifest_path):
    raise KeptError(f"{folder}: no kept pass here ({MANIFEST} is missing).")
  manifest = read_json(manifest_path)
  if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
    raise KeptError(f"{manifest_path}: format {manifest.get('format')!r} version "
                    f"{manifest.get('version')!r}, where this version of vitcnn_jax reads "
                    f"{FORMAT!r} version {VERSION}. Run the model's pass again.")
  complete = os.path.join(folder, COMPLETE)
  kept = Pass(folder, manifest)
  if not fileio.exists(complete):
    done = sum(len(kept.written(r)) for r in range(len(manifest["sample"]["repeats"])))
    total = sum(rep["minibatches"] for rep in manifest["sample"]["repeats"])
    raise KeptError(f"{folder}: the kept pass of {kept.name!r} is unfinished ({done} of {total} "
                    "minibatches written); run it again to resume it.")
  return kept, read_json(complete)["files"]


def differences(a: dict, b: dict, where: str = "") -> Iterator[str]:
  """The dotted names of the fields where two manifests' parts differ."""
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b), key=str):
      yield from differences(a.get(k), b.get(k), f"{where}.{k}" if where else str(k))
  elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
    for i, (x, y) in enumerate(zip(a, b)):
      yield from differences(x, y, f"{where}[{i}]")
  elif a != b:
    yield where


def check_shared(passes: list[Pass]) -> None:
  """Every kept pass saw the same examples in the same order, from the same source,
  under the same protocol; else a `KeptError` naming each field that differs and
  what it means."""
  first = passes[0]
  for other in passes[1:]:
    diff = [d for part in SHARED for d in differences(first.manifest.get(part), other.manifest.get(part), part)]
    # Other examples come in another order too: say the order only of the same examples.
    diff = [d for d in diff if not (d.endswith(".order") and d.replace(".order", ".examples") in diff)]
    if diff:
      shown = "; ".join(f"{d} ({_what(d)})" for d in diff[:4]) + ("; ..." if len(diff) > 4 else "")
      raise KeptError(f"the kept passes of {first.name!r} ({first.folder}) and {other.name!r} "
                      f"({other.folder}) cannot be compared: they differ in {shown}. Keep every "
                      "pass with the same config.data, num_examples, batch_size, repeats, seed and "
                      "gram_precision.")


def _what(field: str) -> str:
  if field.startswith(("format", "version")):
    return "written by another version of the kept-pass format"
  if field.startswith("protocol"):
    return "another protocol"
  if field.endswith(".order"):
    return "the examples in another order"
  if field.endswith(".examples") or field == "sample.source":
    return "other examples"
  return "another sample"
