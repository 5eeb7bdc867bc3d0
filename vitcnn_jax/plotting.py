"""Figures in the style of the paper's, one function per figure family."""

from __future__ import annotations

import io
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=g-import-not-at-top
import numpy as np  # noqa: E402

from vitcnn_jax import fileio  # noqa: E402


def save_figure(fig, path: str) -> None:
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
  plt.close(fig)
  fileio.atomic_write(path, lambda f: f.write(buf.getvalue()))


def _ticks(names: Sequence[str], max_ticks: int = 12) -> tuple[list[int], list[str]]:
  step = max(1, int(np.ceil(len(names) / max_ticks)))
  idx = list(range(0, len(names), step))
  return idx, [f"{i}: {names[i]}" for i in idx]


def cka_heatmap(matrix: np.ndarray, rows: Sequence[str], cols: Sequence[str], *,
                row_label: str, col_label: str, title: str, path: str) -> None:
  """Layers x layers CKA, origin at the lower left like Figs 1, 2 and B.1."""
  fig, ax = plt.subplots(figsize=(6.4, 5.6))
  im = ax.imshow(matrix, origin="lower", cmap="magma", vmin=0, vmax=1, aspect="auto",
                 interpolation="nearest")
  fig.colorbar(im, ax=ax, label="CKA")
  xi, xl = _ticks(cols)
  yi, yl = _ticks(rows)
  ax.set_xticks(xi, xl, rotation=90, fontsize=6)
  ax.set_yticks(yi, yl, fontsize=6)
  ax.set_xlabel(f"{col_label} layers")
  ax.set_ylabel(f"{row_label} layers")
  ax.set_title(title)
  save_figure(fig, path)
