"""The skip-connection figure: each sublayer's norm ratio of the residual stream
to its branch, by token and by depth (paper Figs 7, E.1), and their cosine (Fig E.2)."""

from __future__ import annotations

from typing import Sequence

from matplotlib import ticker
import numpy as np

from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import style


@axes.styled
def ratios(ratio: np.ndarray, cos: np.ndarray, prefix: int, plot_tokens: int, label: str,
           others: Sequence[tuple[np.ndarray, str]], sublayers: Sequence[str], path: str,
           figures: style.Figures) -> axes.Figure:
  """Fig 7 (tokens x sublayers heatmap; CLS vs spatial tokens vs the ratios of
  `others`, e.g. a ResNet's units) and Fig E.2 (cosine). `ratio`: (block,
  sublayer, token)."""
  depth = ratio.shape[0] * ratio.shape[1]
  flat = ratio.reshape(depth, -1)  # rows: attn 0, mlp 0, attn 1, ...
  finite = np.where(np.isfinite(flat), flat, np.nan)
  top = np.nanmax(finite) if np.isfinite(finite).any() else 1.0
  shown = np.where(np.isfinite(flat), flat, top)  # an infinite ratio (zero branch) shows as the max
  rows = [f"{s} {b}" for b in range(ratio.shape[0]) for s in sublayers]
  fig = axes.Figure(figsize=(15, 4.6), layout="constrained")
  panels = fig.subplots(1, 3)
  k = min(plot_tokens, flat.shape[1])
  token_label = "token" + (" (0 = CLS)" if prefix else "")
  im = panels[0].imshow(shown[:, :k].T, aspect="auto", origin="lower", cmap="viridis")
  fig.colorbar(im, ax=panels[0], label="||z|| / ||f(z)||")
  panels[0].set_title(f"Norm ratio, first {k} tokens")
  if prefix:
    panels[1].plot(np.linspace(0, 1, depth), shown[:, 0], "o-", ms=3, label=f"{label} CLS token")
  panels[1].plot(np.linspace(0, 1, depth), shown[:, prefix:].mean(axis=1), "o-", ms=3,
                 label=f"{label} spatial tokens")
  for r, rlabel in others:
    panels[1].plot(np.linspace(0, 1, len(r)), np.where(np.isfinite(r), r, top), "s-", ms=3,
                   label=rlabel)
  panels[1].set_xlabel("relative depth")
  panels[1].set_ylabel("||z|| / ||f(z)||")
  panels[1].set_title("Mean over tokens, by depth")
  panels[1].legend()
  im = panels[2].imshow(cos.reshape(depth, -1)[:, :k].T, aspect="auto", origin="lower",
                        cmap="coolwarm", vmin=-1, vmax=1)
  fig.colorbar(im, ax=panels[2], label="cos(f(z), z + f(z))")
  panels[2].set_title(f"Cosine of branch and sum, first {k} tokens")
  for ax in (panels[0], panels[2]):
    ax.set_xticks(range(len(rows)), rows, rotation=90)
    ax.set_xlabel("sublayer")
    ax.set_ylabel(token_label)
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  fig.suptitle(f"Skip connections: {label} (z: the residual stream, f(z): the branch)")
  return style.save_figure(fig, path, figures)
