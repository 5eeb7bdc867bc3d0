"""Minibatch CKA within and across any number of models (paper Figs 1, 2, B.1).

Protocol (paper, Appendix A): `num_examples` examples sampled without
replacement, minibatches of `batch_size`, HSIC accumulated over minibatches;
repeated `repeats` times with a new sample each time; mean and standard
deviation over repeats. Each device processes whole minibatches and the HSIC
matrices are summed with a psum, so 1 and N devices give the same result.
Its findings and key numbers are in `cka_findings`, its figures in `plotting/cka.py`.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from vitcnn_jax.analyses import cka_findings
from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import cka as cka_figures
from vitcnn_jax.plotting import style
from vitcnn_jax.run import declaration
from vitcnn_jax.run import protocol
from vitcnn_jax.similarity import comparison
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import subspaces

DEFAULTS = {  # the paper's protocol (Appendix A)
    "num_examples": 10240,  # sampled without replacement each repeat
    "batch_size": 1024,  # the HSIC minibatch (per device, or per group of devices)
    "repeats": 20,  # mean and standard deviation over repeats
    "seed": 0,
    # Measures from the same Grams (vitcnn_jax/similarity/measures.py: measures.NAMES, the table of docs/measures.md):
    # linear_cka (the paper's), rbf_cka, distance_correlation, mutual_knn, cknna,
    # knn_jaccard, rank_similarity, second_order_cosine, rsa, rsm_difference, mean_cca,
    # cca_r2, svcca, pwcca, regression, shape_metric, procrustes, gulp, eigenspace_overlap,
    # magnitude_difference, concentricity_difference, uniformity_difference (the distances:
    # each measure's `distance` in measures.REGISTRY); each of the arrays named after it.
    "measures": ("linear_cka",),
    "estimator": "unbiased",  # linear and RBF CKA: "unbiased" (HSIC_1, the paper's) or "biased"
    "rbf_sigma": 1.0,  # RBF bandwidth: this times the root of the median squared distance
    "knn_k": 10,  # neighbours of mutual_knn, cknna (Huh et al. 2024 use 10) and the other k-NN measures
    "rsa_method": "pearson",  # the correlation of dissimilarities: "pearson" or "spearman"
    "cca_dims": 0,  # the CCA family, regression, eigenspace_overlap: each layer's top principal
    # components (0: (n - 1) // 2 of the smallest minibatch's n, under half of its centred space,
    # and at most subspace_dims)
    "subspace_dims": 32,  # procrustes, shape_metric: each layer's top principal components at
    # most (0: all; each pair of layers, and its null, takes an SVD of this size)
    "svcca_variance": 0.99,  # svcca: the share of each layer's variance its components keep
    "shape_alpha": 1.0,  # shape_metric's partial whitening: 1 Procrustes, towards 0 CCA
    "gulp_lambda": 0.01,  # gulp's ridge penalty (the layers scaled to trace 1)
    "uniformity_t": 2.0,  # uniformity_difference's temperature (Wang & Isola 2020)
    "null": False,  # also each measure with one layer's examples permuted per minibatch
    # 95% intervals per cell from this many Poisson-bootstrap replicates over minibatches
    # (all repeats pooled; 0: none). Host memory and state: replicates x sums x 8 bytes.
    "bootstrap": 0,
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
    self.spec = measures.spec_of(config)

  def step(self, forward, labels, mask) -> dict:
    del labels
    got = forward.measure_sums(self.points, mask, self.spec)
    if not self.config.get("bootstrap", 0):
      return got
    return {k if k == "log2_scale" else protocol.BOOT + k: v for k, v in got.items()}

  def program(self):
    return self.spec, bool(self.config.get("bootstrap", 0))

  def finalize(self, sums):
    n, spec = self.config.num_examples, self.spec
    per = [measures.values(s, self.names, spec, n) for s in sums[0]]
    null = [measures.values(s, self.names, spec, n, null=True) for s in sums[0]] if spec.null else None
    stack = lambda reps: {m: np.asarray([r[m] for r in reps]) for m in spec.names if m in reps[0]}
    arrays, summary = arrays_and_summary(self.config, self.models, stack(per), spec, null and stack(null))
    subspace_report(summary["measures"], sums[0], self.names, spec)
    for m in spec.names:
      if measures.REGISTRY[m].clip:  # how often a negative estimate became 0
        summary["measures"][m]["clipped"] = measures.clip_counts(m, per, null)
    if self.config.get("bootstrap", 0):
      bootstrap_intervals(arrays, summary, self.replicates[0], self.names, spec, n * self.repeats,
                          self.models)
    return arrays, summary

  def plot(self, arrays, summary, workdir: str, figures: style.Figures) -> list:
    pairs, subtitle = blocks(self.models), axes.protocol(self.config.num_examples, self.config.repeats)
    out = []
    if "linear_cka" in self.spec.names:
      out += cka_figures.heatmaps(pairs, arrays, subtitle, workdir, figures)
    if not measures.only_linear(self.spec) or self.config.get("bootstrap", 0):
      out += cka_figures.measures(pairs, arrays, shown_measures(self.spec, summary), subtitle, workdir,
                                  figures)
    return out


def shown_measures(spec: measures.Spec, summary: dict) -> list[cka_figures.Measure]:
  """Each measure of `spec` as its figures show it: its arrays' prefix, its label,
  whether it is a distance, and its layer matching's score of each pair (`summary`)."""
  return [cka_figures.Measure(comparison.prefix(m), measures.REGISTRY[m].label, measures.REGISTRY[m].distance,
                              {t: cka_findings.score_text(e)
                               for t, e in summary["measures"][m].get("matching", {}).get("score", {}).items()})
          for m in spec.names]


def subspace_report(entries: dict, sums: list, names: list[str], spec: measures.Spec) -> None:
  """For the measures that read each layer's top principal components (`subspaces.KEPT`),
  the components they read and the share of each layer's variance those kept, in
  their summary `entries` (by measure), from the sums of every repeat; said once."""
  reduced = set(subspaces.KEPT) & set(spec.names)
  if not reduced:
    return
  total = lambda key: sum(np.asarray(s[key], np.float64) for s in sums)
  count = max(float(total("subspace_count")), 1.0)
  seen = total("subspace_reduced")  # the layers whose rank exceeded cca_dims in some minibatch
  kept = {key: total(key) / count for key in {subspaces.KEPT[m] for m in reduced}}
  for m in reduced:
    entry = entries[m]
    entry["variance_kept"] = _shares(names, kept[subspaces.KEPT[m]])
    if m in subspaces.WIDE:
      entry["components"] = spec.subspace_dims or "all"
    else:
      entry.update(components=spec.cca_dims, reduced_layers=[k for k, c in zip(names, seen) if c > 0])
  _say_reduced(names, spec, sorted(reduced), kept)


def _say_reduced(names: list[str], spec: measures.Spec, chosen: list[str],
                 kept: dict[str, np.ndarray]) -> None:
  """One line per kind of reduction that cut some layer's variance: which
  measures, how many components, the variance kept (`kept`, by `subspaces.KEPT`'s
  sums), and the field that changes it."""
  if jax.process_index() != 0:
    return
  for key, field, components in (("shape_kept", "subspace_dims", spec.subspace_dims),
                                 ("subspace_kept", "cca_dims", spec.cca_dims),
                                 ("overlap_kept", "cca_dims", spec.cca_dims)):
    ms = [m for m in chosen if subspaces.KEPT[m] == key]
    if ms and kept[key].min() < 1 - 1e-6:
      least = int(np.argmin(kept[key]))
      print(f"{', '.join(ms)}: each layer's top {components} principal components, keeping a mean "
            f"{kept[key].mean():.1%} of its variance (least {kept[key][least]:.1%}, {names[least]}); "
            f"config.{field} sets how many (json: measures.M.variance_kept).")


def _shares(names: list[str], kept: np.ndarray) -> dict[str, float]:
  """{layer: the mean share of its variance in the components a measure read}."""
  return {k: round(float(v), 6) for k, v in zip(names, kept)}


def blocks(models: list) -> list[tuple[str, object, object, slice, slice]]:
  """(tag, model a, model b, rows, columns) for every pair a, b with a not after b;
  tag "vit_resnet" for models named vit and resnet."""
  spans, start = [], 0
  for m in models:
    spans.append(slice(start, start + len(m.names)))
    start += len(m.names)
  return [(f"{a.name}_{b.name}", a, b, spans[i], spans[j])
          for i, a in enumerate(models) for j, b in enumerate(models[i:], i)]


def arrays_and_summary(config, models, per_repeat: dict[str, np.ndarray], spec: measures.Spec,
                       null: dict[str, np.ndarray] | None = None):
  """Arrays and summary of every measure (repeats x layers x layers each): linear
  CKA as `cka_A_B`, `std_A_B`, `per_repeat`; another measure M as `M_A_B`,
  `M_std_A_B`, `M_per_repeat`; nulls as `null_P_A_B` (P: `cka` or M)."""
  pairs = blocks(models)
  summary = {
      "analysis": "cka",
      "models": {m.name: {"label": m.label, "checkpoint": m.path, "layers": m.names,
                          "attention": m.outline.attention, "tokens": m.outline.tokens}
                 for m in models},
      "num_examples": config.num_examples, "batch_size": config.batch_size,
      "repeats": config.repeats, "devices": jax.device_count(),
      "files": {"npz": "cka.npz"},
      "measures": {m: {"estimator": measures.describe(m, spec)} for m in spec.names},
  }
  arrays = {f"names_{m.name}": np.asarray(m.names) for m in models}
  for m, reps in per_repeat.items():
    p = comparison.prefix(m)
    mean, std = reps.mean(axis=0), reps.std(axis=0)
    arrays.update({f"{p}_{t}": mean[r, c] for t, _, _, r, c in pairs})
    arrays.update({(f"std_{t}" if p == "cka" else f"{p}_std_{t}"): std[r, c] for t, _, _, r, c in pairs})
    arrays["per_repeat" if p == "cka" else f"{p}_per_repeat"] = reps
    summary["measures"][m]["mean"] = {t: float(mean[r, c].mean()) for t, _, _, r, c in pairs}
    if null is not None and m in null:
      summary["measures"][m]["null"] = comparison.against_null(arrays, p, reps, null[m], pairs)
    summary["measures"][m]["matching"] = comparison.layer_matching(arrays, m, reps, pairs)
  if "linear_cka" in per_repeat:
    mean = per_repeat["linear_cka"].mean(axis=0)
    summary["files"].update({f"heatmap_{t}": f"cka_{t}.png" for t, *_ in pairs})
    summary["mean_cka"] = {t: float(mean[r, c].mean()) for t, _, _, r, c in pairs}
    summary.update(cka_findings.summary_statistics(mean, models))
    summary["max_std_over_repeats"] = float(per_repeat["linear_cka"].std(axis=0).max())
  if not measures.only_linear(spec) or config.get("bootstrap", 0):
    summary["files"].update({f"measures_{t}": f"measures_{t}.png" for t, *_ in pairs})
  return arrays, summary


def bootstrap_intervals(arrays: dict, summary: dict, pooled: dict, names: list[str],
                        spec: measures.Spec, examples: int, models: list) -> None:
  """The replicates of the sums pooled over repeats, each as values: their
  intervals per cell (`comparison.bootstrap_intervals`) and the findings'
  statistics of each replicate's linear CKA (`bootstrap.findings`)."""
  pairs = blocks(models)
  count = len(next(iter(pooled.values())))
  one = lambda b, null=False: measures.values({k: v[b] for k, v in pooled.items()}, names, spec,
                                              examples, null)
  used = []
  for b in range(count):  # a replicate that drew no minibatch (or none with a layer varying) has no value
    try:
      used.append((one(b), one(b, True) if spec.null else None))
    except FloatingPointError:
      continue
  if len(used) < count / 2:
    raise FloatingPointError(f"config.bootstrap: only {len(used)} of {count} replicates have a value: "
                             "too few minibatches; use more examples or smaller minibatches.")
  reps = [r for r, _ in used]
  nulls = [n for _, n in used] if spec.null else None
  summary["bootstrap"] = {"replicates": count, "replicates_with_a_value": len(used), "level": 0.95,
                          "estimator": (
      "percentiles of the measure of the sums over every repeat's minibatches, each minibatch "
      "weighted by Poisson(1) draws (seeded by seed, pass, repeat and minibatch)")}
  if "linear_cka" in spec.names:
    stats = [cka_findings.finding_statistics(r["linear_cka"], models) for r in reps]
    summary["bootstrap"]["findings"] = {key: {k: [s[key][k] for s in stats] for k in stats[0][key]}
                                        for key in stats[0]}
  comparison.bootstrap_intervals(arrays, summary["measures"], reps, nulls, spec.names, pairs)


DECLARATION = declaration.Declaration(
    name="cka", build=CKA, models=declaration.Models(any_names=True), defaults=DEFAULTS,
    figures="Figs 1, 2, B.1", hsic_minibatches=True, hint=DEMO_HINT, key_numbers=cka_findings.key_numbers,
    findings=cka_findings.FINDINGS)
