"""Top-1 accuracy as a pass over data: one place computes it, for the
`reference_cka` analysis (Fig 8's table) and for training's test accuracy."""

from __future__ import annotations

import jax
import numpy as np

from vitcnn_jax.inputs import data
from vitcnn_jax.run import protocol


class Accuracy(protocol.Pass):
  """Top-1 hits of every model on every example of the source "data", in one pass."""
  labels = True

  def __init__(self, models: dict):
    self.models = models
    self.points = {k: () for k in models}

  def examples(self, repeat: int, sources: dict[str, data.Source]) -> tuple[str, np.ndarray]:
    del repeat
    source = sources["data"]
    for m in self.models.values():
      if m.model.num_classes != source.num_classes:
        raise ValueError(f"config.accuracy: {m.key} ({m.path}) has "
                         f"{m.model.num_classes or 'no'} output classes but {source.name} has "
                         f"{source.num_classes}; set config.accuracy=False or use data it was "
                         "trained for.")
    return "data", np.arange(len(source))

  def step(self, forward: protocol.Forward, labels: jax.Array, mask: jax.Array) -> protocol.Sums:
    hits = {f"hits/{k}": ((forward.logits(k).argmax(-1) == labels) * mask).sum() for k in self.points}
    return {**hits, "count": mask.sum()}

  @staticmethod
  def of(sums: protocol.Sums, name: str) -> float:
    """Model `name`'s accuracy from the pass's sums."""
    return float(sums[f"hits/{name}"] / sums["count"])
