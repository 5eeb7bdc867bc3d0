"""What the figures share: their type, drawing under the style, layers grouped by
block, and axes ticked by block."""

from __future__ import annotations

import functools
import io
from typing import Callable, Protocol, Sequence

import matplotlib
from matplotlib import figure
import numpy as np

from vitcnn_jax.plotting import style


class Labelled(Protocol):
  """A model as its figures name it: its `label` and its layers' `names`."""
  label: str
  names: Sequence[str]


class Figure(figure.Figure):
  """A matplotlib Figure, made without pyplot, that a notebook shows whatever its
  session's backend: IPython displays its `_repr_png_` where no printer for
  Figures is registered (as `%matplotlib inline` registers one)."""

  def _repr_png_(self) -> bytes:
    buf = io.BytesIO()
    with matplotlib.rc_context(style.STYLE):
      self.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def styled(fn: Callable) -> Callable:
  """Draws `fn`'s figure under `style.STYLE`, leaving the session's settings as they were."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    with matplotlib.rc_context(style.STYLE):
      return fn(*args, **kwargs)
  return wrapper


def protocol(examples: int, repeats: int) -> str:
  """'2,560 examples, 3 repeats': a subtitle of CKA figures."""
  return f"{examples:,} examples, {repeats} repeat{'' if repeats == 1 else 's'}"


def layer_groups(names: Sequence[str]) -> list[tuple[str, int, int]]:
  """(group, first, end) runs of consecutive layers of one block: `blockNN` of a
  ViT or Mixer, `blockN/unitMM` of a ResNet, else the first path component."""
  out: list[tuple[str, int, int]] = []
  for i, name in enumerate(names):
    parts = name.split("/")
    group = "/".join(parts[:2]) if len(parts) > 2 and parts[1].startswith("unit") else parts[0]
    if out and out[-1][0] == group:
      out[-1] = (group, out[-1][1], i + 1)
    else:
      out.append((group, i, i + 1))
  return out


def tick_text(group: str) -> str:
  """Tick text of a group: block03 -> 3, block2/unit01 -> 2.1, root -> root."""
  parts = group.split("/")
  if parts[0].startswith("block") and parts[0][5:].isdigit():
    if len(parts) == 2 and parts[1].startswith("unit") and parts[1][4:].isdigit():
      return f"{int(parts[0][5:])}.{int(parts[1][4:])}"
    return str(int(parts[0][5:]))
  return group


def block_axis(ax, names: Sequence[str], axis: str, max_ticks: int = 24,
               edges: str = "white", ticks: bool = True) -> str:
  """One tick per block (every k-th if there are many) at its middle, lines at its
  edges (without `ticks`, the lines alone: an inner panel of many, whose axis is
  hidden rather than drawn empty: the same pixels, less to draw);
  returns what the ticks count, for the axis label."""
  groups = layer_groups(names)
  set_ticks = ax.set_xticks if axis == "x" else ax.set_yticks
  if ticks:
    step = max(1, int(np.ceil(len(groups) / max_ticks)))
    shown = groups[::step]
    labels = [tick_text(g) for g, _, _ in shown]
    set_ticks([(a + b - 1) / 2 for _, a, b in shown], labels,
              rotation=90 if axis == "x" and max(map(len, labels)) > 5 else 0)
  else:
    (ax.xaxis if axis == "x" else ax.yaxis).set_visible(False)
  lines = ax.vlines if axis == "x" else ax.hlines
  lines([a - 0.5 for _, a, _ in groups[1:]], 0, 1, transform=ax.get_xaxis_transform() if axis == "x"
        else ax.get_yaxis_transform(), color=edges, lw=0.6, alpha=0.7, zorder=0.5)
  resnet = any("/unit" in g for g, _, _ in groups)
  return "stage.unit" if resnet else "block"
