"""Which layer of one model corresponds to which of another, and one number per pair.

From a (rows, columns) map of any measure between the layers of models A and B
(larger is more similar, or `distance`: smaller is):

- `best`: each row's best column (the argmax of its row; Kornblith et al. 2019's
  and the paper's "most similar layer").
- `monotone`: the best alignment that keeps depth order, each row matched to a
  column no earlier than the previous row's, found by dynamic programming over
  the whole map (the sum of the matched cells is the largest, or smallest, any
  such alignment has): `best` can jump back and forth where rows are alike.
- `score`: one number for the pair of models, the mean matched cell of the
  monotone alignments both ways (each row of A to B, each column of B to A),
  averaged; for identical models on the diagonal it is the self-similarity.
"""

from __future__ import annotations

import numpy as np

SCORE_DEFINITION = ("mean of the measure over the cells of the best depth-monotone alignment of "
                    "each layer of A to a layer of B, and of each layer of B to a layer of A, "
                    "averaged (dynamic programming over the mean map)")


def best(m: np.ndarray, distance: bool = False) -> np.ndarray:
  """(rows,) each row's best column."""
  return (np.argmin if distance else np.argmax)(m, axis=1)


def monotone(m: np.ndarray, distance: bool = False) -> np.ndarray:
  """(rows,) non-decreasing columns whose cells have the largest sum (smallest,
  for a distance) of any non-decreasing choice."""
  v = -m if distance else m
  ends = [v[0]]  # ends[i][j]: the best sum of rows 0..i with row i at column j
  for row in v[1:]:
    ends.append(row + np.maximum.accumulate(ends[-1]))
  out = np.empty(len(v), dtype=int)
  limit = v.shape[1]
  for i in range(len(v) - 1, -1, -1):  # each row the best end at or before the next row's column
    out[i] = int(np.argmax(ends[i][:limit]))
    limit = out[i] + 1
  return out


def score(m: np.ndarray, distance: bool = False) -> float:
  """`SCORE_DEFINITION` of one (rows, columns) map."""
  rows = m[np.arange(m.shape[0]), monotone(m, distance)].mean()
  cols = m.T[np.arange(m.shape[1]), monotone(m.T, distance)].mean()
  return float((rows + cols) / 2)
