"""Per-layer and per-model numbers of several models: a line per model over its
layers (paper Fig 12, Fig G.1, the first principal component's share) and the
accuracy each model lost against a reference (Fig 8)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import style


@axes.styled
def layer_lines(lines: dict[str, tuple[Sequence[str], np.ndarray]], ylabel: str, title: str,
                path: str, figures: style.Figures, spread: dict[str, np.ndarray] | None = None,
                ylim: tuple[float, float] | None = (0, 1.02)) -> axes.Figure:
  """A per-layer quantity, a line per model over its layers (by block), with an
  optional band of +-`spread`; models with other layers get a panel of their own
  (Fig 12: CKA with the reference, a line per data fraction; Fig G.1: before vs
  after fine-tuning; the first principal component's share per model)."""
  panels: dict[tuple[str, ...], list[str]] = {}
  for label, (names, _) in lines.items():  # models whose layers are a prefix of another's share it
    key = next((k for k in panels if tuple(names) == k[:len(names)] or k == tuple(names)[:len(k)]),
               tuple(names))
    panels.setdefault(key, []).append(label)
  fig = axes.Figure(figsize=(7.5 if len(panels) == 1 else 5.2 * len(panels), 4.4), layout="constrained")
  row = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
  marker = iter("os^vDP*X" * len(lines))
  for ax, labels in zip(row, panels.values()):
    names: Sequence[str] = []
    for label in labels:
      names_, values = lines[label]
      x = np.arange(len(values))
      ax.plot(x, values, next(marker) + "-", ms=4, label=label)
      if spread is not None and label in spread:
        ax.fill_between(x, values - spread[label], values + spread[label], alpha=0.2, lw=0)
      names = names_ if len(names_) > len(names) else names
    unit = axes.block_axis(ax, names, "x", edges="0.8")
    ax.set_xlabel(f"layer, by {unit} ({len(names)} layers)")
    if ylim is not None:
      ax.set_ylim(*ylim)
    ax.legend()
    if len(panels) > 1:
      ax.set_title(", ".join(labels))
  row[0].set_ylabel(ylabel)
  (fig.suptitle if len(panels) > 1 else row[0].set_title)(title)
  return style.save_figure(fig, path, figures)


@axes.styled
def accuracy_drop(accuracy: dict[str, float], reference: str, examples: int, path: str,
                  figures: style.Figures) -> axes.Figure:
  """Top-1 accuracy lost against the reference model, a bar per model (Fig 8)."""
  labels = [k for k in accuracy if k != reference]
  drops = [100 * (accuracy[reference] - accuracy[k]) for k in labels]
  fig = axes.Figure(figsize=(max(4.5, 1.1 * len(labels) + 1.5), 3.8), layout="constrained")
  ax = fig.subplots()
  bars = ax.bar(range(len(labels)), drops, color="C3")
  ax.bar_label(bars, [f"{d:+.1f}" for d in drops])
  ax.axhline(0, color="black", lw=0.8)
  ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
  ax.set_ylabel("top-1 accuracy drop (points)")
  ax.set_title(f"Accuracy lost against {reference} ({100 * accuracy[reference]:.1f}%)\n"
               f"on {examples} examples")
  ax.margins(y=0.15)
  return style.save_figure(fig, path, figures)
