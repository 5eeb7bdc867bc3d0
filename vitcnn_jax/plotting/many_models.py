"""Many models at once: per measure, the model x model matrix of pair scores and
of calibrated scores, the models ordered by clustering with the dendrogram beside."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import style


SCORES = {"matched": "depth-monotone layer matching", "best": "best pair of layers",
          "mean": "mean over layer pairs", "last": "last layers"}


def average_linkage(apart: np.ndarray) -> list[tuple[int, int, float]]:
  """The merges (cluster, cluster, height) of average-linkage clustering of a
  symmetric distance matrix, clusters numbered as scipy numbers them (the models
  0..n-1, then each merge n, n+1, ...; the smaller number first): a dozen
  lines where scipy's import would be a second of every job's start."""
  n = len(apart)
  d = np.array(apart, np.float64)
  np.fill_diagonal(d, np.inf)
  ids, sizes, merges = list(range(n)), [1] * n, []
  alive = np.ones(n, bool)
  for new in range(n, 2 * n - 1):
    masked = np.where(np.outer(alive, alive), d, np.inf)
    i, j = sorted(np.unravel_index(int(np.argmin(masked)), masked.shape))
    merges.append((min(ids[i], ids[j]), max(ids[i], ids[j]), float(masked[i, j])))
    d[i] = d[:, i] = (sizes[i] * d[i] + sizes[j] * d[j]) / (sizes[i] + sizes[j])  # the mean over members
    d[i, i] = np.inf
    alive[j], ids[i], sizes[i] = False, new, sizes[i] + sizes[j]
  return merges


def order(similar: np.ndarray) -> tuple[list[int], list[tuple[list[float], list[float]]] | None]:
  """The models' order by average-linkage clustering of 1 - `similar` (a
  similarity in [0, 1]) and the dendrogram's links as (heights, rows) lines,
  model k of the order at row k (None for fewer than three models)."""
  n = len(similar)
  if n < 3:
    return list(range(n)), None
  apart = np.clip(1.0 - (similar + similar.T) / 2, 0.0, None)
  merges = average_linkage(apart)
  children = {n + k: (a, b) for k, (a, b, _) in enumerate(merges)}
  leaves, stack = [], [2 * n - 2]
  while stack:  # depth first, the smaller-numbered cluster first (above)
    c = stack.pop()
    if c < n:
      leaves.append(c)
    else:
      stack.extend(reversed(children[c]))
  row = {leaf: float(k) for k, leaf in enumerate(leaves)}
  height = dict.fromkeys(range(n), 0.0)
  links = []
  for k, (a, b, h) in enumerate(merges):
    links.append(([height[a], h, h, height[b]], [row[a], row[a], row[b], row[b]]))
    row[n + k], height[n + k] = (row[a] + row[b]) / 2, h
  return leaves, links


def _heat(ax, values: np.ndarray, labels: Sequence[str], title: str, cmap: str, vmin: float, vmax: float,
          fig, lo: np.ndarray | None = None, hi: np.ndarray | None = None, show_y: bool = True) -> None:
  n = len(labels)
  # aspect "auto": the cells fill the panel, so each row lines up with its dendrogram leaf
  im = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest", aspect="auto")
  fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
  ax.set_xticks(range(n), labels, rotation=90)
  ax.set_yticks(range(n), labels if show_y else [""] * n)
  ax.set_title(title)
  if n <= 12:  # the values themselves, with their interval where one was taken
    for i in range(n):
      for j in range(n):
        text = f"{values[i, j]:.2f}"
        if lo is not None and i != j and hi[i, j] > lo[i, j]:
          text += f"\n±{(hi[i, j] - lo[i, j]) / 2:.2f}"
        r, g, b, _ = im.cmap(im.norm(values[i, j]))
        ax.text(j, i, text, ha="center", va="center", fontsize=8,
                color="white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black")


@axes.styled
def matrix(names: Sequence[str], arrays: dict[str, np.ndarray], prefix: str, label: str, distance: bool,
           subtitle: str, path: str, figures: style.Figures) -> axes.Figure:
  """One measure's pair scores (and calibrated scores, where drawn) between every
  pair of models, ordered by clustering the calibrated (else raw) scores."""
  raw, cal = arrays[f"{prefix}_scores"], arrays.get(f"{prefix}_calibrated")
  n = len(names)
  if distance:  # a distance: clustered by its own scale, larger apart
    similar = 1.0 - raw / max(float(raw.max()), 1e-12)
  else:
    similar = raw
  idx, tree = order(cal if cal is not None else similar)
  apart = "1 − calibrated score" if cal is not None else "distance / its largest" if distance else "1 − score"
  labels = [names[i] for i in idx]
  side = max(3.6, 0.32 * n + 1.6)
  panels = 1 + (cal is not None)
  fig = axes.Figure(figsize=(1.4 * (tree is not None) + side * panels + 0.8 * panels, side + 0.9),
                    layout="constrained")
  widths = ([0.35] if tree is not None else []) + [1.0] * panels
  row = fig.subplots(1, len(widths), gridspec_kw={"width_ratios": widths}, squeeze=False)[0]
  if tree is not None:
    for heights, rows in tree:
      row[0].plot(heights, rows, color="0.3", lw=1)
    row[0].set_ylim(n - 0.5, -0.5)
    row[0].invert_xaxis()
    row[0].set_xlabel(f"{apart}\n(average linkage)")
    row[0].set_yticks([])
    for spine in ("top", "right", "left"):
      row[0].spines[spine].set_visible(False)
  take = np.ix_(idx, idx)
  lo, hi = arrays[f"{prefix}_scores_low"][take], arrays[f"{prefix}_scores_high"][take]
  top = max(float(raw.max()), 1e-12) if distance else 1.0
  _heat(row[-panels], raw[take], labels, f"{label}: pair score", "magma_r" if distance else "magma", 0.0, top,
        fig, lo, hi)
  if cal is not None:
    _heat(row[-1], cal[take], labels, f"{label}: calibrated (0: null level, 1: best)", "viridis", 0.0, 1.0,
          fig, show_y=False)
  fig.suptitle(f"{label} between {n} models\n{subtitle}")
  return style.save_figure(fig, path, figures)


def matrices(names: Sequence[str], arrays: dict, summary: dict, workdir: str, figures: style.Figures,
             shown: Sequence[tuple[str, str, bool]]) -> list:
  """`matrix` of each measure (prefix, label, distance) in `shown`, as models_PREFIX.png."""
  drawn = f"; calibrated against {summary['draws']} draws, alpha {summary['alpha']}" if summary["draws"] else ""
  subtitle = (f"{summary['num_examples']:,} examples, {summary['repeats']} repeat"
              f"{'s' if summary['repeats'] != 1 else ''}; pair score: {SCORES[summary['score_name']]}{drawn}")
  return [matrix(names, arrays, p, label, distance, subtitle, os.path.join(workdir, f"models_{p}.png"), figures)
          for p, label, distance in shown]
