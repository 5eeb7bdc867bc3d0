"""Each layer's share of variance in its first principal component.

Nguyen, Raghu and Kornblith (2022) trace the block structure of CKA maps to a
few dominant datapoints that also dominate the first principal component of the
layers inside the block. Within each minibatch, the share is the largest
eigenvalue of the layer's Gram of centred features (the covariance's, times n)
over its trace; the estimate is the mean of the minibatches' shares, with their
spread. The share of n examples in D > n dimensions is biased upward, less so
for larger minibatches: compare layers and models at one `batch_size`. It uses
the Grams that minibatch CKA forms, so each minibatch must lie on one device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax import declaration
from vitcnn_jax import hsic
from vitcnn_jax import plotting
from vitcnn_jax import protocol
from vitcnn_jax import results

DEFAULTS = {
    "num_examples": 10240,  # as minibatch CKA (Appendix A): 10 minibatches ...
    "batch_size": 1024,  # ... of 1,024, each an estimate of every layer's share
    "seed": 0,
}


def share(a: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(top eigenvalue / trace of the centred Gram of one minibatch's valid rows,
  1 if the layer varies over them beyond float32 rounding else 0)."""
  gram, mean, _ = hsic.scaled_gram(a, mask)  # scaled by a power of two: the ratio is exact
  trace = jnp.trace(gram)
  floor = mask.sum() * jnp.sum(jnp.square(mean)) * (hsic.NOISE * hsic.U32) ** 2
  varies = (trace > floor) & (mask.sum() >= 2)
  top = jnp.linalg.eigvalsh(gram)[-1]
  return jnp.where(varies, top / jnp.where(varies, trace, 1.0), 0.0), varies.astype(jnp.float32)


class PcShare(protocol.Analysis):
  """One pass: per layer, the sum over minibatches of the share and its square."""

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    self.config, self.models = config, models
    self.points = {k: m.names for k, m in models.items()}

  def step(self, forward, labels, mask) -> dict:
    del labels
    if forward.grouped:
      raise ValueError("pc_share takes each minibatch's Gram on one device; set "
                       "config.devices_per_minibatch=1 (or a smaller config.batch_size).")
    sums = {}
    for k, names in self.points.items():
      out = forward(k)
      got = [share(out[n], mask) for n in names]
      s, counted = (jnp.stack(v) for v in zip(*got))
      sums.update({f"{k}/share": s, f"{k}/share_sq": s * s, f"{k}/minibatches": counted})
    return sums

  def finalize(self, sums):
    s = sums[0][0]
    arrays, summary = {}, {"analysis": "pc_share", "num_examples": self.config.num_examples,
                           "batch_size": self.config.batch_size, "models": {}}
    for k, m in self.models.items():
      count = s[f"{k}/minibatches"]
      constant = [n for n, c in zip(m.names, count) if not c]
      if constant:
        raise FloatingPointError(f"pc_share: {m.key} layers {constant} are constant over every "
                                 "minibatch, so they have no principal components. Are the "
                                 "images identical or blank?")
      mean = s[f"{k}/share"] / count
      std = np.sqrt(np.maximum(s[f"{k}/share_sq"] / count - mean ** 2, 0.0))
      arrays.update({f"share_{k}": mean, f"std_{k}": std, f"names_{k}": np.asarray(m.names)})
      summary["models"][k] = {"label": m.label, "checkpoint": m.path, "layers": m.names,
                              "share": mean.tolist(), "std_over_minibatches": std.tolist(),
                              "minibatches": int(count.max())}
    return arrays, summary

  def plot(self, arrays, summary, workdir: str) -> None:
    labels = {k: m.label for k, m in self.models.items()}
    plotting.layer_lines(
        {labels[k]: (list(arrays[f"names_{k}"]), arrays[f"share_{k}"]) for k in self.models},
        "share of variance in the first PC",
        f"Each layer's first principal component, minibatches of {self.config.batch_size:,}\n"
        f"{self.config.num_examples:,} examples (band: +-1 sd over minibatches)",
        results.workdir_path(workdir, "pc_share.png"),
        spread={labels[k]: arrays[f"std_{k}"] for k in self.models})


def _dominant(s: dict) -> declaration.Verdict:
  top = {e["label"]: max(e["share"]) for e in s["models"].values()}
  return any(v > 0.5 for v in top.values()), ", ".join(f"{k}: largest {v:.2f}" for k, v in top.items())


def key_numbers(s: dict) -> list[tuple[str, str]]:
  return [(f"{e['label']}: share, lowest / highest layer", f"{min(e['share']):.3f} / {max(e['share']):.3f}")
          for e in s["models"].values()]


DECLARATION = declaration.Declaration(
    name="pc_share", build=PcShare, models=declaration.Models(any_names=True), defaults=DEFAULTS,
    figures="beside Figs 1, 2 (Nguyen, Raghu & Kornblith 2022)", hsic_minibatches=True,
    key_numbers=key_numbers,
    findings=(declaration.Finding(
        "Block structure in a CKA map comes with a dominant first principal component: one "
        "direction carries much of the variance of the layers inside the block (here: some "
        "layer's first component carries more than half of its variance).", _dominant),))
