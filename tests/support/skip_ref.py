"""Skip ratios in float64 from a forward's captured points."""

from __future__ import annotations

import numpy as np


def sublayer_ratios(out: dict, block: int, into: str, branch: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(the sublayer's input, its branch's output, each token's mean over examples of
  ||input|| / ||branch||) of block `block`, in float64."""
  z = np.asarray(out[f"block{block:02d}/{into}"], np.float64)
  f = np.asarray(out[f"block{block:02d}/{branch}"], np.float64)
  return z, f, (np.linalg.norm(z, axis=-1) / np.linalg.norm(f, axis=-1)).mean(0)
