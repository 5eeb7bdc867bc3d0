"""Image sources (uint8 images by index) and sampling without replacement.

A source is random-access: `len(source)` and `source.images(indices)` (a list
of HxWxC uint8 arrays, sizes may differ). Sampling and host sharding work on
indices, so each host reads only the examples its devices process.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class Source(Protocol):
  name: str

  def __len__(self) -> int: ...

  def images(self, indices: Sequence[int]) -> list[np.ndarray]: ...


class SyntheticSource:
  """Deterministic random images (each a function of its index): tests, benchmarks."""

  def __init__(self, num_examples: int, size: int = 32, seed: int = 0):
    self.name = f"synthetic({num_examples}, {size}px)"
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


class TfdsSource:
  """A tfds dataset split via `tfds.data_source` (array_record; no TensorFlow)."""

  def __init__(self, name: str, split: str, data_dir: str | None = None,
               image_key: str = "image"):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    self.name = f"tfds:{name}[{split}]"
    try:
      self.ds = tfds.data_source(name, split=split, data_dir=data_dir)
    except Exception as e:  # tfds raises several types for "not prepared"
      raise FileNotFoundError(
          f"{self.name}: cannot open it under data_dir={data_dir!r} ({type(e).__name__}: {e}). "
          f"Prepare it once as array_record, e.g. `tfds build {name} "
          f"--file_format=array_record --data_dir=DIR` (ImageNet needs the manual "
          "download in DIR/downloads/manual), then pass --config.data.data_dir=DIR.") from e
    self.image_key = image_key

  def __len__(self) -> int:
    return len(self.ds)

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    records = self.ds.__getitems__(list(indices))
    return [np.asarray(r[self.image_key]) for r in records]


def sample(num_available: int, num_examples: int, seed: int, repeat: int) -> np.ndarray:
  """`num_examples` distinct indices; a different draw for every repeat."""
  if num_examples > num_available:
    raise ValueError(f"Asked for {num_examples} examples without replacement but the "
                     f"source has {num_available}; lower num_examples.")
  return np.random.default_rng((seed, repeat)).permutation(num_available)[:num_examples]
