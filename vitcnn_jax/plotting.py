"""Figures in the style of the paper's, one function per figure family."""

from __future__ import annotations

import contextlib
import functools
import io
from typing import Any, Callable, Iterator, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=g-import-not-at-top
from matplotlib import ticker  # noqa: E402  pylint: disable=g-import-not-at-top
import numpy as np  # noqa: E402

from vitcnn_jax import fileio  # noqa: E402


# Sizes read at the figures' default size, printed at a column's width (>= 8 pt).
STYLE = {"font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "xtick.labelsize": 8.5,
         "ytick.labelsize": 8.5, "legend.fontsize": 8.5, "figure.titlesize": 11.5,
         "legend.frameon": False, "svg.fonttype": "none", "pdf.fonttype": 42}  # editable text in vector files
_options: dict[str, Any] = {"format": "png", "vmin": 0.0, "vmax": 1.0, "kept": None}


@contextlib.contextmanager
def options(format: str = "png", vmin: float = 0.0, vmax: float = 1.0,  # pylint: disable=redefined-builtin
            keep: bool = False) -> Iterator[list]:
  """Figure options while the block runs: `format` (a vector file beside each PNG),
  the CKA colour scale, and `keep`: figures stay open and are collected in the
  list yielded (a notebook shows them) instead of being closed once written."""
  if format not in fileio.FIGURE_FORMATS:
    raise ValueError(f"plot format {format!r} is not one of {fileio.FIGURE_FORMATS}.")
  if not vmin < vmax:
    raise ValueError(f"plot vmin={vmin} must be below vmax={vmax}.")
  kept: list = []
  saved = dict(_options)
  _options.update(format=format, vmin=vmin, vmax=vmax, kept=kept if keep else None)
  try:
    yield kept
  finally:
    _options.clear()
    _options.update(saved)


def styled(fn: Callable) -> Callable:
  """Draws `fn`'s figure under `STYLE`."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    with plt.rc_context(STYLE):
      return fn(*args, **kwargs)
  return wrapper


def save_figure(fig, path: str, tight: bool = True) -> None:
  """PATH (a .png) and, if asked, the same figure as PDF or SVG beside it;
  `tight`: cropped to what is drawn (a figure laid out by hand is saved as it is)."""
  stem = path[:-len(".png")] if path.endswith(".png") else path
  formats = ["png"] + ([_options["format"]] if _options["format"] != "png" else [])
  for fmt in formats:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=150, bbox_inches="tight" if tight else None)
    fileio.atomic_write(f"{stem}.{fmt}", lambda f, buf=buf: f.write(buf.getvalue()))
  if _options["kept"] is not None:
    _options["kept"].append(fig)
  else:
    plt.close(fig)


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


def _short(group: str) -> str:
  """Tick text of a group: block03 -> 3, block2/unit01 -> 2.1, root -> root."""
  parts = group.split("/")
  if parts[0].startswith("block") and parts[0][5:].isdigit():
    if len(parts) == 2 and parts[1].startswith("unit") and parts[1][4:].isdigit():
      return f"{int(parts[0][5:])}.{int(parts[1][4:])}"
    return str(int(parts[0][5:]))
  return group


def _block_axis(ax, names: Sequence[str], axis: str, max_ticks: int = 24,
                edges: str = "white", ticks: bool = True) -> str:
  """One tick per block (every k-th if there are many) at its middle, lines at its
  edges (without `ticks`, the lines alone: an inner panel of many); returns what
  the ticks count, for the axis label."""
  groups = layer_groups(names)
  set_ticks = ax.set_xticks if axis == "x" else ax.set_yticks
  if ticks:
    step = max(1, int(np.ceil(len(groups) / max_ticks)))
    shown = groups[::step]
    labels = [_short(g) for g, _, _ in shown]
    set_ticks([(a + b - 1) / 2 for _, a, b in shown], labels,
              rotation=90 if axis == "x" and max(map(len, labels)) > 5 else 0)
  else:
    set_ticks([])
  lines = ax.vlines if axis == "x" else ax.hlines
  lines([a - 0.5 for _, a, _ in groups[1:]], 0, 1, transform=ax.get_xaxis_transform() if axis == "x"
        else ax.get_yaxis_transform(), color=edges, lw=0.6, alpha=0.7, zorder=0.5)
  resnet = any("/unit" in g for g, _, _ in groups)
  return "stage.unit" if resnet else "block"


@styled
def cka_heatmap(matrix: np.ndarray, rows: Sequence[str], cols: Sequence[str], *,
                row_label: str, col_label: str, title: str, path: str) -> None:
  """Layers x layers CKA, origin at the lower left like Figs 1, 2 and B.1: one
  tick per block, thin lines at block edges (every layer's name is in the npz)."""
  fig, ax = plt.subplots(figsize=(6.0, 5.2))
  im = ax.imshow(matrix, origin="lower", cmap="magma", vmin=_options["vmin"],
                 vmax=_options["vmax"], aspect="auto", interpolation="nearest")
  fig.colorbar(im, ax=ax, label="CKA", fraction=0.046, pad=0.03)
  xs = _block_axis(ax, cols, "x")
  ys = _block_axis(ax, rows, "y")
  ax.set_xlabel(f"{col_label}: layers by {xs} ({len(cols)} layers)")
  ax.set_ylabel(f"{row_label}: layers by {ys} ({len(rows)} layers)")
  ax.set_title(title)
  save_figure(fig, path)


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
    ax.legend(loc="upper left", fontsize=7, markerscale=1.5, frameon=True)
  return f"\n{match[2]}" if match is not None else ""


# A measure map's panel and its colour bar, in inches: the many-panel figure is laid
# out by this arithmetic, not by matplotlib's layout engines, which measured every
# tick label of its 60-odd axes on each draw (8 s a figure at 22 measures, 3 s now).
_PANEL, _BAR, _BAR_GAP, _COLUMN_GAP = (3.2, 3.0), 0.13, 0.08, 0.8
_TITLE, _ROW_GAP, _MARGIN = 0.5, 0.12, 0.15


def _panel_grid(fig_rows: Sequence[bool], ncols: int, title: str, x_ticks: int, y_ticks: int):
  """A figure of `ncols` columns and one row of panels per entry of `fig_rows`
  (True: a row whose x axis is labelled below it), each panel with a colour bar;
  `x_ticks` / `y_ticks`: the widest tick text in characters (the margins it needs).
  Returns (fig, rectangle maker: (row, col) -> (panel axes, colour bar axes))."""
  char = 0.085  # inches a character of 8.5 pt takes, roughly
  left = 0.45 + char * y_ticks
  below = 0.5 + char * x_ticks  # tick text (rotated if long) and the axis label
  column = _PANEL[0] + _BAR_GAP + _BAR + _COLUMN_GAP
  top = 0.25 + 0.22 * (title.count("\n") + 1)
  heights = [_TITLE + _PANEL[1] + (below if labelled else _ROW_GAP) for labelled in fig_rows]
  width, height = left + ncols * column - _COLUMN_GAP + 0.5, top + sum(heights) + _MARGIN
  fig = plt.figure(figsize=(width, height))
  fig.suptitle(title, y=1 - 0.15 / height, va="top")
  tops = np.cumsum([top] + heights[:-1]) + _TITLE

  def axes(row: int, col: int):
    x = left + col * column
    y = height - tops[row] - _PANEL[1]
    ax = fig.add_axes((x / width, y / height, _PANEL[0] / width, _PANEL[1] / height))
    bar = fig.add_axes(((x + _PANEL[0] + _BAR_GAP) / width, y / height, _BAR / width, _PANEL[1] / height),
                       label="<colorbar>")
    return ax, bar
  return fig, axes


@styled
def measure_maps(maps: dict[str, np.ndarray], rows: Sequence[str], cols: Sequence[str], *,
                 row_label: str, col_label: str, title: str, path: str,
                 nulls: dict[str, np.ndarray] | None = None,
                 flat: dict[str, np.ndarray] | None = None,
                 widths: dict[str, np.ndarray] | None = None,
                 distances: Sequence[str] = (),
                 matches: dict[str, tuple[np.ndarray, np.ndarray, str]] | None = None) -> None:
  """Several similarity measures of one pair of models side by side (a panel each,
  at most five to a row of panels; the null's maps below each on the same scale where it has one;
  the widths of the 95% intervals below those), cells that cannot be told from the
  null (`flat`, boolean) dotted; layer ticks and names on the outer panels only.
  The scale is the CKA one (`vmin`, `vmax`), from -1 for a measure that goes
  clearly negative; a distance (`distances`) has its own, from 0 to its largest
  value, reversed so that alike is bright in every panel. `matches`: per measure,
  each row's best column, the depth-monotone alignment (a column per row) and the
  pair's score, drawn over its map and named in its title."""
  names = list(maps)
  per = 1 + bool(nulls) + bool(widths)  # panels per measure, stacked
  ncols = min(len(names), 5)
  blocks = -(-len(names) // ncols)
  widest = lambda ns: max(len(_short(g)) for g, _, _ in layer_groups(ns))  # noqa: E731
  x_chars = widest(cols) if widest(cols) > 5 else 1  # `_block_axis` turns long x tick text
  fig, place = _panel_grid([i % per == per - 1 for i in range(per * blocks)], ncols, title,
                           x_chars, widest(rows))
  for j, name in enumerate(names):
    top, col = per * (j // ncols), j % ncols
    shown = [maps[name]] + ([nulls[name]] if nulls and name in nulls else [])
    low = -1.0 if min(float(np.nanmin(m)) for m in shown) < -0.05 else _options["vmin"]
    high, cmap = _options["vmax"], "magma"
    if name in distances:
      low, high, cmap = 0.0, max(float(np.nanmax(m)) for m in shown) or 1.0, "magma_r"
    panels = [(m, cmap, low, high, name + (" of the null (permuted)" if i else ""))
              for i, m in enumerate(shown)]
    if widths:
      panels.append((widths[name], "viridis", 0, None, f"{name}: 95% interval width"))
    for i, (matrix, cm, lo, hi, text) in enumerate(panels):
      row = top + (i if i < len(shown) else per - 1)
      ax, bar = place(row, col)
      im = ax.imshow(matrix, origin="lower", cmap=cm, vmin=lo, vmax=hi, aspect="auto",
                     interpolation="nearest")
      score = _overlays(ax, matrix, (flat or {}).get(name), (matches or {}).get(name), j == 0) if i == 0 else ""
      ax.set_title(text + score)
      fig.colorbar(im, cax=bar)
      last = row % per == per - 1
      xs, ys = _block_axis(ax, cols, "x", ticks=last), _block_axis(ax, rows, "y", ticks=col == 0)
      if last:
        ax.set_xlabel(f"{col_label} ({xs})")
      if col == 0:
        ax.set_ylabel(f"{row_label} ({ys})")
  save_figure(fig, path, tight=False)


@styled
def attention_distance(mean: Sequence[np.ndarray], blocks: Sequence[int],
                       plot_blocks: Sequence[int] | None, label: str, ceiling: np.ndarray,
                       path: str) -> None:
  """Left: heads sorted by distance for chosen blocks (Fig 3); right: every block.
  `mean`: each block's head distances (stages may differ in heads); `ceiling`:
  each block's uniform-attention distance (a Swin's grows stage by stage)."""
  chosen = list(plot_blocks) if plot_blocks else sorted({blocks[0], blocks[min(1, len(blocks) - 1)],
                                                         blocks[-2] if len(blocks) > 1 else blocks[0],
                                                         blocks[-1]})
  missing = [b for b in chosen if b not in blocks]
  if missing:
    raise ValueError(f"plot_blocks {missing} are not among the captured blocks {list(blocks)}.")
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
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
  save_figure(fig, path)


@styled
def attention_distance_compare(
    models: Sequence[tuple[Sequence[np.ndarray], Sequence[int], str, np.ndarray]], path: str) -> None:
  """Several models' mean distances against relative depth: per model, the mean
  over heads with the band from its nearest to its farthest head, as a fraction
  of each block's uniform-attention distance (grids, patches and windows differ)."""
  fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
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
  save_figure(fig, path)


@styled
def skip_ratio(ratio: np.ndarray, cos: np.ndarray, prefix: int, plot_tokens: int, label: str,
               others: Sequence[tuple[np.ndarray, str]], sublayers: Sequence[str], path: str) -> None:
  """Fig 7 (tokens x sublayers heatmap; CLS vs spatial tokens vs the ratios of
  `others`, e.g. a ResNet's units) and Fig E.2 (cosine). `ratio`: (block,
  sublayer, token)."""
  depth = ratio.shape[0] * ratio.shape[1]
  flat = ratio.reshape(depth, -1)  # rows: attn 0, mlp 0, attn 1, ...
  finite = np.where(np.isfinite(flat), flat, np.nan)
  top = np.nanmax(finite) if np.isfinite(finite).any() else 1.0
  shown = np.where(np.isfinite(flat), flat, top)  # an infinite ratio (zero branch) shows as the max
  rows = [f"{s} {b}" for b in range(ratio.shape[0]) for s in sublayers]
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), layout="constrained")
  k = min(plot_tokens, flat.shape[1])
  token_label = "token" + (" (0 = CLS)" if prefix else "")
  im = axes[0].imshow(shown[:, :k].T, aspect="auto", origin="lower", cmap="viridis")
  fig.colorbar(im, ax=axes[0], label="||z|| / ||f(z)||")
  axes[0].set_title(f"Norm ratio, first {k} tokens")
  if prefix:
    axes[1].plot(np.linspace(0, 1, depth), shown[:, 0], "o-", ms=3, label=f"{label} CLS token")
  axes[1].plot(np.linspace(0, 1, depth), shown[:, prefix:].mean(axis=1), "o-", ms=3,
               label=f"{label} spatial tokens")
  for r, rlabel in others:
    axes[1].plot(np.linspace(0, 1, len(r)), np.where(np.isfinite(r), r, top), "s-", ms=3,
                 label=rlabel)
  axes[1].set_xlabel("relative depth")
  axes[1].set_ylabel("||z|| / ||f(z)||")
  axes[1].set_title("Mean over tokens, by depth")
  axes[1].legend()
  im = axes[2].imshow(cos.reshape(depth, -1)[:, :k].T, aspect="auto", origin="lower",
                      cmap="coolwarm", vmin=-1, vmax=1)
  fig.colorbar(im, ax=axes[2], label="cos(f(z), z + f(z))")
  axes[2].set_title(f"Cosine of branch and sum, first {k} tokens")
  for ax in (axes[0], axes[2]):
    ax.set_xticks(range(len(rows)), rows, rotation=90)
    ax.set_xlabel("sublayer")
    ax.set_ylabel(token_label)
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  fig.suptitle(f"Skip connections: {label} (z: the residual stream, f(z): the branch)")
  save_figure(fig, path)


def _columns(counts: Sequence[int], widest: int = 8) -> int:
  """Grid columns leaving the fewest empty cells over all models' rows (then fewest rows)."""
  def cost(c):
    return (sum(-(-n // c) * c - n for n in counts), sum(-(-n // c) for n in counts))
  return min(range(min(4, max(counts)), min(widest, max(counts)) + 1), key=cost)


@styled
def receptive_fields(models: Sequence[tuple[str, Sequence[str], np.ndarray, np.ndarray]],
                     path: str) -> None:
  """One image per layer, each normalised to its own maximum (Figs 6, C.1-C.4);
  a model's rows start a new row of the grid, its label on the first panel."""
  cols = _columns([len(names) for _, names, _, _ in models])
  nrows = sum(-(-len(names) // cols) for _, names, _, _ in models)
  fig, axes = plt.subplots(nrows, cols, figsize=(cols * 1.55, nrows * 1.75 + 0.5), squeeze=False,
                           layout="constrained")
  for ax in axes.ravel():
    ax.axis("off")
  r, one_by_one = 0, False
  for label, names, maps, grids in models:
    for i, (name, m, grid) in enumerate(zip(names, maps, grids)):
      ax = axes[r + i // cols, i % cols]
      ax.imshow(m / max(float(m.max()), 1e-30), cmap="viridis", vmin=0, vmax=1)
      note = " (1x1)*" if tuple(grid) == (1, 1) else ""
      one_by_one |= bool(note)
      ax.set_title(f"{label}\n{name}{note}" if i == 0 else f"{name}{note}", fontsize=8)
    r += -(-len(names) // cols)
  fig.suptitle("Effective receptive fields: |d centre / d input|, each panel scaled to its maximum")
  if one_by_one:
    fig.supxlabel("* the layer's feature map is 1x1: its only position is the 'centre'",
                  fontsize=8.5)
  save_figure(fig, path)


@styled
def localization(tok_patch: np.ndarray, grid: Sequence[int], tokens: Sequence[int], title: str,
                 path: str) -> None:
  """For each chosen token, CKA with every input patch on the image grid (Figs 9, 10)."""
  fig, axes = plt.subplots(1, len(tokens), figsize=(3.2 * len(tokens) + 1, 3.4), squeeze=False,
                           layout="constrained")
  for ax, t in zip(axes[0], tokens):
    im = ax.imshow(tok_patch[t].reshape(grid), cmap="magma", vmin=0, vmax=1)
    ty, tx = divmod(t, grid[1])
    ax.plot(tx, ty, "c+", ms=12, mew=2, label="the token's own patch")
    ax.set_title(f"token {t} (row {ty}, column {tx})")
    ax.set_xticks([])
    ax.set_yticks([])
  axes[0][0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), fontsize=8)
  fig.colorbar(im, ax=list(axes[0]), label="CKA with the input patch")
  fig.suptitle(title)
  save_figure(fig, path)


@styled
def head_subsets(distance: np.ndarray, cka: np.ndarray, layers: Sequence[str], vit_label: str,
                 res_label: str, path: str) -> None:
  """CKA of each head subset against each ResNet layer vs the subset's distance (Fig 5)."""
  fig, ax = plt.subplots(figsize=(6.2, 4.2), layout="constrained")
  for j, name in enumerate(layers):
    ax.plot(distance, cka[:, j], "o-", ms=4, label=f"{res_label} {name}")
  ax.set_xlabel("mean attention distance of the head subset (px)")
  ax.set_ylabel("CKA with the ResNet layer")
  ax.set_title(f"Head subsets of {vit_label} against {res_label}")
  ax.legend(title="ResNet layer", loc="best")
  save_figure(fig, path)


FEATURE_LABELS = {"cls": "CLS token", "first": "first token", "spatial_mean": "mean except CLS",
                  "mean": "mean over tokens/positions", "final_grid": "pooled to last grid",
                  "each": "per token (spatial mean)"}


@styled
def probe_depth(models: dict, labels: dict[str, str], title: str, path: str, band: bool = True) -> None:
  """Probe accuracy against relative depth, a line per model and feature (Figs 13, F.1, F.2),
  with a band of +-1 sd over seeds (`band`; none for one seed)."""
  fig, ax = plt.subplots(figsize=(6.6, 4.4), layout="constrained")
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
  save_figure(fig, path)


@styled
def probe_tokens(points: Sequence[tuple[str, np.ndarray, Sequence[int] | None]], prefix: int,
                 title: str, path: str, panels: int = 6) -> None:
  """Per-token probe accuracy on the token grid for some points (Fig D.4), and the
  mean over spatial tokens (and the class token) at every point (Fig 11)."""
  chosen = sorted({round(i) for i in np.linspace(0, len(points) - 1, min(panels, len(points)))})
  fig, axes = plt.subplots(1, len(chosen) + 1, figsize=(2.8 * (len(chosen) + 1), 3.6),
                           squeeze=False, layout="constrained",
                           gridspec_kw={"width_ratios": [1] * len(chosen) + [1.7]})
  for ax, i in zip(axes[0], chosen):
    name, acc, grid = points[i]
    spatial = 100 * acc[prefix:]
    im = ax.imshow(spatial.reshape(grid) if grid else spatial[None], cmap="viridis")
    ax.set_title(f"{name}\n{spatial.min():.1f}-{spatial.max():.1f}%")
    ax.axis("off")
    fig.colorbar(im, ax=ax, shrink=0.8, label="accuracy (%)")
  ax = axes[0][-1]
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
  save_figure(fig, path)


@styled
def layer_lines(lines: dict[str, tuple[Sequence[str], np.ndarray]], ylabel: str, title: str,
                path: str, spread: dict[str, np.ndarray] | None = None,
                ylim: tuple[float, float] | None = (0, 1.02)) -> None:
  """A per-layer quantity, a line per model over its layers (by block), with an
  optional band of +-`spread`; models with other layers get a panel of their own
  (Fig 12: CKA with the reference, a line per data fraction; Fig G.1: before vs
  after fine-tuning; the first principal component's share per model)."""
  panels: dict[tuple[str, ...], list[str]] = {}
  for label, (names, _) in lines.items():  # models whose layers are a prefix of another's share it
    key = next((k for k in panels if tuple(names) == k[:len(names)] or k == tuple(names)[:len(k)]),
               tuple(names))
    panels.setdefault(key, []).append(label)
  fig, axes = plt.subplots(1, len(panels), figsize=(7.5 if len(panels) == 1 else 5.2 * len(panels), 4.4),
                           squeeze=False, sharey=True, layout="constrained")
  marker = iter("os^vDP*X" * len(lines))
  for ax, labels in zip(axes[0], panels.values()):
    names: Sequence[str] = []
    for label in labels:
      names_, values = lines[label]
      x = np.arange(len(values))
      ax.plot(x, values, next(marker) + "-", ms=4, label=label)
      if spread is not None and label in spread:
        ax.fill_between(x, values - spread[label], values + spread[label], alpha=0.2, lw=0)
      names = names_ if len(names_) > len(names) else names
    unit = _block_axis(ax, names, "x", edges="0.8")
    ax.set_xlabel(f"layer, by {unit} ({len(names)} layers)")
    if ylim is not None:
      ax.set_ylim(*ylim)
    ax.legend()
    if len(panels) > 1:
      ax.set_title(", ".join(labels))
  axes[0][0].set_ylabel(ylabel)
  (fig.suptitle if len(panels) > 1 else axes[0][0].set_title)(title)
  save_figure(fig, path)


@styled
def accuracy_drop(accuracy: dict[str, float], reference: str, examples: int, path: str) -> None:
  """Top-1 accuracy lost against the reference model, a bar per model (Fig 8)."""
  labels = [k for k in accuracy if k != reference]
  drops = [100 * (accuracy[reference] - accuracy[k]) for k in labels]
  fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(labels) + 1.5), 3.8), layout="constrained")
  bars = ax.bar(range(len(labels)), drops, color="C3")
  ax.bar_label(bars, [f"{d:+.1f}" for d in drops])
  ax.axhline(0, color="black", lw=0.8)
  ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
  ax.set_ylabel("top-1 accuracy drop (points)")
  ax.set_title(f"Accuracy lost against {reference} ({100 * accuracy[reference]:.1f}%)\n"
               f"on {examples} examples")
  ax.margins(y=0.15)
  save_figure(fig, path)
