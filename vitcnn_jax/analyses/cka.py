"""Minibatch CKA within and across any number of models (paper Figs 1, 2, B.1).

Protocol (paper, Appendix A): `num_examples` examples sampled without
replacement, minibatches of `batch_size`, HSIC accumulated over minibatches;
repeated `repeats` times with a new sample each time; mean and standard
deviation over repeats. Each device processes whole minibatches and the HSIC
matrices are summed with a psum, so 1 and N devices give the same result.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from vitcnn_jax import declaration
from vitcnn_jax import hsic
from vitcnn_jax import plotting
from vitcnn_jax import protocol
from vitcnn_jax import results

DEFAULTS = {  # the paper's protocol (Appendix A)
    "num_examples": 10240,  # sampled without replacement each repeat
    "batch_size": 1024,  # the HSIC minibatch (per device, or per group of devices)
    "repeats": 20,  # mean and standard deviation over repeats
    "seed": 0,
}
DEMO_HINT = (", or run the offline demo: python main.py "
             "--config=configs/cka_vit_resnet.py:demo --workdir=/tmp/cka_demo")


class CKA(protocol.HsicPass, protocol.Analysis):
  """One pass per repeat: the HSIC of every pair of layers of every model."""

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    if config.repeats < 1:
      raise ValueError(f"config.repeats={config.repeats} must be >= 1.")
    self.config, self.models = config, list(models.values())
    self.repeats = config.repeats
    self.points = {k: m.names for k, m in models.items()}
    self.names = [n for m in self.models for n in m.names]

  def step(self, forward, labels, mask) -> dict:
    del labels
    acts = []
    for key, names in self.points.items():
      out = forward(key)
      acts += [out[n] for n in names]
    return forward.minibatch_sums(acts, mask)

  def finalize(self, sums):
    n = self.config.num_examples
    per_repeat = np.asarray([hsic.cka_from_hsic(s["hsic"], self.names, s["moments"] / n)
                             for s in sums[0]])
    return arrays_and_summary(self.config, self.models, per_repeat)

  def plot(self, arrays, summary, workdir: str) -> None:
    plot_heatmaps(self.config, self.models, arrays, workdir)


def blocks(models: list) -> list[tuple[str, object, object, slice, slice]]:
  """(tag, model a, model b, rows, columns) for every pair a, b with a not after b;
  tag "vit_resnet" for models named vit and resnet."""
  spans, start = [], 0
  for m in models:
    spans.append(slice(start, start + len(m.names)))
    start += len(m.names)
  return [(f"{a.name}_{b.name}", a, b, spans[i], spans[j])
          for i, a in enumerate(models) for j, b in enumerate(models[i:], i)]


def _off_diagonal(m: np.ndarray) -> float:
  return float(m[~np.eye(len(m), dtype=bool)].mean()) if len(m) > 1 else float("nan")


def _lower_half_match(cross: np.ndarray) -> float:
  """Mean relative depth (0 first layer, 1 last) of the column layer most similar
  to each layer of the lower half of the rows."""
  best = cross[:max(1, len(cross) // 2)].argmax(axis=1)
  return float(np.mean(best / max(1, cross.shape[1] - 1)))


def arrays_and_summary(config, models, per_repeat: np.ndarray):
  mean, std = per_repeat.mean(axis=0), per_repeat.std(axis=0)
  pairs = blocks(models)
  attention = {m.name: bool(m.model.attention()) for m in models}
  summary = {
      "analysis": "cka",
      "models": {m.name: {"label": m.label, "checkpoint": m.path, "layers": m.names,
                          "attention": attention[m.name], "tokens": m.model.grid is not None}
                 for m in models},
      "num_examples": config.num_examples, "batch_size": config.batch_size,
      "repeats": config.repeats, "devices": jax.device_count(),
      "files": {"npz": "cka.npz", **{f"heatmap_{t}": f"cka_{t}.png" for t, *_ in pairs}},
      "mean_cka": {t: float(mean[r, c].mean()) for t, _, _, r, c in pairs},
      "mean_off_diagonal_cka": {a.name: _off_diagonal(mean[r, c]) for _, a, b, r, c in pairs if a is b},
      # Fig 2: for a model without tokens (a CNN) and one with attention (a ViT).
      "lower_half_best_match": {
          f"{cnn.name}_in_{vit.name}": _lower_half_match(mean[rc, rv])
          for _, a, b, r, c in pairs if a is not b
          for cnn, vit, rc, rv in ((a, b, r, c), (b, a, c, r))
          if cnn.model.grid is None and attention[vit.name]},
      "max_std_over_repeats": float(std.max()),
  }
  arrays = {f"cka_{t}": mean[r, c] for t, _, _, r, c in pairs}
  arrays.update({f"std_{t}": std[r, c] for t, _, _, r, c in pairs})
  arrays.update({f"names_{m.name}": np.asarray(m.names) for m in models})
  arrays["per_repeat"] = per_repeat
  return arrays, summary


def plot_heatmaps(config, models, arrays, workdir: str, only: list[str] | None = None) -> None:
  for t, a, b, _, _ in blocks(models):
    if only is not None and t not in only:
      continue
    title = f"CKA: {a.label} vs {b.label}" if a is not b else f"CKA within {a.label}"
    plotting.cka_heatmap(arrays[f"cka_{t}"], a.names, b.names, row_label=a.label, col_label=b.label,
                         title=f"{title}\n{plotting.protocol(config.num_examples, config.repeats)}",
                         path=results.workdir_path(workdir, f"cka_{t}.png"))


def _uniformity(s: dict) -> declaration.Verdict:
  within = {k: (m, s["mean_off_diagonal_cka"][k]) for k, m in s["models"].items()}
  return declaration.above({m["label"]: v for m, v in within.values() if m["attention"]},
                           {m["label"]: v for m, v in within.values() if not m["tokens"]})


def _lower_half(s: dict) -> declaration.Verdict:
  match = s["lower_half_best_match"]
  if not match:
    return None
  return (all(v <= 1 / 3 for v in match.values()),
          ", ".join(f"{k.replace('_in_', ' in ')}: best matches at relative depth {v:.2f}"
                    for k, v in match.items()))


def key_numbers(s: dict) -> list[tuple[str, str]]:
  return ([(f"mean CKA {k}", f"{v:.3f}") for k, v in s["mean_cka"].items()]
          + [(f"mean off-diagonal CKA within {k}", f"{v:.3f}")
             for k, v in s["mean_off_diagonal_cka"].items()]
          + [("largest std over repeats", f"{s['max_std_over_repeats']:.4f}")])


DECLARATION = declaration.Declaration(
    name="cka", build=CKA, models=declaration.Models(any_names=True), defaults=DEFAULTS,
    figures="Figs 1, 2, B.1", hsic_minibatches=True, hint=DEMO_HINT, key_numbers=key_numbers,
    findings=(
        declaration.Finding(
            "ViT representations are more uniform across depth than a ResNet's: CKA between "
            "ViT layers stays high over most of the network, while the ResNet shows a "
            "stage-wise block structure (here: the mean off-diagonal CKA within every model "
            "with attention is above that within every model without tokens).", _uniformity),
        declaration.Finding(
            "Across models, the lower half of the ResNet matches about the lowest quarter of "
            "the ViT (here: the ViT layer most similar to each layer of the ResNet's lower "
            "half lies, on average, in the ViT's lowest third).", _lower_half)))
