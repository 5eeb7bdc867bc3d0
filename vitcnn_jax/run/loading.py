"""The configured models, loaded: checkpoint files (or models handed over in
memory), their capture lists and preprocessing, from the mapping `config.models`
(name -> model spec). Loading only loads: demo models are trained, if they must
be, by `demos.resolve` before a job starts."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import ml_collections

from vitcnn_jax import checkpoints
from vitcnn_jax import fileio
from vitcnn_jax.inputs import preprocess
from vitcnn_jax.inputs import zoo
from vitcnn_jax.models import anatomy
from vitcnn_jax.models import capturing
from vitcnn_jax.models import representations
from vitcnn_jax.models import sizes
from vitcnn_jax.models.formats import arrays
from vitcnn_jax.models.formats import in_memory
from vitcnn_jax.models.formats.base import CheckpointError, log


@dataclasses.dataclass
class Loaded:
  name: str  # its name in config.models: arrays, files and figures use it
  path: str  # the checkpoint read
  label: str
  model: Any
  params: Any
  names: list[str]
  policy: str
  setup: dict = dataclasses.field(default_factory=dict)  # how it was loaded, for every json
  capture: str | tuple[str, ...] = ""  # what chose `names`: a preset ("paper") or patterns
  outline: anatomy.Outline | None = None  # what comparisons read of its anatomy
  request: dict = dataclasses.field(default_factory=dict)  # its config fields (`request`)

  @property
  def key(self) -> str:
    """Its config field, for messages."""
    return f"models.{self.name}"

  @property
  def size(self) -> int:
    size = sizes.to_pair(self.model.image_size)
    if size[0] != size[1]:
      raise ValueError(f"config.{self.key}: non-square inputs {size} are not supported here.")
    return size[0]


def unreachable(path: str) -> str | None:
  """Why the checkpoint `path` (a file, zoo name or hub location) cannot be read
  (None: it can)."""
  if path.startswith(in_memory.IN_MEMORY):
    return None
  try:
    file, _ = checkpoints.locate(path)
    return None if fileio.exists(arrays.split_tower(file)[0]) else "no such file"
  except ImportError as e:
    return str(e)
  except Exception as e:  # network or credential errors of remote filesystems
    return f"{type(e).__name__}: {e}"


def request(spec: ml_collections.ConfigDict) -> dict:
  """The fields of a model's spec that decide what its forward computes (its
  label only names it): with the checkpoint's bytes, what a kept pass of it is
  reused for (`run/keeping.py`). JSON values, as a manifest holds them."""
  capture = spec.get("capture") or ""
  return json.loads(json.dumps({"checkpoint": spec.get("checkpoint") or "", "policy": spec.get("policy") or "",
                                "capture": capture if isinstance(capture, str) else list(capture),
                                "overrides": overrides(spec)}, default=str))


def overrides(spec: ml_collections.ConfigDict) -> dict:
  """The `load_model` overrides a model spec sets (unset ones are None)."""
  return {k: v for k, v in dict(spec.get("overrides", {})).items() if v is not None}


def load_models(config: ml_collections.ConfigDict, hint: str = "",
                needs: Sequence[tuple[str, str]] = ()) -> dict[str, Loaded]:
  """Every model of `config.models`, by name, each with the capabilities `needs`
  asks of it (pairs of a model name, or "*", and a capability)."""
  return {n: load_model(config, n, hint, [c for m, c in needs if m in (n, "*")])
          for n in config.models}


def load_model(config: ml_collections.ConfigDict, name: str, hint: str = "",
               needs: Sequence[str] = ()) -> Loaded:
  """The model `config.models[name]`, refused unless it has each of `needs`."""
  spec, key = config.models[name], f"models.{name}"
  path = spec.get("checkpoint")
  if not path:
    raise ValueError(f"config.{key}.checkpoint is empty; pass --config.{key}.checkpoint=FILE.npz{hint}")
  if why := unreachable(path):
    raise FileNotFoundError(
        f"config.{key}.checkpoint={path!r} is not reachable ({why}). Pass a local "
        f"copy with --config.{key}.checkpoint=/path/to/file{hint}")
  try:
    c = checkpoints.load(path, **overrides(spec))
  except CheckpointError as e:
    if not spec.get("train"):
      raise
    raise CheckpointError(  # a model this tool trained: no one to download it from
        f"config.{key}: the cached trained model {path} cannot be read ({e}). Delete it to "
        "train it again.") from e
  for need in needs:
    anatomy.require(c.model, need, f"config.{key}")
  policy, source = c.preprocessing(spec.get("policy") or "")
  if not spec.get("policy") and not spec.get("train"):
    log.warning("config.%s: preprocessing %s (%s), from %s; set --config.%s.policy=... if "
                   "it was trained otherwise.", key, policy, preprocess.describe(policy), source, key)
  label, label_from = label_of(spec, c.model.family)
  if label_from.startswith("the checkpoint"):
    log.warning("config.%s: labelled %r, %s; set --config.%s.label=... to name it otherwise.",
                   key, label, label_from, key)
  try:
    out = loaded(name, c.path, label, c.model, c.params, spec.capture, policy)
  except ValueError as e:
    raise ValueError(f"config.{key}.{e}") from e
  out.request = request(spec)
  size = c.model.image_size
  out.setup = {"label": label, "label from": label_from,
               "checkpoint": path, "file": c.path, "format": c.fmt, "family": c.model.family,
               "image_size": size if isinstance(size, int) else list(size),
               "assumed": {k: v if isinstance(v, (int, float, str)) else str(v)
                           for k, v in c.assumed.items()}, "policy": policy,
               "preprocessing": preprocess.describe(policy), "policy from": source}
  return out


def label_of(spec: ml_collections.ConfigDict, family: str) -> tuple[str, str]:
  """The model's label and where it came from. A config writes a label with the
  checkpoint it names (`label_of`: that checkpoint and label); once the checkpoint
  is overridden, that label would name a model that never ran, so the label
  follows the new checkpoint (its zoo name, else its file's name) unless the
  label was overridden too."""
  path, label = spec.checkpoint, spec.get("label") or ""
  written = tuple(spec.get("label_of") or ("", ""))
  if label and (not written[0] or written[0] == path or written[1] != label):
    return label, "config"
  if path.startswith(in_memory.IN_MEMORY):
    return label or family, "config" if label else "the model's family"
  if name := zoo.name_of(path):
    return name, "the checkpoint's zoo name"
  return _file_label(path), "the checkpoint's file name"


def _file_label(path: str) -> str:
  """'dir/ViT-L_16.npz' -> 'ViT-L_16'; 'f.npz:img' -> 'f:img'; 'hf-hub:org/m.v1' -> 'm.v1'
  (only a checkpoint's own extension is dropped: hub names have dots)."""
  file, tower = arrays.split_tower(path)
  stem = os.path.basename(file.rstrip("/")).removesuffix(".npz").removesuffix(".safetensors")
  return f"{stem}:{tower}" if tower else stem


def loaded(name: str, path: str, label: str, model, params, capture: str | Sequence[str],
           policy: str = "") -> Loaded:
  """A model ready for the driver: in its inference form (`for_inference`), its
  points matching `capture` (patterns or preset names such as "paper", each of
  which must match) and its preprocessing `policy` (default: the model's own)."""
  model, params = model.for_inference(params)
  patterns = anatomy.capture_patterns(model, capture)
  names = list(representations.point_shapes(model, params, patterns))
  unmatched = [p for p in patterns if not any(capturing.matches(n, [p]) for n in names)]
  if unmatched:  # one misspelt pattern among several would silently drop a layer type
    raise ValueError(f"capture: {unmatched} of {patterns} match no representation point of "
                     f"{path}; list them with configs/inspect.py.")
  policy = policy or model.default_policy
  preprocess.check_policy(policy)
  return Loaded(name, path, label, model, params, names, policy,
                capture=capture if isinstance(capture, str) else tuple(capture), outline=anatomy.outline(model))
