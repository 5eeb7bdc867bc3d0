"""Float64 NumPy minibatch CKA, written from the formulas (Song et al. 2012)."""

from __future__ import annotations

import numpy as np


def np_hsic1(x: np.ndarray, y: np.ndarray) -> float:
  """HSIC1 = [tr(K~L~) + 1'K~1 1'L~1/((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3)).

  Features are centred first (HSIC1 is exactly invariant to it): this formula
  cancels terms of size |K|^2 n^2, which costs a float64 reference ~1e-6 of CKA
  on features offset by 100.
  """
  x = x.reshape(len(x), -1).astype(np.float64)
  y = y.reshape(len(y), -1).astype(np.float64)
  x, y = x - x.mean(0), y - y.mean(0)
  n = len(x)
  k, l = x @ x.T, y @ y.T
  np.fill_diagonal(k, 0)
  np.fill_diagonal(l, 0)
  one = np.ones(n)
  return float((np.trace(k @ l) + (one @ k @ one) * (one @ l @ one) / ((n - 1) * (n - 2))
                - 2 / (n - 2) * (one @ k @ l @ one)) / (n * (n - 3)))


def np_minibatch_cka(xs: list[np.ndarray], ys: list[np.ndarray]) -> float:
  xy = sum(np_hsic1(x, y) for x, y in zip(xs, ys))
  xx = sum(np_hsic1(x, x) for x in xs)
  yy = sum(np_hsic1(y, y) for y in ys)
  return xy / np.sqrt(xx * yy)
