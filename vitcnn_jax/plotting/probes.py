"""The linear-probe figures: accuracy against depth (paper Figs 13, F.1, F.2) and
per token on the token grid (Figs 11, D.4)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import style

FEATURE_LABELS = {"cls": "CLS token", "first": "first token", "spatial_mean": "mean except CLS",
                  "mean": "mean over tokens/positions", "final_grid": "pooled to last grid",
                  "each": "per token (spatial mean)"}


@axes.styled
def by_depth(models: dict, labels: dict[str, str], title: str, path: str, figures: style.Figures,
             band: bool = True) -> axes.Figure:
  """Probe accuracy against relative depth, a line per model and feature (Figs 13, F.1, F.2),
  with a band of +-1 sd over seeds (`band`; none for one seed)."""
  fig = axes.Figure(figsize=(6.6, 4.4), layout="constrained")
  ax = fig.subplots()
  for name, by_feature in models.items():
    for how, e in by_feature.items():
      depth = (np.arange(len(e["points"])) + 1) / len(e["points"])
      acc, std = 100 * np.asarray(e["accuracy"]), 100 * np.asarray(e["std_over_seeds"])
      line, = ax.plot(depth, acc, "o-", ms=3, label=f"{labels[name]}: {FEATURE_LABELS[how]}")
      if band:
        ax.fill_between(depth, acc - std, acc + std, color=line.get_color(), alpha=0.2, lw=0)
  ax.set_xlabel("relative depth (point / number of points)")
  ax.set_ylabel("test accuracy (%)")
  ax.set_ylim(0, 100)
  ax.grid(alpha=0.3)
  ax.set_title(title)
  ax.legend(title="model: feature" + (" (band: std over seeds)" if band else ""))
  return style.save_figure(fig, path, figures)


@axes.styled
def by_token(points: Sequence[tuple[str, np.ndarray, Sequence[int] | None]], prefix: int, title: str,
             path: str, figures: style.Figures, panels: int = 6) -> axes.Figure:
  """Per-token probe accuracy on the token grid for some points (Fig D.4), and the
  mean over spatial tokens (and the class token) at every point (Fig 11)."""
  chosen = sorted({round(i) for i in np.linspace(0, len(points) - 1, min(panels, len(points)))})
  fig = axes.Figure(figsize=(2.8 * (len(chosen) + 1), 3.6), layout="constrained")
  row = fig.subplots(1, len(chosen) + 1, squeeze=False,
                     gridspec_kw={"width_ratios": [1] * len(chosen) + [1.7]})[0]
  for ax, i in zip(row, chosen):
    name, acc, grid = points[i]
    spatial = 100 * acc[prefix:]
    im = ax.imshow(spatial.reshape(grid) if grid else spatial[None], cmap="viridis")
    ax.set_title(f"{name}\n{spatial.min():.1f}-{spatial.max():.1f}%")
    ax.axis("off")
    fig.colorbar(im, ax=ax, shrink=0.8, label="accuracy (%)")
  ax = row[-1]
  x = np.arange(len(points))
  ax.plot(x, [100 * a[prefix:].mean() for _, a, _ in points], "o-", ms=3, label="spatial tokens (mean)")
  if prefix:
    ax.plot(x, [100 * a[0] for _, a, _ in points], "s-", ms=3, label="CLS token")
  ax.set_xticks(x, [n for n, _, _ in points], rotation=90)
  ax.set_ylabel("test accuracy (%)")
  ax.set_title("Every point")
  ax.legend()
  ax.grid(alpha=0.3)
  fig.suptitle(title)
  return style.save_figure(fig, path, figures)
