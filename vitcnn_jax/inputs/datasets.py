"""Datasets in their own formats: a tfds split (`tfds.data_source`, array_record,
no TensorFlow) and MNIST-format IDX files (Debian's dataset-fashion-mnist)."""

from __future__ import annotations

import gzip
import hashlib
import os
from typing import Sequence

import numpy as np

from vitcnn_jax import fileio

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


class TfdsSource:
  """A tfds dataset split via `tfds.data_source` (array_record; no TensorFlow)."""

  def __init__(self, name: str, split: str, data_dir: str | None = None,
               image_key: str = "image", label_key: str = "label"):
    import tensorflow_datasets as tfds
    self.name = f"tfds:{name}[{split}]"
    prepare = (f"Prepare it once as array_record: `pip install tensorflow-cpu` (needed by "
               f"`tfds build` only), then `tfds build {name} --file_format=array_record "
               f"--data_dir=DIR` (ImageNet needs the manual download in DIR/downloads/manual), "
               f"and pass --config.data.data_dir=DIR. ImageNet's validation JPEGs also work "
               f"directly: --config.data.source=folder (see docs/running.md).")
    try:
      builder = tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # tfds raises several types for unknown names
      raise FileNotFoundError(f"{self.name}: unknown to tfds ({type(e).__name__}: {e}).") from e
    # Checked first: data_source() on an unprepared dataset starts downloading it.
    if not builder.is_prepared():
      raise FileNotFoundError(f"{self.name}: not prepared under data_dir={data_dir!r} "
                              f"(looked in {builder.data_path}). {prepare}")
    if split not in builder.info.splits:
      raise KeyError(f"{self.name}: no split {split!r}; it has {sorted(builder.info.splits)}. "
                     "Set --config.data.split.")
    try:
      self.ds = builder.as_data_source(split=split)
    except Exception as e:  # e.g. prepared in another file format
      raise FileNotFoundError(f"{self.name}: cannot open it as a data source under "
                              f"{builder.data_path} ({type(e).__name__}: {e}). {prepare}") from e
    self.image_key, self.label_key = image_key, label_key
    features = self.ds.dataset_info.features
    if image_key not in features:
      raise KeyError(f"{self.name}: no feature {image_key!r}; it has {sorted(features)}. "
                     "Set --config.data.image_key.")
    label = features[label_key] if label_key in features else None
    self.num_classes = getattr(label, "num_classes", 0) or 0
    self.identity = (f"{self.name} version {builder.info.version} in {builder.data_path}, "
                     f"{len(self.ds)} examples, keys {image_key}/{label_key}")

  def __len__(self) -> int:
    return len(self.ds)

  def _records(self, indices: Sequence[int]) -> list[dict]:
    return [self.ds[int(i)] for i in indices]

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    return [np.asarray(r[self.image_key]) for r in self._records(indices)]

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    if not self.num_classes:
      raise KeyError(f"{self.name}: no class label feature {self.label_key!r}.")
    return np.asarray([r[self.label_key] for r in self._records(indices)])


def read_idx(path: str) -> np.ndarray:
  """An MNIST-format IDX file (optionally gzipped) as a uint8 array."""
  raw = fileio.read_bytes(path)
  if raw[:2] == b"\x1f\x8b":
    try:
      raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:
      raise ValueError(f"{path}: corrupt gzip data ({e}).") from e
  if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] != 0x08:
    raise ValueError(f"{path}: not a uint8 IDX file (magic {raw[:4]!r}).")
  ndim = raw[3]
  dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
  if data.size != int(np.prod(dims)):
    raise ValueError(f"{path}: header says {dims} ({int(np.prod(dims))} bytes) but holds "
                     f"{data.size}; the file is truncated.")
  return data.reshape(dims)


class IdxSource:
  """MNIST-format files `{split}-images-idx3-ubyte[.gz]` / `-labels-idx1-...`."""

  def __init__(self, directory: str, split: str):
    self.name = f"idx:{directory}[{split}]"
    paths = {}
    for kind, idx in (("images", 3), ("labels", 1)):
      base = os.path.join(directory, f"{split}-{kind}-idx{idx}-ubyte")
      found = [p for p in (base, base + ".gz") if fileio.exists(p)]
      if not found:
        hint = (" Install it with `apt-get install dataset-fashion-mnist`."
                if os.path.abspath(directory) == FASHION_MNIST_DIR else "")
        raise FileNotFoundError(f"{base}[.gz] not found (split {split!r}; MNIST-format "
                                f"splits are 'train' and 't10k').{hint}")
      paths[kind] = found[0]
    self.x = read_idx(paths["images"])
    self.y = read_idx(paths["labels"]).astype(np.int64)
    if self.x.ndim != 3 or len(self.x) != len(self.y):
      raise ValueError(f"{paths['images']}: images {self.x.shape} do not match labels "
                       f"{self.y.shape} in {paths['labels']}.")
    self.num_classes = int(self.y.max()) + 1
    digest = hashlib.sha256(self.x.tobytes() + self.y.tobytes()).hexdigest()[:16]
    self.identity = f"{self.name} (contents {digest})"

  def __len__(self) -> int:
    return len(self.x)

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    return [self.x[int(i)] for i in indices]

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    return self.y[np.asarray(indices, int)]
