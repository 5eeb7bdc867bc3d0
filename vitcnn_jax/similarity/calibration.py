"""A pair of models' score calibrated against the null of the same layer search.

Searching many layer pairs for the best match inflates a pair's score: wide or
deep models, and more pairs searched, give larger scores to representations that
share nothing (Gröger, Wen & Brbić 2026). The cure is a permutation null of the
whole search: one model's examples permuted (the same order for all its layers,
which breaks the correspondence of examples and nothing else), the map of every
layer pair recomputed, and the pair's statistic taken again, K times. Then

- `p_value`: (1 + #{null draws at least as similar as observed}) / (K + 1);
- `tau`: the ⌈(1 - alpha)(K + 1)⌉-th smallest of the observed and null
  statistics (of the negated ones for a distance): the level unrelated
  representations reach under this search with probability alpha;
- `score`: (observed - tau) / (best - tau), clipped to [0, 1]: 0 at or below the
  null's level, 1 at the measure's best value (1 for every similarity we have,
  0 for every distance).

The statistic of a pair's (rows, columns) map is one of `AGGREGATES`: our pair
score (`matching.score`, the depth-monotone alignment both ways), the best
cell, the mean cell, or the last layers' cell (the Platonic Representation
Hypothesis' protocol, where nothing is searched). The null draws themselves
come from `layer_search`.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from vitcnn_jax.similarity import matching

EPSILON = 1e-12  # the smallest best - tau divided by (a null at the measure's best)


def _best_cell(m: np.ndarray, distance: bool) -> float:
  return float(m.min() if distance else m.max())


def _mean_cell(m: np.ndarray, distance: bool) -> float:
  del distance
  return float(m.mean())


def _last_cell(m: np.ndarray, distance: bool) -> float:
  del distance
  return float(m[-1, -1])


# A pair's statistic of its (rows, columns) map, by name (`config.calibration.aggregate`),
# and what each says (the json's `score_definition`).
AGGREGATES: dict[str, Callable[[np.ndarray, bool], float]] = {
    "matched": matching.score, "best": _best_cell, "mean": _mean_cell, "last": _last_cell}
DEFINITIONS = {
    "matched": matching.SCORE_DEFINITION,
    "best": "the best cell of the map: the most similar pair of layers (smallest, for a distance)",
    "mean": "the mean cell of the map: every pair of layers alike",
    "last": "the cell of the two models' last layers (no layer search)",
}


class Calibrated(NamedTuple):
  """One pair's statistic, its null and what follows from them (module docstring)."""
  raw: float  # the statistic of the observed map
  score: float  # 0 at the null's (1 - alpha) level, 1 at the measure's best
  p_value: float
  tau: float  # the null's level, in the measure's own units
  null: np.ndarray  # (K,) the statistic of each permuted map

  def summary(self) -> dict:
    """The json's entry: every field but the draws, which `null_mean`/`null_std` sum up."""
    return {"raw": self.raw, "calibrated": self.score, "p_value": self.p_value, "tau": self.tau,
            "null_mean": float(self.null.mean()), "null_std": float(self.null.std()),
            "draws": int(len(self.null))}


def check_alpha(alpha: float, field: str = "alpha") -> None:
  """alpha is a level strictly between 0 and 1, or a ValueError naming `field`."""
  if not 0.0 < alpha < 1.0:
    raise ValueError(f"{field}={alpha!r} must be strictly between 0 and 1 (e.g. 0.05).")


def calibrate(observed: float, null: np.ndarray, distance: bool = False, alpha: float = 0.05
              ) -> Calibrated:
  """The calibrated score, p-value and level of `observed` against its `null`
  draws (a similarity: larger is more alike; a `distance`: smaller is)."""
  check_alpha(alpha)
  null = np.asarray(null, np.float64).reshape(-1)
  if not len(null):
    raise ValueError("calibrate: no null draws (at least 1; the p-value's resolution is 1 / (K + 1)).")
  if not np.isfinite(observed) or not np.all(np.isfinite(null)):
    raise FloatingPointError(f"calibrate: the observed statistic ({observed}) or "
                             f"{int(np.sum(~np.isfinite(null)))} of {len(null)} null draws are not finite.")
  sign = -1.0 if distance else 1.0  # a distance is calibrated as the similarity -d, best 0
  obs, draws, best = sign * float(observed), sign * null, 0.0 if distance else 1.0
  k = len(draws)
  index = min(max(math.ceil((1.0 - alpha) * (k + 1)) - 1, 0), k)
  tau = float(np.sort(np.r_[obs, draws])[index])
  p = (1.0 + float(np.sum(draws >= obs))) / (k + 1)
  score = float(np.clip((obs - tau) / max(best - tau, EPSILON), 0.0, 1.0))
  return Calibrated(float(observed), score, p, sign * tau, null)
