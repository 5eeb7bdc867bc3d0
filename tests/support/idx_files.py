"""MNIST-format IDX files written here, and a small task a model can learn from them."""

from __future__ import annotations

import gzip
import os

import numpy as np


def write_idx(directory, split: str, images: np.ndarray, labels: np.ndarray, gz: bool = True):
  """MNIST IDX format: magic 0x0000 08 ndim, big-endian dims, then uint8 data."""
  os.makedirs(directory, exist_ok=True)
  for kind, arr, code in (("images", images, 3), ("labels", labels, 1)):
    head = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    blob = head + arr.astype(np.uint8).tobytes()
    path = os.path.join(directory, f"{split}-{kind}-idx{code}-ubyte")
    if gz:
      with gzip.open(path + ".gz", "wb") as f:
        f.write(blob)
    else:
      with open(path, "wb") as f:
        f.write(blob)


def striped(n: int, seed: int = 0, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
  """A learnable toy task: class k has a bright horizontal band at rows 2k..2k+2."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 10, n)
  images = rng.integers(0, 60, (n, size, size)).astype(np.uint8)
  for i, k in enumerate(labels):
    images[i, 2 * k + 3:2 * k + 6] = 230
  return images, labels
