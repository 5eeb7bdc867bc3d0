"""The attention figures: each head's mean attention distance by block (paper
Figs 3, 4, C.5, C.6), several models against depth, and head subsets against a
ResNet's layers (Fig 5)."""

from __future__ import annotations

from typing import Sequence

from matplotlib import ticker
import numpy as np

from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import style


@axes.styled
def distances(mean: Sequence[np.ndarray], blocks: Sequence[int], plot_blocks: Sequence[int] | None,
              label: str, ceiling: np.ndarray, path: str, figures: style.Figures) -> axes.Figure:
  """Left: heads sorted by distance for chosen blocks (Fig 3); right: every block.
  `mean`: each block's head distances (stages may differ in heads); `ceiling`:
  each block's uniform-attention distance (a Swin's grows stage by stage)."""
  chosen = list(plot_blocks) if plot_blocks else sorted({blocks[0], blocks[min(1, len(blocks) - 1)],
                                                         blocks[-2] if len(blocks) > 1 else blocks[0],
                                                         blocks[-1]})
  missing = [b for b in chosen if b not in blocks]
  if missing:
    raise ValueError(f"plot_blocks {missing} are not among the captured blocks {list(blocks)}.")
  fig = axes.Figure(figsize=(10, 3.8), layout="constrained")
  ax1, ax2 = fig.subplots(1, 2)
  one_ceiling = np.ptp(ceiling) < 1e-6 * max(float(ceiling.max()), 1.0)
  for c, b in enumerate(chosen):
    row = mean[list(blocks).index(b)]
    ax1.plot(np.arange(1, len(row) + 1), np.sort(row), "o-", ms=4, color=f"C{c}", label=f"block {b}")
    if not one_ceiling:
      ax1.axhline(ceiling[list(blocks).index(b)], color=f"C{c}", ls="--", lw=0.9)
  ax1.set_xlabel("head, sorted by distance")
  ax1.set_title("Sorted heads of some blocks" + ("" if one_ceiling else "\n(dashed: each block's "
                                                  "uniform attention)"))
  for i, b in enumerate(blocks):
    ax2.scatter(np.full(len(mean[i]), b), mean[i], s=14, c="C0", label="one head" if i == 0 else None)
  ax2.set_xlabel("block")
  ax2.set_title("Every head of every block")
  if one_ceiling:
    ax1.axhline(ceiling[0], color="grey", ls="--", lw=0.9, label="uniform attention")
    ax2.axhline(ceiling[0], color="grey", ls="--", lw=0.9, label="uniform attention")
  else:
    ax2.hlines(ceiling, np.asarray(blocks) - 0.4, np.asarray(blocks) + 0.4, color="grey", lw=1.2,
               label="uniform attention (each block's)")
  top = max(float(ceiling.max()), max(float(r.max()) for r in mean)) * 1.08
  for ax in (ax1, ax2):
    ax.set_ylim(0, top)
    ax.set_ylabel("mean attention distance (px)")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.legend(loc="lower right" if one_ceiling else "upper left", fontsize="small")
  fig.suptitle(f"Mean attention distance: {label}")
  return style.save_figure(fig, path, figures)


@axes.styled
def distances_compared(models: Sequence[tuple[Sequence[np.ndarray], Sequence[int], str, np.ndarray]],
                       path: str, figures: style.Figures) -> axes.Figure:
  """Several models' mean distances against relative depth: per model, the mean
  over heads with the band from its nearest to its farthest head, as a fraction
  of each block's uniform-attention distance (grids, patches and windows differ)."""
  fig = axes.Figure(figsize=(6.4, 4.2), layout="constrained")
  ax = fig.subplots()
  for i, (mean, blocks, label, ceiling) in enumerate(models):
    depth = np.asarray(blocks, np.float64) / max(max(blocks), 1)
    rel = [np.asarray(r) / c for r, c in zip(mean, ceiling)]
    ax.fill_between(depth, [r.min() for r in rel], [r.max() for r in rel], color=f"C{i}", alpha=0.18,
                    lw=0)
    ax.plot(depth, [r.mean() for r in rel], "o-", ms=4, color=f"C{i}", label=label)
  ax.axhline(1.0, color="grey", ls="--", lw=0.9, label="uniform attention")
  ax.set_xlabel("relative depth (block / last block)")
  ax.set_ylabel("attention distance / uniform distance")
  ax.set_ylim(0, None)
  ax.legend(loc="best", fontsize="small")
  ax.set_title("Mean attention distance by model\n(line: mean over heads; band: nearest to "
               "farthest head)")
  return style.save_figure(fig, path, figures)


@axes.styled
def head_subsets(distance: np.ndarray, cka: np.ndarray, layers: Sequence[str], vit_label: str,
                 res_label: str, path: str, figures: style.Figures) -> axes.Figure:
  """CKA of each head subset against each ResNet layer vs the subset's distance (Fig 5)."""
  fig = axes.Figure(figsize=(6.2, 4.2), layout="constrained")
  ax = fig.subplots()
  for j, name in enumerate(layers):
    ax.plot(distance, cka[:, j], "o-", ms=4, label=f"{res_label} {name}")
  ax.set_xlabel("mean attention distance of the head subset (px)")
  ax.set_ylabel("CKA with the ResNet layer")
  ax.set_title(f"Head subsets of {vit_label} against {res_label}")
  ax.legend(title="ResNet layer", loc="best")
  return style.save_figure(fig, path, figures)
