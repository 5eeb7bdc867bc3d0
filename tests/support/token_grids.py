"""Pixel distances between the patches of a token grid, in float64."""

from __future__ import annotations

import numpy as np


def grid_distances(grid: tuple[int, int], patch: int) -> np.ndarray:
  """(N, N) float64 pixel distances between the patches of a row-major grid."""
  at = np.indices(grid).reshape(2, -1).T * patch
  return np.sqrt(((at[:, None] - at[None]) ** 2).sum(-1))
