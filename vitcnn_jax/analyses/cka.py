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

from vitcnn_jax import plotting
from vitcnn_jax.models import capturing
from vitcnn_jax.run import declaration
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results
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
    reduced = set(subspaces.KEPT) & set(spec.names)
    if reduced:  # the components each read, and the share of each layer's variance they kept
      total = lambda key: sum(np.asarray(s[key], np.float64) for s in sums[0])  # noqa: E731
      count = max(float(total("subspace_count")), 1.0)
      seen = total("subspace_reduced")  # the layers whose rank exceeded cca_dims in some minibatch
      kept = {key: total(key) / count for key in {subspaces.KEPT[m] for m in reduced}}
      for m in reduced:
        entry = summary["measures"][m]
        entry["variance_kept"] = _shares(self.names, kept[subspaces.KEPT[m]])
        if m in subspaces.WIDE:
          entry["components"] = spec.subspace_dims or "all"
        else:
          entry.update(components=spec.cca_dims,
                       reduced_layers=[k for k, c in zip(self.names, seen) if c > 0])
      _say_reduced(self.names, spec, sorted(reduced), kept)
    for m in spec.names:
      if measures.REGISTRY[m].clip:  # how often a negative estimate became 0
        summary["measures"][m]["clipped"] = measures.clip_counts(m, per, null)
    if self.config.get("bootstrap", 0):
      bootstrap_intervals(arrays, summary, self.replicates[0], self.names, spec, n * self.repeats,
                          self.models)
    return arrays, summary

  def plot(self, arrays, summary, workdir: str) -> None:
    if "linear_cka" in self.spec.names:
      plot_heatmaps(self.config, self.models, arrays, workdir)
    if not measures.only_linear(self.spec) or self.config.get("bootstrap", 0):
      plot_measures(self.config, self.models, arrays, summary, self.spec, workdir)


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


def off_diagonal(m: np.ndarray) -> float:
  return float(m[~np.eye(len(m), dtype=bool)].mean()) if len(m) > 1 else float("nan")


def _lower_half_match(cross: np.ndarray) -> float:
  """Mean relative depth (0 first layer, 1 last) of the column layer most similar
  to each layer of the lower half of the rows."""
  best = cross[:max(1, len(cross) // 2)].argmax(axis=1)
  return float(np.mean(best / max(1, cross.shape[1] - 1)))


def _is_vit(m) -> bool:
  """Attention over one token grid (Fig 2's ViT); a Swin (maps) and a Mixer (no attention) are not."""
  return m.model.grid is not None and bool(m.model.attention())


def _is_cnn(m) -> bool:
  return m.model.grid is None and not m.model.attention()


def finding_statistics(cka: np.ndarray, models: list, keep: dict[str, np.ndarray] | None = None) -> dict:
  """What the findings read from a (layers x layers) CKA matrix of every model's
  layers, each model's rows `keep[name]` (indices into its layers; default all)
  alone: the mean off-diagonal CKA within each model and, for each CNN and ViT,
  the lower-half best match."""
  index, start = {}, 0
  for m in models:
    index[m.name] = start + (np.arange(len(m.names)) if keep is None else keep[m.name])
    start += len(m.names)
  block = lambda a, b: cka[np.ix_(index[a.name], index[b.name])]  # noqa: E731
  return {"mean_off_diagonal_cka": {m.name: off_diagonal(block(m, m)) for m in models},
          "lower_half_best_match": {f"{c.name}_in_{v.name}": _lower_half_match(block(c, v))
                                    for c in models for v in models if _is_cnn(c) and _is_vit(v)}}


def block_outputs(m) -> np.ndarray:
  """The indices of a model's captured layers that are its block outputs (its
  "blocks" preset), or of all of them where fewer than two are: the findings'
  other layer set."""
  patterns = m.model.layer_presets.get("blocks", ())
  found = [i for i, n in enumerate(m.names) if capturing.matches(n, patterns)]
  return np.asarray(found) if len(found) > 1 else np.arange(len(m.names))


def _block_outputs(models: list) -> dict[str, np.ndarray] | None:
  """`block_outputs` of every model; None where that is every captured layer of
  every model (the run has no other layer set to compare with)."""
  out = {m.name: block_outputs(m) for m in models}
  return None if all(len(out[m.name]) == len(m.names) for m in models) else out


def _layer_set(models: list) -> str:
  """The name of the layers every model captured: their preset where it is one for all."""
  one = lambda c: c if isinstance(c, str) else c[0] if len(c) == 1 else ""  # noqa: E731
  captures = {one(m.capture) if one(m.capture) in m.model.layer_presets else "" for m in models}
  return captures.pop() if len(captures) == 1 and "" not in captures else "as captured"


def arrays_and_summary(config, models, per_repeat: dict[str, np.ndarray], spec: measures.Spec,
                       null: dict[str, np.ndarray] | None = None):
  """Arrays and summary of every measure (repeats x layers x layers each): linear
  CKA as `cka_A_B`, `std_A_B`, `per_repeat`; another measure M as `M_A_B`,
  `M_std_A_B`, `M_per_repeat`; nulls as `null_P_A_B` (P: `cka` or M)."""
  pairs = blocks(models)
  summary = {
      "analysis": "cka",
      "models": {m.name: {"label": m.label, "checkpoint": m.path, "layers": m.names,
                          "attention": bool(m.model.attention()), "tokens": m.model.grid is not None}
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
    # Figs 1 and 2's statistics on the captured layers and, for the findings' check
    # of the layer set, on each model's block outputs alone.
    summary.update(finding_statistics(mean, models))
    summary["layer_set"] = _layer_set(models)
    outputs = _block_outputs(models)
    if outputs is not None:
      summary["block_outputs"] = {**finding_statistics(mean, models, outputs),
                                  "layers": {k: len(v) for k, v in outputs.items()}}
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
    stats = [finding_statistics(r["linear_cka"], models) for r in reps]
    summary["bootstrap"]["findings"] = {key: {k: [s[key][k] for s in stats] for k in stats[0][key]}
                                        for key in stats[0]}
  comparison.bootstrap_intervals(arrays, summary["measures"], reps, nulls, spec.names, pairs)


def plot_heatmaps(config, models, arrays, workdir: str, only: list[str] | None = None) -> None:
  for t, a, b, _, _ in blocks(models):
    if only is not None and t not in only:
      continue
    title = f"CKA: {a.label} vs {b.label}" if a is not b else f"CKA within {a.label}"
    plotting.cka_heatmap(arrays[f"cka_{t}"], a.names, b.names, row_label=a.label, col_label=b.label,
                         title=f"{title}\n{plotting.protocol(config.num_examples, config.repeats)}",
                         path=results.workdir_path(workdir, f"cka_{t}.png"))


def _score_text(entry: dict) -> str:
  """A pair's score and its interval, e.g. "0.829 [0.826, 0.832]"."""
  interval = entry["interval"]
  return f"{entry['value']:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")


def plot_measures(config, models, arrays, summary: dict, spec: measures.Spec, workdir: str) -> None:
  """Every measure of each pair of models side by side (the nulls below them), with
  each layer's matches and the pair's score where the models differ."""
  label = {m: measures.REGISTRY[m].label for m in spec.names}
  for t, a, b, _, _ in blocks(models):
    key = {kind: {m: f"{kind.format(comparison.prefix(m))}_{t}" for m in spec.names}
           for kind in ("{}", "{}_like_null", "null_{}", "{}_ci_low", "{}_ci_high", "best_{}", "monotone_{}")}
    have = {kind: {label[m]: arrays[k] for m, k in keys.items() if k in arrays} for kind, keys in key.items()}
    maps, flat = have["{}"], have["{}_like_null"]
    nulls = have["null_{}"] if spec.null else None
    low, high, best, monotone = (key[k] for k in ("{}_ci_low", "{}_ci_high", "best_{}", "monotone_{}"))
    widths = {label[m]: arrays[high[m]] - arrays[low[m]] for m in spec.names if high[m] in arrays}
    matches = {label[m]: (arrays[best[m]], arrays[monotone[m]],
                          "score " + _score_text(summary["measures"][m]["matching"]["score"][t]))
               for m in spec.names if best[m] in arrays}
    title = f"{a.label} vs {b.label}" if a is not b else f"within {a.label}"
    plotting.measure_maps(maps, a.names, b.names, row_label=a.label, col_label=b.label,
                          title=f"Similarity {title}\n{plotting.protocol(config.num_examples, config.repeats)}",
                          path=results.workdir_path(workdir, f"measures_{t}.png"), nulls=nulls,
                          flat=flat or None, widths=widths or None,
                          distances=[label[m] for m in spec.names if measures.REGISTRY[m].distance],
                          matches=matches or None)


# A finding holds over the images where it holds in at least this share of the
# bootstrap replicates (resampled minibatches).
SHOWN_IN = 0.95


def _variants(s: dict, check) -> declaration.Verdict | declaration.Variants:
  """`check` (a verdict on the findings' statistics) on the captured layers, on
  each model's block outputs alone, and on every bootstrap replicate."""
  own = f"layers={s.get('layer_set', 'as captured')}"
  out = {f"{own}, sample=as drawn": check(s)}
  if "block_outputs" in s:
    out["layers=blocks, sample=as drawn"] = check({**s, **s["block_outputs"]})
  reps = s.get("bootstrap", {}).get("findings")
  if reps:
    count = len(next(iter(reps["mean_off_diagonal_cka"].values())))
    each = [check({**s, **{key: {k: v[i] for k, v in per.items()} for key, per in reps.items()}})
            for i in range(count)]
    if all(v is not None for v in each):
      holds = sum(bool(v[0]) for v in each)
      out[f"{own}, sample=bootstrap"] = (holds >= SHOWN_IN * count,
                                         f"shown in {holds} of {count} replicates")
  return out if len(out) > 1 else out[f"{own}, sample=as drawn"]


def _uniform(s: dict) -> declaration.Verdict:
  """Every ViT (attention over one token grid) against every CNN (neither): a
  Swin, with attention over maps, and a Mixer, with tokens but no attention, are neither."""
  within = {k: (m, s["mean_off_diagonal_cka"][k]) for k, m in s["models"].items()}
  return declaration.above(
      {m["label"]: v for m, v in within.values() if m["attention"] and m["tokens"]},
      {m["label"]: v for m, v in within.values() if not m["attention"] and not m["tokens"]})


def _uniformity(s: dict) -> declaration.Verdict | declaration.Variants:
  return _variants(s, _uniform)


def _lower(s: dict) -> declaration.Verdict:
  match = s["lower_half_best_match"]
  if not match:
    return None
  return (all(v <= 1 / 3 for v in match.values()),
          ", ".join(f"{k.replace('_in_', ' in ')}: best matches at relative depth {v:.2f}"
                    for k, v in match.items()))


def _lower_half(s: dict) -> declaration.Verdict | declaration.Variants:
  return _variants(s, _lower)


def key_numbers(s: dict) -> list[tuple[str, str]]:
  label = lambda m: measures.REGISTRY[m].label  # noqa: E731
  others = [(f"mean {label(m)} {t} (null {e['null']['mean'][t]:.3f})" if "null" in e
             else f"mean {label(m)} {t}", f"{v:.3f}")
            for m, e in s.get("measures", {}).items() if m != "linear_cka" for t, v in e["mean"].items()]
  scores = [(f"{label(m)} score {t} (monotone layer matching)", _score_text(e))
            for m, e in s.get("measures", {}).items() for t, e in e.get("matching", {}).get("score", {}).items()]
  return ([(f"mean CKA {k}", f"{v:.3f}") for k, v in s["mean_cka"].items()] + others + scores
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
            "with attention over one token grid is above that within every model with "
            "neither attention nor tokens).", _uniformity),
        declaration.Finding(
            "Across models, the lower half of the ResNet matches about the lowest quarter of "
            "the ViT (here: the ViT layer most similar to each layer of the ResNet's lower "
            "half lies, on average, in the ViT's lowest third).", _lower_half)))
