"""The receptive-field figure: each layer's gradient map, a model's layers a run
of the grid (paper Figs 6, C.1-C.4)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import style


def _columns(counts: Sequence[int], widest: int = 8) -> int:
  """Grid columns leaving the fewest empty cells over all models' rows (then fewest rows)."""
  def cost(c):
    return (sum(-(-n // c) * c - n for n in counts), sum(-(-n // c) for n in counts))
  return min(range(min(4, max(counts)), min(widest, max(counts)) + 1), key=cost)


@axes.styled
def maps(models: Sequence[tuple[str, Sequence[str], np.ndarray, np.ndarray]], path: str,
         figures: style.Figures) -> axes.Figure:
  """One image per layer, each normalised to its own maximum (Figs 6, C.1-C.4);
  a model's rows start a new row of the grid, its label on the first panel."""
  cols = _columns([len(names) for _, names, _, _ in models])
  nrows = sum(-(-len(names) // cols) for _, names, _, _ in models)
  fig = axes.Figure(figsize=(cols * 1.55, nrows * 1.75 + 0.5), layout="constrained")
  grid = fig.subplots(nrows, cols, squeeze=False)
  for ax in grid.ravel():
    ax.axis("off")
  r, one_by_one = 0, False
  for label, names, images, sizes in models:
    for i, (name, m, size) in enumerate(zip(names, images, sizes)):
      ax = grid[r + i // cols, i % cols]
      ax.imshow(m / max(float(m.max()), 1e-30), cmap="viridis", vmin=0, vmax=1)
      note = " (1x1)*" if tuple(size) == (1, 1) else ""
      one_by_one |= bool(note)
      ax.set_title(f"{label}\n{name}{note}" if i == 0 else f"{name}{note}", fontsize=8)
    r += -(-len(names) // cols)
  fig.suptitle("Effective receptive fields: |d centre / d input|, each panel scaled to its maximum")
  if one_by_one:
    fig.supxlabel("* the layer's feature map is 1x1: its only position is the 'centre'",
                  fontsize=8.5)
  return style.save_figure(fig, path, figures)
