"""The localization figure: a token's CKA with every input patch (paper Figs 9, 10)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import style


@axes.styled
def token_patches(tok_patch: np.ndarray, grid: Sequence[int], tokens: Sequence[int], title: str,
                  path: str, figures: style.Figures) -> axes.Figure:
  """For each chosen token, CKA with every input patch on the image grid (Figs 9, 10)."""
  fig = axes.Figure(figsize=(3.2 * len(tokens) + 1, 3.4), layout="constrained")
  panels = fig.subplots(1, len(tokens), squeeze=False)
  for ax, t in zip(panels[0], tokens):
    im = ax.imshow(tok_patch[t].reshape(grid), cmap="magma", vmin=0, vmax=1)
    ty, tx = divmod(t, grid[1])
    ax.plot(tx, ty, "c+", ms=12, mew=2, label="the token's own patch")
    ax.set_title(f"token {t} (row {ty}, column {tx})")
    ax.set_xticks([])
    ax.set_yticks([])
  panels[0][0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), fontsize=8)
  fig.colorbar(im, ax=list(panels[0]), label="CKA with the input patch")
  fig.suptitle(title)
  return style.save_figure(fig, path, figures)
