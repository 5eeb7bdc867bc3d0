"""The CKA figures (paper Figs 1, 2, B.1): a layers x layers map per pair of
models, and every similarity measure of a pair side by side with its null, its
intervals and each layer's match."""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import numpy as np

from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import style


@axes.styled
def heatmap(matrix: np.ndarray, rows: Sequence[str], cols: Sequence[str], *, row_label: str,
            col_label: str, title: str, path: str, figures: style.Figures) -> axes.Figure:
  """Layers x layers CKA, origin at the lower left like Figs 1, 2 and B.1: one
  tick per block, thin lines at block edges (every layer's name is in the npz)."""
  fig = axes.Figure(figsize=(6.0, 5.2))
  ax = fig.subplots()
  im = ax.imshow(matrix, origin="lower", cmap="magma", vmin=figures.vmin, vmax=figures.vmax,
                 aspect="auto", interpolation="nearest")
  fig.colorbar(im, ax=ax, label="CKA", fraction=0.046, pad=0.03)
  xs = axes.block_axis(ax, cols, "x")
  ys = axes.block_axis(ax, rows, "y")
  ax.set_xlabel(f"{col_label}: layers by {xs} ({len(cols)} layers)")
  ax.set_ylabel(f"{row_label}: layers by {ys} ({len(rows)} layers)")
  ax.set_title(title)
  return style.save_figure(fig, path, figures)


def _overlays(ax, matrix: np.ndarray, flat: np.ndarray | None, match, first: bool) -> str:
  """A measure's map's marks: cells like the null, each row's best match and the
  monotone alignment (legend on the first panel, or where cells are flagged);
  the score for the title."""
  flagged = flat is not None and flat.any()
  if flagged:
    ys, xs = np.nonzero(flat)
    ax.plot(xs, ys, "o", color="#29d3f4", ms=max(2.5, 150 / max(matrix.shape)), mew=0,
            label="cannot be told from the null")
  if match is not None:
    best, aligned, _ = match
    ax.plot(best, np.arange(len(best)), "+", color="white", ms=max(3.0, 200 / max(matrix.shape)),
            mew=1.0, label="best match of each row")
    ax.plot(aligned, np.arange(len(aligned)), "-", color="#39ff14", lw=1.6, label="depth-monotone match")
  if flagged or (match is not None and first):
    ax.legend(loc="upper left", fontsize=8, markerscale=1.5, frameon=True)
  return f"\n{match[2]}" if match is not None else ""


# A measure map's panel and its colour bar, in inches: the many-panel figure is laid
# out by this arithmetic, not by matplotlib's layout engines, which measured every
# tick label of its 60-odd axes on each draw (8 s a figure at 22 measures, 3 s now).
_PANEL, _BAR, _BAR_GAP, _COLUMN_GAP = (3.2, 3.0), 0.13, 0.08, 0.8
_TITLE, _ROW_GAP, _MARGIN = 0.5, 0.12, 0.15


def _panel_grid(fig_rows: Sequence[bool], ncols: int, title: str, x_ticks: int, y_ticks: int):
  """A figure of `ncols` columns and one row of panels per entry of `fig_rows`
  (True: a row whose x axis is labelled below it), each panel with room for a colour bar;
  `x_ticks` / `y_ticks`: the widest tick text in characters (the margins it needs).
  Returns (fig, rectangle maker: (row, col, rows its colour bar spans, 0: none) ->
  (panel axes, colour bar axes or None))."""
  char = 0.085  # inches a character of 8.5 pt takes, roughly
  left = 0.45 + char * y_ticks
  below = 0.5 + char * x_ticks  # tick text (rotated if long) and the axis label
  column = _PANEL[0] + _BAR_GAP + _BAR + _COLUMN_GAP
  top = 0.25 + 0.22 * (title.count("\n") + 1)
  heights = [_TITLE + _PANEL[1] + (below if labelled else _ROW_GAP) for labelled in fig_rows]
  width, height = left + ncols * column - _COLUMN_GAP + 0.5, top + sum(heights) + _MARGIN
  fig = axes.Figure(figsize=(width, height))
  fig.suptitle(title, y=1 - 0.15 / height, va="top")
  tops = np.cumsum([top] + heights[:-1]) + _TITLE

  def place(row: int, col: int, bar_rows: int = 1):
    x = left + col * column
    bottom = lambda r: height - tops[r] - _PANEL[1]
    y = bottom(row)
    ax = fig.add_axes((x / width, y / height, _PANEL[0] / width, _PANEL[1] / height))
    if not bar_rows:
      return ax, None
    low = bottom(row + bar_rows - 1)
    bar = fig.add_axes(((x + _PANEL[0] + _BAR_GAP) / width, low / height, _BAR / width,
                        (y + _PANEL[1] - low) / height), label="<colorbar>")
    return ax, bar
  return fig, place


@axes.styled
def measure_maps(maps: dict[str, np.ndarray], rows: Sequence[str], cols: Sequence[str], *,
                 row_label: str, col_label: str, title: str, path: str, figures: style.Figures,
                 nulls: dict[str, np.ndarray] | None = None,
                 flat: dict[str, np.ndarray] | None = None,
                 widths: dict[str, np.ndarray] | None = None,
                 distances: Sequence[str] = (),
                 matches: dict[str, tuple[np.ndarray, np.ndarray, str]] | None = None) -> axes.Figure:
  """Several similarity measures of one pair of models side by side (a panel each,
  at most five to a row of panels; the null's maps below each on the same scale where it has one;
  the widths of the 95% intervals below those), cells that cannot be told from the
  null (`flat`, boolean) dotted; layer ticks and names on the outer panels only.
  The scale is the CKA one (`figures.vmin`, `figures.vmax`), from -1 for a measure that
  goes clearly negative; a distance (`distances`) has its own, from 0 to its largest
  value, reversed so that alike is bright in every panel. `matches`: per measure,
  each row's best column, the depth-monotone alignment (a column per row) and the
  pair's score, drawn over its map and named in its title."""
  names = list(maps)
  ncols = min(len(names), 5)
  blocks = [names[i:i + ncols] for i in range(0, len(names), ncols)]
  # Panels per measure, stacked, in each row of measures: a null row only where one has a null.
  pers = [1 + any(n in (nulls or {}) for n in b) + bool(widths) for b in blocks]
  tops = np.cumsum([0] + pers[:-1])
  widest = lambda ns: max(len(axes.tick_text(g)) for g, _, _ in axes.layer_groups(ns))
  x_chars = widest(cols) if widest(cols) > 5 else 1  # `axes.block_axis` turns long x tick text
  fig, place = _panel_grid([i == per - 1 for per in pers for i in range(per)], ncols, title,
                           x_chars, widest(rows))
  for j, name in enumerate(names):
    top, per, col = tops[j // ncols], pers[j // ncols], j % ncols
    shown = [maps[name]] + ([nulls[name]] if nulls and name in nulls else [])
    low = -1.0 if min(float(np.nanmin(m)) for m in shown) < -0.05 else figures.vmin
    high, cmap = figures.vmax, "magma"
    if name in distances:
      low, high, cmap = 0.0, max(float(np.nanmax(m)) for m in shown) or 1.0, "magma_r"
    panels = [(m, cmap, low, high, name + (" of the null (permuted)" if i else ""))
              for i, m in enumerate(shown)]
    if widths:
      panels.append((widths[name], "viridis", 0, None, f"{name}: 95% interval width"))
    for i, (matrix, cm, lo, hi, text) in enumerate(panels):
      row = top + (i if i < len(shown) else per - 1)
      # The map and its null share a scale, so one colour bar beside both.
      ax, bar = place(row, col, len(shown) if i == 0 else int(i >= len(shown)))
      im = ax.imshow(matrix, origin="lower", cmap=cm, vmin=lo, vmax=hi, aspect="auto",
                     interpolation="nearest")
      score = _overlays(ax, matrix, (flat or {}).get(name), (matches or {}).get(name), j == 0) if i == 0 else ""
      ax.set_title(text + score)
      if bar is not None:
        fig.colorbar(im, cax=bar)
      last = row - top == per - 1
      xs, ys = axes.block_axis(ax, cols, "x", ticks=last), axes.block_axis(ax, rows, "y", ticks=col == 0)
      if last:
        ax.set_xlabel(f"{col_label} ({xs})")
      if col == 0:
        ax.set_ylabel(f"{row_label} ({ys})")
  return style.save_figure(fig, path, figures, tight=False)


def _pair_title(a: axes.Labelled, b: axes.Labelled, across: str, within: str) -> str:
  return f"{across}{a.label} vs {b.label}" if a is not b else f"{within}{a.label}"


def heatmaps(pairs: Sequence[tuple], arrays: dict[str, np.ndarray], subtitle: str, workdir: str,
             figures: style.Figures, only: Sequence[str] | None = None) -> list[axes.Figure]:
  """`cka_TAG.png` of each pair (tag, model a, model b, ...) of `pairs` (of those
  in `only`, if given): the map `cka_TAG` of `arrays`, titled by the models' labels."""
  return [heatmap(arrays[f"cka_{t}"], a.names, b.names, row_label=a.label, col_label=b.label,
                  title=f"{_pair_title(a, b, 'CKA: ', 'CKA within ')}\n{subtitle}",
                  path=os.path.join(workdir, f"cka_{t}.png"), figures=figures)
          for t, a, b, *_ in pairs if only is None or t in only]


@dataclasses.dataclass(frozen=True)
class Measure:
  """A similarity measure as its figures show it: `prefix`, what its arrays' names
  start with (`KINDS`); `label`, its panels' title; `distance`, alike is small (a
  scale of its own); `scores`, by pair tag, the text of its layer matching's score."""
  prefix: str
  label: str
  distance: bool = False
  scores: dict[str, str] = dataclasses.field(default_factory=dict)


# The arrays of a measure with prefix P for the pair TAG: "{}" stands for P, and
# the array is KIND_TAG (its map, cells like the null, the null's map, the 95%
# interval's ends, each row's best match, the depth-monotone match).
KINDS = ("{}", "{}_like_null", "null_{}", "{}_ci_low", "{}_ci_high", "best_{}", "monotone_{}")


def measures(pairs: Sequence[tuple], arrays: dict[str, np.ndarray], shown: Sequence[Measure],
             subtitle: str, workdir: str, figures: style.Figures) -> list[axes.Figure]:
  """`measures_TAG.png` of each pair (tag, model a, model b, ...) of `pairs`: every
  measure of `shown` side by side (the nulls below them, where `arrays` has
  them), with each layer's matches and the pair's score where the models differ."""
  out = []
  for t, a, b, *_ in pairs:
    have = {kind: {m.label: arrays[f"{kind.format(m.prefix)}_{t}"] for m in shown
                   if f"{kind.format(m.prefix)}_{t}" in arrays} for kind in KINDS}
    widths = {k: high - have["{}_ci_low"][k] for k, high in have["{}_ci_high"].items()}
    matches = {m.label: (have["best_{}"][m.label], have["monotone_{}"][m.label], f"score {m.scores[t]}")
               for m in shown if m.label in have["best_{}"]}
    out.append(measure_maps(
        have["{}"], a.names, b.names, row_label=a.label, col_label=b.label,
        title=f"Similarity {_pair_title(a, b, '', 'within ')}\n{subtitle}",
        path=os.path.join(workdir, f"measures_{t}.png"), figures=figures, nulls=have["null_{}"] or None,
        flat=have["{}_like_null"] or None, widths=widths or None,
        distances=[m.label for m in shown if m.distance], matches=matches or None))
  return out
