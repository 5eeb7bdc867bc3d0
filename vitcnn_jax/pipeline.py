"""The shared data path: config -> models, data source, and per-step global batches.

Every analysis consumes steps of `device_count` minibatches: each device holds
one whole minibatch (so per-minibatch statistics such as HSIC need no
communication), and each process loads only the minibatches of its own devices.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import Any, Iterator, Sequence

import jax
import ml_collections
import numpy as np

from vitcnn_jax import checkpoints
from vitcnn_jax import data
from vitcnn_jax import fileio
from vitcnn_jax import parallel
from vitcnn_jax import preprocess
from vitcnn_jax import representations
from vitcnn_jax import results
from vitcnn_jax.models import common


@dataclasses.dataclass
class Loaded:
  key: str  # config field: "model_x", or "models.NAME" for a mapping of models
  path: str  # the checkpoint read
  label: str
  model: Any
  params: Any
  names: list[str]
  policy: str

  @property
  def short(self) -> str:
    """A short name for files and arrays: "x" for model_x, NAME for models.NAME."""
    if self.key.startswith("models."):
      return self.key[len("models."):]
    return self.key[-1] if self.key.startswith("model_") else self.key

  @property
  def size(self) -> int:
    size = common.to_pair(self.model.image_size)
    if size[0] != size[1]:
      raise ValueError(f"config.{self.key}: non-square inputs {size} are not supported here.")
    return size[0]


def _reachable(path: str, key: str, hint: str) -> None:
  try:
    ok = fileio.exists(path)
    why = "no such file"
  except ImportError as e:
    ok, why = False, str(e)
  except Exception as e:  # network or credential errors of remote filesystems
    ok, why = False, f"{type(e).__name__}: {e}"
  if not ok:
    raise FileNotFoundError(
        f"config.{key}.checkpoint={path!r} is not reachable ({why}). Pass a local "
        f"copy with --config.{key}.checkpoint=/path/to/file.npz{hint}")


def trained_checkpoint(spec: ml_collections.ConfigDict, cache_dir: str) -> str:
  """Path of the model `spec.train` describes, training it first if not cached."""
  from vitcnn_jax import train  # pylint: disable=g-import-not-at-top  (optax only when training)
  cache_dir = os.path.expanduser(cache_dir)
  tag = results.fingerprint(spec.train.to_dict())
  path = os.path.join(cache_dir, f"{spec.train.name}-{tag}.npz")
  if not fileio.exists(path):
    train.train(spec.train, path, cache_dir)
  return path


def overrides(spec: ml_collections.ConfigDict) -> dict:
  """The `load_model` overrides a model spec sets (unset ones are None)."""
  return {k: v for k, v in dict(spec.get("overrides", {})).items() if v is not None}


def load_model(config: ml_collections.ConfigDict, key: str, hint: str = "") -> Loaded:
  """The model of config field `key` ("model_x", or "models.NAME")."""
  spec = config.models[key[len("models."):]] if key.startswith("models.") else config[key]
  path = spec.get("checkpoint")
  if not path and spec.get("train"):
    path = trained_checkpoint(spec, config.get("cache_dir") or "~/.cache/vitcnn_jax")
  if not path:
    raise ValueError(f"config.{key}.checkpoint is empty; pass --config.{key}.checkpoint=FILE.npz{hint}")
  _reachable(checkpoints.split_tower(path)[0], key, hint)
  model, params = checkpoints.load_model(path, **overrides(spec))
  patterns = list(spec.capture) if not isinstance(spec.capture, str) else [spec.capture]
  names = list(representations.point_shapes(model, params, patterns))
  if not names:
    raise ValueError(f"config.{key}.capture={patterns} matches no representation point of "
                     f"{path}; list them with configs/inspect.py.")
  policy = spec.get("policy") or preprocess.DEFAULT_POLICY[model.family]
  if policy not in preprocess.POLICIES:
    raise ValueError(f"config.{key}.policy={policy!r} is not one of {preprocess.POLICIES}.")
  return Loaded(key, path, spec.get("label") or model.family, model, params, names, policy)


SOURCES = ("tfds", "folder", "idx", "synthetic")


def make_source(cfg: ml_collections.ConfigDict, split: str | None = None) -> data.Source:
  """The configured source; `split` overrides cfg.split (e.g. train vs test)."""
  kind, split = cfg.get("source"), split or cfg.get("split")
  if kind == "tfds":
    return data.TfdsSource(cfg.name, split, cfg.get("data_dir") or None,
                           cfg.get("image_key", "image"), cfg.get("label_key", "label"))
  if kind == "folder":
    return data.FolderSource(cfg.path, cfg.get("labels", ""))
  if kind == "idx":
    return data.IdxSource(cfg.path, split)
  if kind == "synthetic":
    return data.SyntheticSource(cfg.num_examples, cfg.get("size", 32), cfg.get("seed", 0))
  raise ValueError(f"config.data.source={kind!r} is not one of {SOURCES}.")


def check_batching(num_examples: int, batch_size: int) -> None:
  if batch_size < 4:
    raise ValueError(f"config.batch_size={batch_size}: the unbiased HSIC needs minibatches of at least 4.")
  rest = num_examples % batch_size
  if 0 < rest < 4:
    raise ValueError(
        f"config.num_examples={num_examples} leaves a last minibatch of {rest} (< 4) with "
        f"batch_size={batch_size}; choose num_examples so that the remainder is 0 or >= 4.")


def num_steps(num_examples: int, batch_size: int) -> int:
  minibatches = -(-num_examples // batch_size)
  return -(-minibatches // jax.device_count())


@dataclasses.dataclass
class Step:
  images: list[jax.Array]  # one global (devices * batch, H, W, 3) uint8 array per model
  mask: jax.Array  # (devices * batch,) 1 for real examples
  examples: int  # real examples in this step, all hosts together
  labels: jax.Array | None = None  # (devices * batch,) int32 class labels (0 for padding)


def _local_step(source: data.Source, indices: np.ndarray, models: Sequence[Loaded],
                batch_size: int, step: int, labels: bool = False):
  """Rows of this process's devices for one step (padding rows masked out):
  (images per model, mask, examples in the step[, labels])."""
  ld, d = jax.local_device_count(), jax.device_count()
  first = step * d + jax.process_index() * ld
  images = [np.zeros((ld * batch_size, m.size, m.size, 3), np.uint8) for m in models]
  mask = np.zeros((ld * batch_size,), np.float32)
  ys = np.zeros((ld * batch_size,), np.int32)
  for j in range(ld):
    chunk = indices[(first + j) * batch_size:(first + j + 1) * batch_size]
    if not len(chunk):
      continue
    raw = source.images(chunk)
    for dst, m in zip(images, models):
      for r, img in enumerate(raw):
        dst[j * batch_size + r] = preprocess.preprocess_image(img, m.size, m.policy)
    mask[j * batch_size:j * batch_size + len(chunk)] = 1
    if labels:
      ys[j * batch_size:j * batch_size + len(chunk)] = source.labels(chunk)
  total = int(min(len(indices), (step + 1) * d * batch_size) - min(len(indices), step * d * batch_size))
  return (images, mask, total, ys) if labels else (images, mask, total)


def steps(mesh, source: data.Source, indices: np.ndarray, models: Sequence[Loaded],
          batch_size: int, start: int = 0, labels: bool = False) -> Iterator[Step]:
  """Global batches for steps start.., loading the next step while this one runs."""
  n = num_steps(len(indices), batch_size)
  load = lambda step: _local_step(source, indices, models, batch_size, step, labels)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    pending = pool.submit(load, start) if start < n else None
    for step in range(start, n):
      images, mask, total, *ys = pending.result()
      if step + 1 < n:
        pending = pool.submit(load, step + 1)
      yield Step([parallel.global_batch(mesh, x) for x in images],
                 parallel.global_batch(mesh, mask), total,
                 parallel.global_batch(mesh, ys[0]) if ys else None)
