"""A family of models against one reference model (paper Figs 8, 12 and G.1).

The CKA job of `cka` over every model, and then, for each model, the CKA of each
of its layers with the same-named layer of `config.reference` (Fig 12: one line
per data fraction; G.1: before vs after fine-tuning; Fig 8: without the skip of
block k vs the full model). With `config.accuracy`, a second pass over every
example of the data gives each model's top-1 accuracy and its drop from the
reference's (Fig 8's table).
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from vitcnn_jax import plotting
from vitcnn_jax import results
from vitcnn_jax.analyses import cka

MODELS = None
HSIC_MINIBATCHES = True
HINT = cka.DEMO_HINT


class Accuracy:
  """Top-1 hits of every model on every example of the data, in one pass."""
  title, repeats, labels = "accuracy", 1, True

  def __init__(self, models: dict):
    self.models = models
    self.points = {k: () for k in models}

  def examples(self, repeat: int, sources) -> tuple[str, np.ndarray]:
    del repeat
    source = sources["data"]
    for m in self.models.values():
      if m.model.num_classes != source.num_classes:
        raise ValueError(f"config.accuracy: {m.key} ({m.path}) has "
                         f"{m.model.num_classes or 'no'} output classes but {source.name} has "
                         f"{source.num_classes}; set config.accuracy=False or use data it was "
                         "trained for.")
    return "data", np.arange(len(source))

  def step(self, forward, labels, mask) -> dict:
    hits = {f"hits/{k}": ((forward.logits(k).argmax(-1) == labels) * mask).sum() for k in self.points}
    return {**hits, "count": mask.sum()}


class ReferenceCKA(cka.CKA):
  name, title = "reference_cka", "CKA"

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    super().__init__(config, models)
    if config.reference not in models:
      raise ValueError(f"config.reference={config.reference!r} is not one of the models "
                       f"{sorted(models)}.")
    self.reference = models[config.reference]
    for m in self.models:
      if not set(m.names) & set(self.reference.names):
        raise ValueError(f"config.{m.key}: none of its layers {m.names[:3]}... is among the "
                         f"reference's ({self.reference.key}); capture the same points.")
    self.accuracy = Accuracy(models) if config.accuracy else None

  def passes(self):
    return [self] + ([self.accuracy] if self.accuracy else [])

  def finalize(self, sums):
    arrays, summary = super().finalize(sums)
    summary["analysis"] = self.name
    summary["files"] = {"npz": f"{self.name}.npz", "lines": "reference_cka.png",
                        **({"accuracy": "accuracy.png"} if self.accuracy else {}),
                        **{f"heatmap_{t}": f"cka_{t}.png" for t in self._shown()}}
    summary["reference"] = self.reference.name
    mean = arrays["per_repeat"].mean(axis=0)
    start = {m.name: sum(len(o.names) for o in self.models[:i]) for i, m in enumerate(self.models)}
    ref = self.reference
    summary["same_layer_cka"] = {}
    for m in self.models:
      common = [n for n in ref.names if n in m.names]
      values = [mean[start[m.name] + m.names.index(n), start[ref.name] + ref.names.index(n)]
                for n in common]
      arrays[f"same_layer_{m.name}"] = np.asarray(values)
      arrays[f"same_layer_names_{m.name}"] = np.asarray(common)
      summary["same_layer_cka"][m.name] = dict(zip(common, map(float, values)))
    if self.accuracy:
      s = sums[1][0]
      acc = {m.name: float(s[f"hits/{m.name}"] / s["count"]) for m in self.models}
      summary["accuracy"] = acc
      summary["accuracy_drop_points"] = {k: 100 * (acc[ref.name] - v) for k, v in acc.items()}
      summary["accuracy_examples"] = int(s["count"])
      arrays["accuracy"] = np.asarray([acc[m.name] for m in self.models])
      if jax.process_index() == 0:
        print(accuracy_table(self.models, acc, ref.name))
    return arrays, summary

  def _shown(self) -> list[str]:
    """The heatmaps drawn: each model within itself and against the reference."""
    ref = self.reference.name
    return [t for t, a, b, _, _ in cka._blocks(self.models) if a is b or ref in (a.name, b.name)]

  def plot(self, arrays, summary, workdir: str) -> None:
    shown = self._shown()
    cka._plot(self.config, self.models, arrays, workdir, only=shown)
    ref = self.reference
    lines = {m.label: (list(arrays[f"same_layer_names_{m.name}"]), arrays[f"same_layer_{m.name}"])
             for m in self.models if m is not ref}
    plotting.reference_lines(
        lines, ref.label, f"CKA of each layer with the same layer of {ref.label}\n"
        + plotting.protocol(self.config.num_examples, self.config.repeats),
        results.workdir_path(workdir, "reference_cka.png"))
    if self.accuracy:
      plotting.accuracy_drop({m.label: summary["accuracy"][m.name] for m in self.models}, ref.label,
                             summary["accuracy_examples"],
                             results.workdir_path(workdir, "accuracy.png"))


def accuracy_table(models, acc: dict[str, float], reference: str) -> str:
  rows = [f"{'model':<32} {'top-1 (%)':>9} {'drop (points)':>13}"]
  for m in models:
    rows.append(f"{m.label:<32} {100 * acc[m.name]:9.2f} {100 * (acc[reference] - acc[m.name]):13.2f}")
  return "\n".join(rows)


build = ReferenceCKA
