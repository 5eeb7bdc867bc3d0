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

from vitcnn_jax.analyses import cka
from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import cka as cka_figures
from vitcnn_jax.plotting import lines
from vitcnn_jax.plotting import style
from vitcnn_jax.run import accuracy as accuracy_lib
from vitcnn_jax.run import declaration
from vitcnn_jax.run import results

DEFAULTS = {  # the CKA protocol of the paper (Appendix A), as `cka`'s
    "num_examples": 10240,
    "batch_size": 1024,
    "repeats": 20,
    "seed": 0,
    "reference": "",  # the model (name or label) every other one is compared with
    "accuracy": False,  # also top-1 accuracy of every model on every example of the data
}


class ReferenceCKA(cka.CKA):

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    super().__init__(config, models)
    ref = [m for m in self.models if config.reference in (m.name, m.label)]
    if not ref:
      raise ValueError(f"config.reference={config.reference!r} is not one of the models "
                       f"{sorted(models)} (names or labels).")
    self.reference = ref[0]
    for m in self.models:
      if not set(m.names) & set(self.reference.names):
        raise ValueError(f"config.{m.key}: none of its layers {m.names[:3]}... is among the "
                         f"reference's ({self.reference.key}); capture the same points.")
    self.accuracy = accuracy_lib.Accuracy(models) if config.accuracy else None

  def passes(self):
    return [self] + ([self.accuracy] if self.accuracy else [])

  def finalize(self, sums):
    arrays, summary = super().finalize(sums)
    summary["analysis"] = "reference_cka"
    summary["files"] = {"npz": "reference_cka.npz", "lines": "reference_cka.png",
                        **({"accuracy": "accuracy.png"} if self.accuracy else {}),
                        **{f"heatmap_{t}": f"cka_{t}.png" for t in self._shown()}}
    summary["reference"] = self.reference.name
    for m in self.models:  # which of its blocks each model lacks the skip connections of
      residuals = m.model.residuals()
      summary["models"][m.name].update(
          blocks=list(dict.fromkeys(r.block for r in residuals)),
          without_skip=list(dict.fromkeys(r.block for r in residuals if not r.has_skip)))
    mean = arrays["per_repeat"].mean(axis=0)
    start = {m.name: sum(len(o.names) for o in self.models[:i]) for i, m in enumerate(self.models)}
    ref = self.reference
    summary["same_layer_cka"] = {}
    for m in self.models:
      shared = [n for n in ref.names if n in m.names]
      values = [mean[start[m.name] + m.names.index(n), start[ref.name] + ref.names.index(n)]
                for n in shared]
      arrays[f"same_layer_{m.name}"] = np.asarray(values)
      arrays[f"same_layer_names_{m.name}"] = np.asarray(shared)
      summary["same_layer_cka"][m.name] = dict(zip(shared, map(float, values)))
    if self.accuracy:
      s = sums[1][0]
      acc = {m.name: accuracy_lib.Accuracy.of(s, m.name) for m in self.models}
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
    return [t for t, a, b, _, _ in cka.blocks(self.models) if a is b or ref in (a.name, b.name)]

  def plot(self, arrays, summary, workdir: str, figures: style.Figures) -> list:
    subtitle = axes.protocol(self.config.num_examples, self.config.repeats)
    out = cka_figures.heatmaps(cka.blocks(self.models), arrays, subtitle, workdir, figures, only=self._shown())
    ref = self.reference
    same = {m.label: (list(arrays[f"same_layer_names_{m.name}"]), arrays[f"same_layer_{m.name}"])
            for m in self.models if m is not ref}
    out.append(lines.layer_lines(
        same, f"CKA with {ref.label}", f"CKA of each layer with the same layer of {ref.label}\n{subtitle}",
        results.workdir_path(workdir, "reference_cka.png"), figures))
    if self.accuracy:
      out.append(lines.accuracy_drop({m.label: summary["accuracy"][m.name] for m in self.models}, ref.label,
                                     summary["accuracy_examples"],
                                     results.workdir_path(workdir, "accuracy.png"), figures))
    return out


def accuracy_table(models, acc: dict[str, float], reference: str) -> str:
  rows = [f"{'model':<32} {'top-1 (%)':>9} {'drop (points)':>13}"]
  for m in models:
    rows.append(f"{m.label:<32} {100 * acc[m.name]:9.2f} {100 * (acc[reference] - acc[m.name]):13.2f}")
  return "\n".join(rows)


def _others(s: dict) -> dict[str, dict[str, float]]:
  return {k: v for k, v in s["same_layer_cka"].items() if k != s["reference"]}


def _falls_with_depth(s: dict) -> declaration.Verdict:
  """Each model's CKA with the reference is higher in its first layer than in its last."""
  lines = {k: list(v.values()) for k, v in _others(s).items()}
  if not lines:
    return None
  return (all(v[0] > v[-1] for v in lines.values()),
          ", ".join(f"{s['models'][k]['label']}: {v[0]:.2f} -> {v[-1]:.2f}" for k, v in lines.items()))


def _middle_costs_most(s: dict) -> declaration.Verdict:
  """Among models without the skip connections of one block, with accuracy: the
  largest drop belongs to a block that is neither the first nor the last."""
  models = s["models"]
  drops = {k: v for k, v in s.get("accuracy_drop_points", {}).items()
           if len(models[k].get("without_skip", ())) == 1}
  if len(drops) < 3:
    return None
  worst = models[max(drops, key=drops.get)]
  position = worst["blocks"].index(worst["without_skip"][0])
  return (0 < position < len(worst["blocks"]) - 1,
          ", ".join(f"{models[k]['label']}: {v:.2f}" for k, v in drops.items()))


def key_numbers(s: dict) -> list[tuple[str, str]]:
  out = [(f"{s['models'][k]['label']}: CKA with {s['reference']}, first / last layer",
          f"{list(v.values())[0]:.3f} / {list(v.values())[-1]:.3f}") for k, v in _others(s).items()]
  out += [(f"{s['models'][k]['label']}: top-1 (%)", f"{100 * v:.2f}")
          for k, v in s.get("accuracy", {}).items()]
  return out


DECLARATION = declaration.Declaration(
    name="reference_cka", build=ReferenceCKA, models=declaration.Models(any_names=True),
    defaults=DEFAULTS, figures="Figs 8, 12, G.1", hsic_minibatches=True, hint=cka.DEMO_HINT,
    key_numbers=key_numbers,
    findings=(
        declaration.Finding(
            "Lower layers stay similar to the reference's and the similarity falls with depth: "
            "models trained on a fraction of the data (Fig 12), fine-tuned (Fig G.1) or without "
            "one block's skip connection (Fig 8) resemble the reference most in their lowest "
            "layers (here: every model's CKA with the reference is higher at its first "
            "layer than at its last).", _falls_with_depth),
        declaration.Finding(
            "Removing a middle block's skip connection costs the most accuracy (Fig 8, about "
            "4% for ViT-B/32; here: among models without one block's skip connections, the "
            "largest drop is at neither the first nor the last block).", _middle_costs_most)))
