"""Hugging Face model folders, read without running any of their code: the
weights (`model.safetensors`, or shards listed by `model.safetensors.index.json`)
and the settings written beside them (`config.json`, and the image processor's
`preprocessor_config.json`). transformers' `save_pretrained` and timm's
`push_to_hub` both write such folders; huggingface_hub's cache keeps one per
snapshot. A single `.safetensors` file with a `config.json` beside it (a timm
hub cache entry) reads its settings too.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from vitcnn_jax import fileio
from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models.formats import arrays
from vitcnn_jax.models.formats.base import CheckpointError, log

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
PREPROCESSOR = "preprocessor_config.json"
_PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "open_clip_pytorch_model.bin")


@dataclasses.dataclass(frozen=True)
class Meta:
  """The settings a folder states beside its weights."""
  config: dict[str, Any]  # config.json
  preprocessor: dict[str, Any]  # preprocessor_config.json ({} when absent)
  folder: str

  def policy(self) -> tuple[str, str] | None:
    """(policy, where it is stated): the preprocessing its image processor states,
    as one of ours; None without one, or where none of ours reproduces it. A
    malformed setting is refused naming the file."""
    if not self.preprocessor:
      return None
    try:
      return preprocess.from_hf_processor(self.preprocessor)
    except ValueError as e:
      raise CheckpointError(f"{os.path.join(self.folder, PREPROCESSOR)}: {e} Correct it in "
                               "that file.") from None

  def input_size(self) -> tuple[int, str] | None:
    """(size, evidence): the square size its image processor hands the model."""
    return preprocess.hf_input_size(self.preprocessor) if self.preprocessor else None


def policy(meta: Meta | None, fallback: str, what: str) -> tuple[str, str]:
  """(policy, where it comes from): the image processor's, else `fallback` (`what`
  says whose), with a warning where the folder's processor is none of our policies."""
  if meta and meta.preprocessor:
    found = meta.policy()
    if found:
      return found
    log.warning("%s: its preprocessor_config.json (%s) matches none of our policies; using "
                   "%s (%s). Set the model's policy if it was evaluated otherwise.", meta.folder,
                   meta.preprocessor.get("image_processor_type", "image processor"), fallback, what)
    return fallback, f"its preprocessor_config.json matching none of ours; {what}"
  return fallback, f"no preprocessor_config.json; {what}"


def is_folder(path: str) -> bool:
  return not fileio.is_remote(path) and os.path.isdir(path)


def _json(path: str) -> dict[str, Any]:
  try:
    value = json.loads(fileio.read_bytes(path))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{path}: not valid JSON ({e}); download it again.") from e
  if not isinstance(value, dict):
    raise CheckpointError(f"{path}: holds a {type(value).__name__}, not a JSON object.")
  return value


def weight_files(folder: str) -> list[str]:
  """The safetensors files holding a folder's weights: the one file, or the shards
  its index names (each must be present)."""
  if os.path.exists(os.path.join(folder, WEIGHTS)):
    return [os.path.join(folder, WEIGHTS)]
  index = os.path.join(folder, INDEX)
  if os.path.exists(index):
    weight_map = _json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise CheckpointError(f"{index}: no 'weight_map' of tensor names to shard files.")
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if not os.path.exists(os.path.join(folder, s))]
    if missing:
      raise CheckpointError(f"{index}: names shard(s) {missing} that are not in {folder}; "
                               "download the whole repository again.")
    return [os.path.join(folder, s) for s in shards]
  pickled = [f for f in _PICKLED if os.path.exists(os.path.join(folder, f))]
  found = sorted(os.listdir(folder))
  if pickled:
    raise CheckpointError(
        f"{folder}: its weights are a PyTorch pickle ({pickled[0]}), which is never read "
        "(pickles can run code). Download the repository's model.safetensors, or convert "
        "the weights with safetensors.torch.save_file.")
  raise CheckpointError(f"{folder}: no {WEIGHTS} or {INDEX} in this folder (it holds "
                           f"{found[:8]}); pass a Hugging Face model folder or a weights file.")


def settings(folder: str) -> Meta | None:
  """The folder's config.json (and preprocessor_config.json), if it has one."""
  config = os.path.join(folder, CONFIG)
  if not os.path.exists(config):
    return None
  pre = os.path.join(folder, PREPROCESSOR)
  return Meta(_json(config), _json(pre) if os.path.exists(pre) else {}, folder)


def read(folder: str) -> tuple[dict[str, np.ndarray], Meta | None]:
  """A folder's tensors (all shards) and its settings."""
  flat: dict[str, np.ndarray] = {}
  for file in weight_files(folder):
    for k, v in arrays.decode_arrays(file, arrays.read_bytes(file)).items():
      if k in flat:
        raise CheckpointError(f"{file}: tensor {k!r} is in two shards of {folder}.")
      flat[k] = v
  return flat, settings(folder)


def beside(file: str) -> Meta | None:
  """The settings of a lone `.safetensors` file's folder (a hub cache snapshot), if
  the file is that folder's own weights (`model.safetensors` or a shard its index
  names) and its config.json describes a model (transformers' `model_type` or
  timm's `architecture`); None otherwise."""
  if fileio.is_remote(file) or not str(file).endswith(".safetensors"):
    return None
  folder = os.path.dirname(os.path.abspath(file))
  index = os.path.join(folder, INDEX)
  named = {WEIGHTS} | (set(_json(index).get("weight_map", {}).values()) if os.path.exists(index) else set())
  if os.path.basename(file) not in named:  # another file beside the folder's own weights
    return None
  meta = settings(folder)
  if meta and ("model_type" in meta.config or "architecture" in meta.config):
    return meta
  return None
