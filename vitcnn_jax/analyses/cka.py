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

from vitcnn_jax import hsic
from vitcnn_jax import plotting
from vitcnn_jax import results

DEMO_HINT = (", or run the offline demo: python main.py "
             "--config=configs/cka_vit_resnet.py:demo --workdir=/tmp/cka_demo")


MODELS = None  # any number of models, under any names
HSIC_MINIBATCHES = True
HINT = DEMO_HINT


class CKA:
  """One pass per repeat: the HSIC of every pair of layers of every model."""
  name, title, labels = "cka", "CKA", False

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    if config.repeats < 1:
      raise ValueError(f"config.repeats={config.repeats} must be >= 1.")
    self.config, self.models = config, list(models.values())
    self.repeats = config.repeats
    self.points = {k: m.names for k, m in models.items()}
    self.names = [n for m in self.models for n in m.names]

  def passes(self):
    return [self]

  def step(self, forward, labels, mask) -> dict:
    del labels
    acts = []
    for key, names in self.points.items():
      out = forward(key)
      acts += [out[n] for n in names]
    return forward.minibatch_sums(acts, mask)

  host_sums = staticmethod(hsic.unscale)

  def finalize(self, sums):
    n = self.config.num_examples
    per_repeat = np.asarray([hsic.cka_from_hsic(s["hsic"], self.names, s["moments"] / n)
                             for s in sums[0]])
    return _arrays_and_summary(self.config, self.models, per_repeat)

  def plot(self, arrays, summary, workdir: str) -> None:
    _plot(self.config, self.models, arrays, workdir)


build = CKA


def _blocks(models):
  """(tag, model a, model b, rows, columns) for every pair a, b with a not after b;
  tag "vit_resnet" for models named vit and resnet."""
  spans, start = [], 0
  for m in models:
    spans.append(slice(start, start + len(m.names)))
    start += len(m.names)
  out = []
  for i, a in enumerate(models):
    for j, b in enumerate(models[i:], i):
      out.append((f"{a.name}_{b.name}", a, b, spans[i], spans[j]))
  return out


def _arrays_and_summary(config, models, per_repeat: np.ndarray):
  mean, std = per_repeat.mean(axis=0), per_repeat.std(axis=0)
  blocks = _blocks(models)
  summary = {
      "analysis": "cka",
      "models": {m.name: {"label": m.label, "checkpoint": m.path, "layers": m.names}
                 for m in models},
      "num_examples": config.num_examples, "batch_size": config.batch_size,
      "repeats": config.repeats, "devices": jax.device_count(),
      "files": {"npz": "cka.npz", **{f"heatmap_{t}": f"cka_{t}.png" for t, *_ in blocks}},
      "mean_cka": {t: float(mean[r, c].mean()) for t, _, _, r, c in blocks},
      "max_std_over_repeats": float(std.max()),
  }
  arrays = {f"cka_{t}": mean[r, c] for t, _, _, r, c in blocks}
  arrays.update({f"std_{t}": std[r, c] for t, _, _, r, c in blocks})
  arrays.update({f"names_{m.name}": np.asarray(m.names) for m in models})
  arrays["per_repeat"] = per_repeat
  return arrays, summary


def _plot(config, models, arrays, workdir: str, only: list[str] | None = None) -> None:
  for t, a, b, _, _ in _blocks(models):
    if only is not None and t not in only:
      continue
    title = f"CKA: {a.label} vs {b.label}" if a is not b else f"CKA within {a.label}"
    plotting.cka_heatmap(arrays[f"cka_{t}"], a.names, b.names, row_label=a.label, col_label=b.label,
                         title=f"{title}\n{plotting.protocol(config.num_examples, config.repeats)}",
                         path=results.workdir_path(workdir, f"cka_{t}.png"))
