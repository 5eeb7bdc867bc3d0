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


def attention_distance(mean: np.ndarray, blocks: Sequence[int], plot_blocks: Sequence[int] | None,
                       label: str, ceiling: float, path: str) -> None:
  """Left: heads sorted by distance for chosen blocks (Fig 3); right: every block."""
  chosen = list(plot_blocks) if plot_blocks else sorted({blocks[0], blocks[min(1, len(blocks) - 1)],
                                                         blocks[-2] if len(blocks) > 1 else blocks[0],
                                                         blocks[-1]})
  missing = [b for b in chosen if b not in blocks]
  if missing:
    raise ValueError(f"plot_blocks {missing} are not among the captured blocks {list(blocks)}.")
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  for b in chosen:
    ax1.plot(np.sort(mean[list(blocks).index(b)]), "o-", ms=4, label=f"block {b}")
  ax1.set_xlabel("head (sorted by distance)")
  ax1.set_ylabel("mean attention distance (px)")
  ax1.legend(fontsize=8)
  for i, b in enumerate(blocks):
    ax2.scatter(np.full(mean.shape[1], b), mean[i], s=10, c="C0")
  ax2.set_xlabel("block")
  ax2.set_ylabel("mean attention distance (px)")
  for ax in (ax1, ax2):
    ax.axhline(ceiling, color="grey", ls="--", lw=0.8, label="uniform attention")
    ax.set_ylim(0, max(ceiling, float(mean.max())) * 1.08)
  fig.suptitle(f"Mean attention distance: {label}")
  save_figure(fig, path)


def skip_ratio(ratio: np.ndarray, cos: np.ndarray, prefix: int, plot_tokens: int, label: str,
               resnet: tuple[np.ndarray, str] | None, sublayers: Sequence[str], path: str) -> None:
  """Fig 7 (tokens x sublayers heatmap; CLS vs spatial vs ResNet) and Fig E.2 (cosine)."""
  depth = ratio.shape[0]
  flat = ratio.reshape(2 * depth, -1)  # rows: attn 0, mlp 0, attn 1, ...
  finite = np.where(np.isfinite(flat), flat, np.nan)
  top = np.nanmax(finite) if np.isfinite(finite).any() else 1.0
  shown = np.where(np.isfinite(flat), flat, top)  # an infinite ratio (zero branch) shows as the max
  rows = [f"{s} {b}" for b in range(depth) for s in sublayers]
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  k = min(plot_tokens, flat.shape[1])
  im = axes[0].imshow(shown[:, :k].T, aspect="auto", origin="lower", cmap="viridis")
  fig.colorbar(im, ax=axes[0], label="||z|| / ||f(z)||")
  axes[0].set_xticks(range(len(rows)), rows, rotation=90, fontsize=6)
  axes[0].set_ylabel("token" + (" (0 = CLS)" if prefix else ""))
  x = np.linspace(0, 1, 2 * depth)
  if prefix:
    axes[1].plot(x, shown[:, 0], "o-", ms=3, label=f"{label} CLS token")
  axes[1].plot(x, shown[:, prefix:].mean(axis=1), "o-", ms=3, label=f"{label} spatial tokens")
  if resnet is not None:
    r, rlabel = resnet
    axes[1].plot(np.linspace(0, 1, len(r)), np.where(np.isfinite(r), r, top), "s-", ms=3,
                 label=rlabel)
  axes[1].set_xlabel("relative depth")
  axes[1].set_ylabel("||z|| / ||f(z)||")
  axes[1].legend(fontsize=8)
  im = axes[2].imshow(cos.reshape(2 * depth, -1)[:, :k].T, aspect="auto", origin="lower",
                      cmap="coolwarm", vmin=-1, vmax=1)
  fig.colorbar(im, ax=axes[2], label="cos(f(z), z + f(z))")
  axes[2].set_xticks(range(len(rows)), rows, rotation=90, fontsize=6)
  fig.suptitle(f"Skip-connection norm ratio: {label}")
  save_figure(fig, path)


def receptive_fields(models: Sequence[tuple[str, Sequence[str], np.ndarray]], path: str,
                     per_row: int = 12) -> None:
  """One image per layer, each normalised to its own maximum (Figs 6, C.1-C.4)."""
  rows = sum(-(-len(names) // per_row) for _, names, _ in models)
  fig, axes = plt.subplots(rows, per_row, figsize=(per_row * 1.3, rows * 1.5), squeeze=False)
  for ax in axes.ravel():
    ax.axis("off")
  r = 0
  for label, names, maps in models:
    for i, (name, m) in enumerate(zip(names, maps)):
      ax = axes[r + i // per_row, i % per_row]
      ax.imshow(m / max(float(m.max()), 1e-30), cmap="viridis", vmin=0, vmax=1)
      ax.set_title(f"{label}\n{name}" if i == 0 else name, fontsize=5)
    r += -(-len(names) // per_row)
  fig.suptitle("Effective receptive fields (|d centre / d input|, per-layer normalised)")
  save_figure(fig, path)


def localization(tok_patch: np.ndarray, grid: Sequence[int], tokens: Sequence[int], title: str,
                 path: str) -> None:
  """For each chosen token, CKA with every input patch on the image grid (Figs 9, 10)."""
  fig, axes = plt.subplots(1, len(tokens), figsize=(3.2 * len(tokens), 3), squeeze=False)
  for ax, t in zip(axes[0], tokens):
    im = ax.imshow(tok_patch[t].reshape(grid), cmap="magma", vmin=0, vmax=1)
    ty, tx = divmod(t, grid[1])
    ax.plot(tx, ty, "c+", ms=10)
    ax.set_title(f"token {t} ({ty},{tx})", fontsize=8)
    ax.axis("off")
  fig.colorbar(im, ax=list(axes[0]), label="CKA with input patch")
  fig.suptitle(title, fontsize=9)
  save_figure(fig, path)


def head_subsets(distance: np.ndarray, cka: np.ndarray, layers: Sequence[str], vit_label: str,
                 res_label: str, path: str) -> None:
  """CKA of each head subset against each ResNet layer vs the subset's distance (Fig 5)."""
  fig, ax = plt.subplots(figsize=(5.5, 4))
  for j, name in enumerate(layers):
    ax.plot(distance, cka[:, j], "o-", ms=4, label=f"{res_label} {name}")
  ax.set_xlabel("mean attention distance of the head subset (px)")
  ax.set_ylabel("CKA")
  ax.set_title(f"Head subsets of {vit_label}", fontsize=9)
  ax.legend(fontsize=6)
  save_figure(fig, path)


FEATURE_LABELS = {"cls": "CLS token", "first": "first token", "spatial_mean": "mean except CLS",
                  "mean": "mean over tokens/positions", "final_grid": "pooled to last grid",
                  "each": "per token (spatial mean)"}


def probe_depth(models: dict, labels: dict[str, str], title: str, path: str) -> None:
  """Probe accuracy against relative depth, a line per model and feature (Figs 13, F.1, F.2)."""
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for name, by_feature in models.items():
    for how, e in by_feature.items():
      depth = (np.arange(len(e["points"])) + 1) / len(e["points"])
      acc, std = 100 * np.asarray(e["accuracy"]), 100 * np.asarray(e["std_over_seeds"])
      line, = ax.plot(depth, acc, "o-", ms=3, label=f"{labels[name]}: {FEATURE_LABELS[how]}")
      ax.fill_between(depth, acc - std, acc + std, color=line.get_color(), alpha=0.2, lw=0)
  ax.set_xlabel("relative depth (point / number of points)")
  ax.set_ylabel("test accuracy (%)")
  ax.set_ylim(0, 100)
  ax.grid(alpha=0.3)
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=7)
  save_figure(fig, path)


def probe_tokens(points: Sequence[tuple[str, np.ndarray, Sequence[int] | None]], prefix: int,
                 title: str, path: str, panels: int = 6) -> None:
  """Per-token probe accuracy on the token grid for some points (Fig D.4), and the
  mean over spatial tokens (and the class token) at every point (Fig 11)."""
  chosen = sorted({round(i) for i in np.linspace(0, len(points) - 1, min(panels, len(points)))})
  fig, axes = plt.subplots(1, len(chosen) + 1, figsize=(2.7 * (len(chosen) + 1), 3.1),
                           squeeze=False, layout="constrained",
                           gridspec_kw={"width_ratios": [1] * len(chosen) + [1.6]})
  for ax, i in zip(axes[0], chosen):
    name, acc, grid = points[i]
    spatial = 100 * acc[prefix:]
    im = ax.imshow(spatial.reshape(grid) if grid else spatial[None], cmap="viridis")
    ax.set_title(f"{name}\n{spatial.min():.1f}-{spatial.max():.1f}%", fontsize=7)
    ax.axis("off")
    fig.colorbar(im, ax=ax, shrink=0.8).ax.tick_params(labelsize=6)
  ax = axes[0][-1]
  x = np.arange(len(points))
  ax.plot(x, [100 * a[prefix:].mean() for _, a, _ in points], "o-", ms=3, label="spatial tokens (mean)")
  if prefix:
    ax.plot(x, [100 * a[0] for _, a, _ in points], "s-", ms=3, label="CLS token")
  ax.set_xticks(x, [n for n, _, _ in points], rotation=90, fontsize=6)
  ax.set_ylabel("test accuracy (%)", fontsize=8)
  ax.legend(fontsize=6)
  ax.grid(alpha=0.3)
  fig.suptitle(title, fontsize=9)
  save_figure(fig, path)


def reference_lines(lines: dict[str, tuple[Sequence[str], np.ndarray]], reference: str, title: str,
                    path: str) -> None:
  """CKA of each layer with the same layer of a reference model, a line per model
  (Fig 12: a line per data fraction; Fig G.1: before vs after fine-tuning)."""
  fig, ax = plt.subplots(figsize=(7.5, 4.2))
  names: Sequence[str] = []
  for i, (label, (names_, values)) in enumerate(lines.items()):
    ax.plot(np.arange(len(values)), values, "os^vDP*X"[i % 8] + "-", ms=4, label=label)
    names = names_ if len(names_) > len(names) else names
  xi, xl = _ticks(names, max_ticks=24)
  ax.set_xticks(xi, xl, rotation=90, fontsize=7)
  ax.set_xlabel(f"layer (same name in {reference})")
  ax.set_ylabel(f"CKA with {reference}")
  ax.set_ylim(0, 1.02)
  ax.grid(alpha=0.3)
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=8)
  save_figure(fig, path)


def accuracy_drop(accuracy: dict[str, float], reference: str, examples: int, path: str) -> None:
  """Top-1 accuracy lost against the reference model, a bar per model (Fig 8)."""
  labels = [k for k in accuracy if k != reference]
  drops = [100 * (accuracy[reference] - accuracy[k]) for k in labels]
  fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(labels) + 1.5), 3.8))
  bars = ax.bar(range(len(labels)), drops, color="C3")
  ax.bar_label(bars, [f"{d:+.1f}" for d in drops], fontsize=8)
  ax.axhline(0, color="black", lw=0.8)
  ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
  ax.set_ylabel("top-1 accuracy drop (points)")
  ax.set_title(f"Accuracy lost against {reference} ({100 * accuracy[reference]:.1f}%)\n"
               f"on {examples} examples", fontsize=10)
  ax.margins(y=0.15)
  save_figure(fig, path)
