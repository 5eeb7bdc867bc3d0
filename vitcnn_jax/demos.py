"""Demo models (and any model a config trains rather than loads) resolved to
cached checkpoint files before a job starts: trained once, with a notice, if
the cache lacks them. After `resolve`, every model spec names a file, and the
job's data path (loading, the driver) never trains."""

from __future__ import annotations

import copy

import ml_collections

from vitcnn_jax import fileio
from vitcnn_jax import train
from vitcnn_jax.inputs import zoo
from vitcnn_jax.run import control


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with each model spec that has a `train` config and no checkpoint
  given the cached file of that training (a copy; `config` is left as it is)."""
  todo = [n for n, spec in (config.get("models") or {}).items()
          if spec.get("train") and not spec.get("checkpoint")]
  if not todo:
    return config
  out = copy.deepcopy(config)
  for name in todo:
    spec = out.models[name]
    spec.checkpoint = train.cached(spec.train, control.cache_dir(config))
    if spec.get("label_of"):  # the label names the trained file
      spec.label_of = (spec.checkpoint, spec.label_of[1])
    no_skip = spec.train.model.get("no_skip")  # an npz does not record a missing skip
    if no_skip and spec.overrides.get("no_skip") is None:
      spec.overrides.no_skip = tuple(no_skip)
  return out


def checkpoint(variant: str = "vit_demo", cache_dir: str = fileio.CACHE_DIR) -> str:
  """The npz of a demo model (`zoo.DEMO_ARCHITECTURES`), trained first (minutes,
  once) unless it is cached."""
  return train.cached(zoo.demo_training(variant), cache_dir)
