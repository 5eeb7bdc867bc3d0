"""Image sources (uint8 images and labels by index) and sampling without replacement.

A source is random-access: `len(source)`, `source.images(indices)` (a list of
HxW or HxWxC uint8 arrays, sizes may differ) and `source.labels(indices)`.
Sampling and host sharding work on indices, so each host reads only the
examples its devices process.

Here: the protocol, sources in memory (`ArraySource`, `SyntheticSource`), a
class subset of any source, and the sampling. Sources read from files: image
folders and photographs (`folders`), tfds and MNIST-format IDX files (`datasets`).
"""

from __future__ import annotations

import hashlib
from typing import Protocol, Sequence

import numpy as np

class Source(Protocol):
  name: str
  num_classes: int
  identity: str  # changes whenever the examples may have: resumed states check it

  def __len__(self) -> int: ...

  def images(self, indices: Sequence[int]) -> list[np.ndarray]: ...

  def labels(self, indices: Sequence[int]) -> np.ndarray: ...


LABELS_ARE = "classes"  # a source's labels, unless it says otherwise (`labels_are`)


def labels_are(source: Source) -> str:
  """What `source`'s labels say: "classes", or e.g. "photographs" (PhotoCrops of a
  flat folder: one label per photograph, which a probe tells apart trivially)."""
  return getattr(source, "labels_are", LABELS_ARE)


class SyntheticSource:
  """Deterministic random images (each a function of its index): tests, benchmarks."""

  num_classes = 10

  def __init__(self, num_examples: int, size: int = 32, seed: int = 0):
    if num_examples < 1 or size < 4:
      raise ValueError(f"num_examples={num_examples}, size={size}: a synthetic source needs "
                       "at least 1 example of at least 4x4 pixels.")
    self.name = f"synthetic({num_examples}, {size}px)"
    self.identity = f"{self.name} seed {seed}"
    self.n, self.size, self.seed = num_examples, size, seed

  def __len__(self) -> int:
    return self.n

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    out = []
    for i in indices:
      if not 0 <= i < self.n:
        raise IndexError(f"{self.name}: index {i} out of range.")
      rng = np.random.default_rng((self.seed, int(i)))
      # Smooth blobs plus noise: enough structure for layers to differ.
      base = rng.integers(0, 256, (4, 4, 3)).astype(np.float32)
      img = np.kron(base, np.ones((self.size // 4 + 1, self.size // 4 + 1, 1)))[:self.size, :self.size]
      img = img + rng.normal(0, 20, img.shape)
      out.append(np.clip(img, 0, 255).astype(np.uint8))
    return out

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    return np.asarray(indices) % self.num_classes


class ArraySource:
  """Images already in memory, e.g. a notebook's uint8 array: (N, H, W, 3), or
  (N, H, W) / (N, H, W, 1) grey, which is repeated to RGB like the other sources."""

  def __init__(self, images: np.ndarray, labels: Sequence[int] | None = None):
    images = np.asarray(images)
    if images.dtype != np.uint8:
      raise TypeError(f"images have dtype {images.dtype}; pass uint8 pixels in 0..255 (the "
                      "models' preprocessing scales them).")
    if images.ndim == 3:
      images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3) or len(images) == 0:
      raise ValueError(f"images have shape {images.shape}; pass (N, H, W, 3) or (N, H, W) "
                       "with N >= 1.")
    if labels is not None:
      labels = np.asarray(labels)
      if labels.shape != (len(images),) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels have shape {labels.shape} and dtype {labels.dtype}; pass "
                         f"{len(images)} integer class labels.")
    self._images = images if images.shape[-1] == 3 else np.repeat(images, 3, axis=-1)
    self._labels = labels
    self.num_classes = int(labels.max()) + 1 if labels is not None else 1
    digest = hashlib.sha256(self._images.tobytes())
    if labels is not None:
      digest.update(labels.astype(np.int64).tobytes())
    self.name = f"array({len(images)}, {images.shape[1]}x{images.shape[2]})"
    self.identity = f"{self.name} {digest.hexdigest()[:16]}"

  def __len__(self) -> int:
    return len(self._images)

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    return [self._images[i] for i in indices]

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    if self._labels is None:
      raise KeyError(f"{self.name}: no labels were given with the images.")
    return self._labels[np.asarray(indices, np.int64)]


class ClassSubset:
  """The examples of some classes of a source, relabelled 0..k-1 in the order given
  (a transfer task: pre-train on some classes, fine-tune on the others). Every
  label is read once, when it is made."""

  def __init__(self, source: Source, classes: Sequence[int]):
    classes = [int(c) for c in classes]
    if len(set(classes)) != len(classes) or not all(0 <= c < source.num_classes for c in classes):
      raise ValueError(f"{source.name}: classes={classes} must be distinct labels in "
                       f"0..{source.num_classes - 1}.")
    labels = np.concatenate([source.labels(np.arange(i, min(i + 4096, len(source))))
                             for i in range(0, len(source), 4096)])
    self.rows = np.flatnonzero(np.isin(labels, classes))
    relabel = np.zeros(source.num_classes, np.int64)
    relabel[classes] = np.arange(len(classes))
    self.y = relabel[labels[self.rows]]
    self.source, self.num_classes = source, len(classes)
    self.name = f"{source.name} classes {classes}"
    self.identity = f"{source.identity} classes {classes}"

  def __len__(self) -> int:
    return len(self.rows)

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    return self.source.images(self.rows[np.asarray(indices, int)])

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    return self.y[np.asarray(indices, int)]


def sample(num_available: int, num_examples: int, seed: int, repeat: int) -> np.ndarray:
  """`num_examples` distinct indices; a different draw for every repeat."""
  if num_examples > num_available:
    raise ValueError(f"Asked for {num_examples} examples without replacement but the "
                     f"source has {num_available}; lower num_examples.")
  return np.random.default_rng((seed, repeat)).permutation(num_available)[:num_examples]
