"""Each layer's share of variance in its first principal component, the examples
that dominate it, and CKA without them: a diagnostic of block structure.

Nguyen, Raghu and Kornblith (2022) trace the block structure of CKA maps to a
few dominant datapoints that also dominate the first principal component of the
layers inside the block, and show that it fades without them. Within each
minibatch, a layer's share is the largest eigenvalue of its Gram of centred
features (the covariance's, times n) over its trace; the estimate is the mean of
the minibatches' shares, with their spread. An example's dominance is, summed
over every layer of every model, the layer's share times the example's share of
the component (its loading squared). With `drop_fraction`, minibatch CKA is
computed in the same pass twice: with every example, and without each
minibatch's most dominant `drop_fraction` (the component is found within the
minibatch, so is dominance). The share of n examples in D > n dimensions is
biased upward, less so for larger minibatches: compare at one `batch_size`.
Each minibatch must lie on one device. The json names the most dominant
examples (their indices in the data); the scores, one float per example of the
sample, are in the npz.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax import similarity
from vitcnn_jax.analyses import cka
from vitcnn_jax.analyses import cka_findings
from vitcnn_jax.inputs import data
from vitcnn_jax.plotting import cka as cka_figures
from vitcnn_jax.plotting import lines
from vitcnn_jax.plotting import style
from vitcnn_jax.run import declaration
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results
from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import layer_checks
from vitcnn_jax.similarity import linear_cka
from vitcnn_jax.similarity import scales

DEFAULTS = {
    "num_examples": 10240,  # as minibatch CKA (Appendix A): 10 minibatches ...
    "batch_size": 1024,  # ... of 1,024, each an estimate of every layer's share
    "seed": 0,
    "drop_fraction": 0.0,  # > 0: also CKA with and without each minibatch's most dominant examples
}
SHOWN = 20  # dominant examples named in the json


def share(a: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(top eigenvalue / trace of the centred Gram of one minibatch's valid rows,
  1 if the layer varies over them beyond float32 rounding else 0, (n,) each
  example's share of the layer's variance on that component)."""
  gram, mean_sq, _ = grams.scaled_gram(a, mask)  # scaled by a power of two: the ratio is exact
  trace = jnp.trace(gram)
  floor = mask.sum() * mean_sq * (layer_checks.NOISE * layer_checks.U32) ** 2
  varies = (trace > floor) & (mask.sum() >= 2)
  values, vectors = jnp.linalg.eigh(gram)
  top = jnp.where(varies, values[-1] / jnp.where(varies, trace, 1.0), 0.0)
  return top, varies.astype(jnp.float32), top * jnp.square(vectors[:, -1]) * mask


def without_dominant(score: jax.Array, mask: jax.Array, fraction: float) -> jax.Array:
  """`mask` less the ceil(fraction x valid rows) rows of highest `score`."""
  drop = jnp.ceil(fraction * mask.sum())
  rank = jnp.argsort(jnp.argsort(jnp.where(mask > 0, -score, jnp.inf)))
  return mask * (rank >= drop)


class PcShare(protocol.Analysis):
  """One pass: per layer, the sum over minibatches of the share and its square;
  each example's dominance; with `drop_fraction`, the HSIC sums with and without
  each minibatch's dominant examples."""

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    if not 0 <= config.get("drop_fraction", 0.0) < 1:
      raise ValueError(f"config.drop_fraction={config.drop_fraction} must be in [0, 1).")
    self.config, self.models = config, models
    self.points = {k: m.names for k, m in models.items()}
    self.drop = config.get("drop_fraction", 0.0)
    self.sample = np.zeros(0, int)
    smallest = min(config.batch_size, config.num_examples % config.batch_size or config.batch_size)
    if self.drop and smallest - np.ceil(self.drop * smallest) < similarity.MIN_BATCH:
      raise ValueError(f"config.drop_fraction={self.drop} leaves the smallest minibatch ({smallest} "
                       f"examples) fewer than {similarity.MIN_BATCH}, too few for the unbiased HSIC; lower "
                       "it or choose num_examples and batch_size with larger minibatches.")

  def examples(self, repeat: int, sources) -> tuple[str, np.ndarray]:
    """The default sample, kept to name the dominant examples."""
    self.sample = data.sample(len(sources["data"]), self.config.num_examples, self.config.seed, repeat)
    return "data", self.sample

  def step(self, forward, labels, mask) -> dict:
    del labels
    if forward.grouped:
      raise ValueError("pc_share takes each minibatch's Gram on one device; set "
                       "config.devices_per_minibatch=1 (or a smaller config.batch_size).")
    sums, acts, score = {}, [], 0.0
    for k, names in self.points.items():
      out = forward(k)
      acts += [out[n] for n in names]
      got = [share(out[n], mask) for n in names]
      s, counted, weights = (jnp.stack(v) for v in zip(*got))
      sums.update({f"{k}/share": s, f"{k}/share_sq": s * s, f"{k}/minibatches": counted})
      score = score + weights.sum(axis=0)
    sums["rows/score"] = score
    if self.drop:
      keep = without_dominant(score, mask, self.drop)
      sums.update(forward.activation_sums(acts, mask))
      sums.update({f"without/{k}": v for k, v in forward.activation_sums(acts, keep).items()})
      sums["without/kept"] = keep.sum()
    return sums

  def host_sums(self, got: protocol.Sums) -> protocol.Sums:
    """Each set of HSIC sums unscaled by its own exponents."""
    plain = {k: v for k, v in got.items() if not k.startswith("without/")}
    without = {k[len("without/"):]: v for k, v in got.items() if k.startswith("without/")}
    plain, without = (scales.unscale(s, hsic.SCALES) for s in (plain, without))
    return {**plain, **{f"without/{k}": v for k, v in without.items()}}

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
                              "minibatches": int(count.max()),
                              "block_outputs": cka_findings.block_outputs(m).tolist()}  # the other layer set
    scores = s["rows/score"]
    top = np.argsort(-scores, kind="stable")[:SHOWN]
    arrays.update(scores=scores, sample=self.sample)
    summary["dominant_examples"] = [{"index": int(self.sample[i]), "score": float(scores[i])} for i in top]
    if self.drop:
      self._without(s, arrays, summary)
    return arrays, summary

  def _without(self, s: protocol.Sums, arrays: dict, summary: dict) -> None:
    """CKA of every pair of layers with and without the dominant examples."""
    models = list(self.models.values())
    names = [n for m in models for n in m.names]
    full = linear_cka.cka_from_hsic(s["hsic"], names, s["moments"] / self.config.num_examples)
    kept = linear_cka.cka_from_hsic(s["without/hsic"], names, s["without/moments"] / s["without/kept"])
    for t, _, _, r, c in cka.blocks(models):
      arrays[f"cka_{t}"], arrays[f"without_cka_{t}"] = full[r, c], kept[r, c]
    within = lambda m: {a.name: cka_findings.off_diagonal(m[r, c]) for _, a, b, r, c in cka.blocks(models) if a is b}
    summary.update(drop_fraction=self.drop, kept_examples=int(s["without/kept"]),
                   mean_off_diagonal_cka=within(full), mean_off_diagonal_cka_without=within(kept))

  def plot(self, arrays, summary, workdir: str, figures: style.Figures) -> list:
    labels = {k: m.label for k, m in self.models.items()}
    out = [lines.layer_lines(
        {labels[k]: (list(arrays[f"names_{k}"]), arrays[f"share_{k}"]) for k in self.models},
        "share of variance in the first PC",
        f"Each layer's first principal component, minibatches of {self.config.batch_size:,}\n"
        f"{self.config.num_examples:,} examples (band: +-1 sd over minibatches)",
        results.workdir_path(workdir, "pc_share.png"), figures,
        spread={labels[k]: arrays[f"std_{k}"] for k in self.models})]
    if not self.drop:
      return out
    without = f"without each minibatch's {100 * self.drop:g}% most dominant"
    for t, a, b, _, _ in cka.blocks(list(self.models.values())):
      pair = f"{a.label} vs {b.label}" if a is not b else f"within {a.label}"
      out.append(cka_figures.measure_maps(
          {"CKA, every example": arrays[f"cka_{t}"], f"CKA, {without}": arrays[f"without_cka_{t}"]},
          a.names, b.names, row_label=a.label, col_label=b.label,
          title=f"Block structure and dominant examples: {pair}\n"
                f"{self.config.num_examples:,} examples, minibatches of {self.config.batch_size:,}",
          path=results.workdir_path(workdir, f"without_dominant_{t}.png"), figures=figures))
    return out


def _dominant(s: dict) -> declaration.Verdict | declaration.Variants:
  """On every captured layer and on the block outputs alone."""
  def check(layers: str) -> declaration.Verdict:
    pick = lambda e: [e["share"][i] for i in e["block_outputs"]] if layers == "blocks" else e["share"]
    top = {e["label"]: max(pick(e)) for e in s["models"].values()}
    return any(v > 0.5 for v in top.values()), ", ".join(f"{k}: largest {v:.2f}" for k, v in top.items())
  both = all("block_outputs" in e for e in s["models"].values())
  return declaration.each("layers", ("captured", "blocks") if both else ("captured",), check)


def _fades(s: dict) -> declaration.Verdict:
  if "mean_off_diagonal_cka_without" not in s:
    return None
  before, after = s["mean_off_diagonal_cka"], s["mean_off_diagonal_cka_without"]
  return (all(after[k] < before[k] for k in before),
          ", ".join(f"{s['models'][k]['label']}: {before[k]:.3f} -> {after[k]:.3f}" for k in before))


def key_numbers(s: dict) -> list[tuple[str, str]]:
  out = [(f"{e['label']}: share, lowest / highest layer", f"{min(e['share']):.3f} / {max(e['share']):.3f}")
         for e in s["models"].values()]
  out += [(f"{s['models'][k]['label']}: mean off-diagonal CKA, all / without the dominant",
           f"{v:.3f} / {s['mean_off_diagonal_cka_without'][k]:.3f}")
          for k, v in s.get("mean_off_diagonal_cka", {}).items()]
  return out


DECLARATION = declaration.Declaration(
    name="pc_share", build=PcShare, models=declaration.Models(any_names=True), defaults=DEFAULTS,
    figures="beside Figs 1, 2 (Nguyen, Raghu & Kornblith 2022)", hsic_minibatches=True,
    key_numbers=key_numbers,
    findings=(
        declaration.Finding(
            "Block structure in a CKA map comes with a dominant first principal component: one "
            "direction carries much of the variance of the layers inside the block (here: some "
            "layer's first component carries more than half of its variance).", _dominant),
        declaration.Finding(
            "The block structure fades without the few examples that dominate those components "
            "(here: with drop_fraction, the mean off-diagonal CKA within every model is lower "
            "without each minibatch's most dominant examples).", _fades)))
