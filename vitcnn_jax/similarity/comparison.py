"""What every measure's (L, L) maps share once summed: which layer of one model
matches which of another (`matching`) with an interval over the repeats, the
comparison with the null, and bootstrap intervals per cell. `pairs` are the
blocks of the all-layers map: (tag, model a, model b, rows, cols), each model
with its layers' `names`."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vitcnn_jax.similarity import matching
from vitcnn_jax.similarity import measures


def prefix(measure: str) -> str:
  """The name a measure's arrays start with: `cka` for linear CKA (as before any other)."""
  return "cka" if measure == "linear_cka" else measure


def t_half_width(x: np.ndarray) -> np.ndarray:
  """Half the 95% t interval of the mean over the first axis (repeats)."""
  import scipy.special  # the t quantile alone: scipy.stats took 1.2 to 1.8 s of every job's start
  r = len(x)
  return scipy.special.stdtrit(r - 1, 0.975) * x.std(axis=0, ddof=1) / np.sqrt(r)


def layer_matching(arrays: dict, measure: str, reps: np.ndarray, pairs) -> dict:
  """For each pair of different models: each layer's best match in the other model
  and the depth-monotone alignment (`best_P_A_B`, `monotone_P_A_B`: a column per
  row layer), and the pair's score (`matching.score`) with a 95% t interval over
  the repeats' scores (replaced by the bootstrap's where there is one)."""
  distance, p = measures.REGISTRY[measure].distance, prefix(measure)
  out = {"score_definition": matching.SCORE_DEFINITION, "score": {}, "monotone": {}}
  for t, a, b, rows, cols in pairs:
    if a is b:
      continue
    mean = reps.mean(axis=0)[rows, cols]
    arrays[f"best_{p}_{t}"] = matching.best(mean, distance)
    arrays[f"monotone_{p}_{t}"] = path = matching.monotone(mean, distance)
    out["monotone"][t] = {row: b.names[j] for row, j in zip(a.names, path)}
    each = np.asarray([matching.score(r[rows, cols], distance) for r in reps])
    entry = {"value": matching.score(mean, distance), "interval": None}
    if len(each) > 1:
      half = float(t_half_width(each))
      entry.update(interval=[float(each.mean()) - half, float(each.mean()) + half],
                   interval_method="95% t interval of the repeats' scores")
    out["score"][t] = entry
  return out


def against_null(arrays: dict, p: str, reps: np.ndarray, null: np.ndarray, pairs) -> dict:
  """The null's mean and spread per cell (arrays), and the cells whose difference
  from it over repeats is within a 95% t interval of zero (`P_like_null_A_B`)."""
  diff = reps - null
  r = len(reps)
  out = {"mean": {}, "like_null": {}, "cells": {}}
  for t, _, _, rows, cols in pairs:
    arrays[f"null_{p}_{t}"] = null.mean(axis=0)[rows, cols]
    arrays[f"null_{p}_std_{t}"] = null.std(axis=0)[rows, cols]
    out["mean"][t] = float(arrays[f"null_{p}_{t}"].mean())
    out["cells"][t] = int(arrays[f"null_{p}_{t}"].size)
    if r > 1:
      d = diff[:, rows, cols]
      arrays[f"{p}_like_null_{t}"] = np.abs(d.mean(axis=0)) <= t_half_width(d)
      out["like_null"][t] = int(arrays[f"{p}_like_null_{t}"].sum())
  if r == 1:
    out["like_null"] = None  # one repeat: no spread to judge the difference by
  else:
    out["like_null_method"] = "t: 0 within the 95% t interval of the repeats' measure minus null"
  return out


def bootstrap_intervals(arrays: dict, summaries: dict, reps: list[dict], nulls: list[dict] | None,
                        names: Sequence[str], pairs) -> None:
  """95% percentile intervals per cell (`P_ci_low_A_B`, `P_ci_high_A_B`) from the
  bootstrap replicates' values, the matching score's interval, and (with a null)
  the cells whose replicates of measure minus null keep 0 inside theirs
  (`P_like_null_A_B`); `summaries[m]` is measure m's summary, updated."""
  for m in names:
    p, values = prefix(m), np.asarray([r[m] for r in reps])
    low, high = np.percentile(values, [2.5, 97.5], axis=0)
    for t, a, b, rows, cols in pairs:
      arrays[f"{p}_ci_low_{t}"], arrays[f"{p}_ci_high_{t}"] = low[rows, cols], high[rows, cols]
      if a is not b:
        each = [matching.score(v[rows, cols], measures.REGISTRY[m].distance) for v in values]
        summaries[m]["matching"]["score"][t].update(
            interval=[float(v) for v in np.percentile(each, [2.5, 97.5])],
            interval_method="95% percentile interval of the bootstrap replicates' scores")
    if nulls is not None and m in nulls[0]:
      diff = values - np.asarray([r[m] for r in nulls])
      d_low, d_high = np.percentile(diff, [2.5, 97.5], axis=0)
      like = (d_low <= 0) & (d_high >= 0)
      null = summaries[m]["null"]
      null["like_null_method"] = "bootstrap: 0 within the 95% interval of measure minus null"
      null["like_null"] = {}
      for t, _, _, rows, cols in pairs:
        arrays[f"{p}_like_null_{t}"] = like[rows, cols]
        null["like_null"][t] = int(like[rows, cols].sum())
