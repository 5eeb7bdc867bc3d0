"""The figures' style and how a run writes them, as values passed to each figure.

No matplotlib here: the config checks (`run/control`, imported by configs) build
a `Figures` without loading it.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from vitcnn_jax import fileio

# Sizes read at the figures' default size, printed at a column's width (>= 8 pt).
STYLE = {"font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "xtick.labelsize": 8.5,
         "ytick.labelsize": 8.5, "legend.fontsize": 8.5, "figure.titlesize": 11.5,
         "legend.frameon": False, "svg.fonttype": "none", "pdf.fonttype": 42}  # editable text in vector files


@dataclasses.dataclass(frozen=True)
class Figures:
  """How figures are written: `format`, a vector file ("pdf", "svg") beside each
  PNG or the PNG alone ("png"); `vmin`, `vmax`, the CKA colour scale."""
  format: str = "png"
  vmin: float = 0.0
  vmax: float = 1.0

  def __post_init__(self):
    if self.format not in fileio.FIGURE_FORMATS:
      raise ValueError(f"format={self.format!r} is not one of {fileio.FIGURE_FORMATS}.")
    if not self.vmin < self.vmax:
      raise ValueError(f"vmin={self.vmin} must be below vmax={self.vmax}.")


def save_figure(fig: Any, path: str, figures: Figures, tight: bool = True) -> Any:
  """PATH (a .png) and, if `figures` asks, the same figure as PDF or SVG beside it;
  `tight`: cropped to what is drawn (a figure laid out by hand is saved as it is).
  Returns `fig`: the caller keeps it (a notebook shows it) or lets it go."""
  stem = path[:-len(".png")] if path.endswith(".png") else path
  for fmt in ["png"] + ([figures.format] if figures.format != "png" else []):
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=150, bbox_inches="tight" if tight else None)
    fileio.atomic_write(f"{stem}.{fmt}", lambda f, buf=buf: f.write(buf.getvalue()))
  return fig
