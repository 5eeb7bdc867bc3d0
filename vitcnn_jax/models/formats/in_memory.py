"""Models handed over in memory (a notebook's own params): kept under a
`memory:DIGEST` name so that they take the same path through loading as files."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from vitcnn_jax.models.formats.base import CheckpointError, Params
from vitcnn_jax.models.param_trees import flatten

IN_MEMORY = "memory:"  # the "path" of parameters handed over in memory: memory:DIGEST


_REMEMBERED: dict[str, tuple[Any, Params]] = {}  # memory:DIGEST -> (model, params)


def params_digest(params) -> str:
  """`IN_MEMORY` + a content hash of a parameter tree, its stand-in for a file's digest."""
  h = hashlib.sha256()
  for key, value in sorted(flatten(params).items()):
    h.update(key.encode())
    h.update(np.ascontiguousarray(np.asarray(value, np.float32)).tobytes())
  return IN_MEMORY + h.hexdigest()[:16]


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

