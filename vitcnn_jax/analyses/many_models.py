"""Any number of models compared, each model's pass run once and kept.

Each model's minibatch statistics are kept (`run/kept.py`); every pair of models
is then combined from them (`run/combining.py`) into the blocks a fused CKA run
of the pair gives (every measure, its null, intervals, layer matching), and the
pair's score (`calibration.AGGREGATES`, by default the depth-monotone matching)
is calibrated against `calibration.draws` draws of the same layer search with
one model's examples permuted (Gröger, Wen & Brbić 2026). Per measure: the
model x model matrices of raw and calibrated scores, p-values and levels. A
model added to the list costs its own pass and its new pairs (`run/many.py`).
"""

from __future__ import annotations

import ml_collections
import numpy as np

from vitcnn_jax.analyses import cka
from vitcnn_jax.plotting import many_models as figures_of
from vitcnn_jax.plotting import style
from vitcnn_jax.run import declaration
from vitcnn_jax.similarity import calibration
from vitcnn_jax.similarity import comparison
from vitcnn_jax.similarity import layer_search
from vitcnn_jax.similarity import measures

BASE = "cka"  # every field of the CKA analysis (protocol, measures, null, bootstrap), and:
DEFAULTS = {
    "kept_dir": "",  # where each model's pass is kept (a folder per model); "": WORKDIR/passes
    "keep_only": False,  # keep the models' passes and stop (a cluster job each; one job compares)
    # models whose passes run in lockstep, each step's images read once for them all (0: every
    # model of the job, as a fused run; 1: one at a time, memory holding one model's parameters)
    "models_per_pass": 0,
    "calibration": {
        "draws": 100,  # layer-search null draws per pair (0: none); p-values step by 1 / (draws + 1)
        "alpha": 0.05,  # the null's level: a calibrated score is 0 at its (1 - alpha) quantile
        "aggregate": "matched",  # the pair's statistic: matched (monotone matching), best, mean, last
    },
}


class ManyModels:
  """Every pair of `models` (in their order), each a CKA pair from kept passes."""

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    if config.repeats < 1:
      raise ValueError(f"config.repeats={config.repeats} must be >= 1.")
    if len(models) < 2 and not config.keep_only:
      raise ValueError(f"config.models has {list(models)}: many_models compares at least two (or "
                       "keeps one model's pass with config.keep_only=True).")
    if not isinstance(config.models_per_pass, int) or config.models_per_pass < 0:
      raise ValueError(f"config.models_per_pass={config.models_per_pass!r} must be >= 1, or 0 for every "
                       "model at once.")
    cal = config.calibration
    if not isinstance(cal.draws, int) or cal.draws < 0:
      raise ValueError(f"config.calibration.draws={cal.draws!r} must be an integer >= 0 (0: no calibration).")
    calibration.check_alpha(cal.alpha, "config.calibration.alpha")
    if cal.aggregate not in calibration.AGGREGATES:
      raise ValueError(f"config.calibration.aggregate={cal.aggregate!r} is not one of "
                       f"{list(calibration.AGGREGATES)}.")
    self.config, self.models = config, models
    self.spec = measures.spec_of(config)
    self.names = list(models)

  def pairs(self) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(self.names) for b in self.names[i + 1:]]

  def program(self) -> tuple:
    """What a pair's sums depend on beyond the two passes (its kept file's key)."""
    return (self.spec, int(self.config.get("bootstrap", 0)), self.config.calibration.draws, self.config.seed)

  def pair(self, a: str, b: str, combined) -> tuple[dict[str, np.ndarray], dict]:
    """The pair's CKA arrays and summary (`cka.CKA.finalize` of its sums), its
    repeats' full maps renamed per pair, and each measure's calibration."""
    pair = cka.CKA(self.config, {a: self.models[a], b: self.models[b]})
    pair.replicates = [combined.pooled]
    arrays, summary = pair.finalize([combined.sums])
    tag = f"{a}_{b}"
    for k in [k for k in arrays if k.endswith("per_repeat")]:
      arrays[f"{k}_{tag}"] = arrays.pop(k)
    if self.config.calibration.draws:
      summary["calibration"] = self._calibrate(arrays, combined.draws, pair.names, a, b)
    return arrays, summary

  def _calibrate(self, arrays: dict, draws: list[dict], names: list[str], a: str, b: str) -> dict:
    """Each measure's pair statistic (of its mean map over repeats) against the
    same statistic of each draw's mean map (`layer_search.calibrated`)."""
    rows, tag = len(self.models[a].names), f"{a}_{b}"
    per_repeat = [layer_search.null_blocks(d, names, self.spec, self.config.num_examples, rows) for d in draws]
    null = {m: sum(r[m] for r in per_repeat) / len(per_repeat) for m in per_repeat[0]}
    observed = {m: arrays[f"{comparison.prefix(m)}_{tag}"] for m in null}
    out = {}
    for m, got in layer_search.calibrated(observed, null, self.config.calibration.aggregate,
                                          self.config.calibration.alpha).items():
      arrays[f"{comparison.prefix(m)}_calibration_null_{tag}"] = got.null
      out[m] = got.summary()
    return out

  def finalize(self, pairs: dict[tuple[str, str], tuple[dict, dict]]) -> tuple[dict[str, np.ndarray], dict]:
    """The model x model matrices of every measure from the pairs' results."""
    arrays: dict[str, np.ndarray] = {}
    entries = {m: {"estimator": measures.describe(m, self.spec)} for m in self.spec.names}
    for (a, b), (pair_arrays, pair_summary) in pairs.items():
      for k, v in pair_arrays.items():
        arrays.setdefault(k, v)
      for m, e in pair_summary["measures"].items():
        entries[m].setdefault("pairs", {})[f"{a}_{b}"] = e
      for m, c in pair_summary.get("calibration", {}).items():
        entries[m].setdefault("calibration", {})[f"{a}_{b}"] = c
    for m in self.spec.names:
      got = self._matrices(m, pairs)
      arrays.update(got)
      raw = got[f"{comparison.prefix(m)}_scores"]
      entries[m]["scores"] = {f"{a}_{b}": float(raw[self.names.index(a), self.names.index(b)]) for a, b in pairs}
    models = {k: {"label": m.label, "checkpoint": m.path, "kind": m.outline.kind} for k, m in self.models.items()}
    summary = {"analysis": "many_models", "models": models, "pairs": {f"{a}_{b}": [a, b] for a, b in pairs},
               "num_examples": self.config.num_examples,
               "batch_size": self.config.batch_size, "repeats": self.config.repeats,
               "score_name": self.config.calibration.aggregate, "alpha": self.config.calibration.alpha,
               "draws": self.config.calibration.draws,
               "score_definition": calibration.DEFINITIONS[self.config.calibration.aggregate],
               "measures": entries, "files": {"npz": "many_models.npz"}}
    return arrays, summary

  def _matrices(self, m: str, pairs: dict) -> dict[str, np.ndarray]:
    """(models, models) pair scores (`config.calibration.aggregate` of the mean
    map) with their interval's ends (the matching score's, where it is the
    statistic and one was taken), and (with draws) calibrated scores, p-values
    and levels; the diagonal is each model against itself (its own block's
    statistic; calibrated 1, p-value 0)."""
    p, n = comparison.prefix(m), len(self.names)
    aggregate = self.config.calibration.aggregate
    stat, distance = calibration.AGGREGATES[aggregate], measures.REGISTRY[m].distance
    out = {k: np.zeros((n, n)) for k in ("scores", "scores_low", "scores_high", "calibrated", "p_values", "levels")}
    out["calibrated"][np.diag_indices(n)] = 1.0
    for (a, b), (arrays, s) in pairs.items():
      i, j = self.names.index(a), self.names.index(b)
      value = stat(arrays[f"{p}_{a}_{b}"], distance)
      entry = s["measures"][m]["matching"]["score"][f"{a}_{b}"]
      low, high = entry["interval"] if aggregate == "matched" and entry["interval"] else (value, value)
      for k, v in (("scores", value), ("scores_low", low), ("scores_high", high)):
        out[k][i, j] = out[k][j, i] = v
      for k in (i, j):
        own = stat(arrays[f"{p}_{self.names[k]}_{self.names[k]}"], distance)
        out["scores"][k, k] = out["scores_low"][k, k] = out["scores_high"][k, k] = own
      got = s.get("calibration", {}).get(m)
      if got:
        for k, key in (("calibrated", "calibrated"), ("p_values", "p_value"), ("levels", "tau")):
          out[k][i, j] = out[k][j, i] = got[key]
    if not (self.config.calibration.draws and measures.REGISTRY[m].null):
      out = {k: v for k, v in out.items() if k.startswith("scores")}
    return {f"{p}_{k}": v for k, v in out.items()}

  def plot(self, arrays, summary, workdir: str, figures: style.Figures) -> list:
    shown = [(comparison.prefix(m), measures.REGISTRY[m].label, measures.REGISTRY[m].distance)
             for m in self.spec.names]
    return figures_of.matrices(self.names, arrays, summary, workdir, figures, shown)


def by_architecture(s: dict, measure: str) -> declaration.Verdict:
  """Mean pair score of ViT pairs and of CNN pairs against ViT-CNN pairs (a distance: below)."""
  kinds = {k: v["kind"] for k, v in s["models"].items()}
  groups: dict[str, list[float]] = {}
  for tag, value in s["measures"][measure]["scores"].items():
    pair = "-".join(sorted(kinds[n] for n in s["pairs"][tag]))
    groups.setdefault(pair, []).append(value)
  means = {k: float(np.mean(v)) for k, v in groups.items()}
  alike = {k: means[k] for k in ("ViT-ViT", "CNN-CNN") if k in means}
  across = {k: means[k] for k in ("CNN-ViT",) if k in means}
  if measures.REGISTRY[measure].distance:
    return declaration.above({k: -v for k, v in across.items()}, {k: -v for k, v in alike.items()})
  return declaration.above(alike, across)


FINDINGS = (declaration.Finding(
    "Across many models, representations group by architecture: pairs of ViTs and pairs of CNNs "
    "score above ViT-CNN pairs (Figs 1-2's contrast, model by model)",
    lambda s: declaration.each("measure", list(s["measures"]), lambda m: by_architecture(s, m))),)


def key_numbers(s: dict) -> list[tuple[str, str]]:
  """Per measure: the mean pair score off the diagonal, raw and calibrated, and
  the pairs whose score is above the null's level."""
  out = []
  for m, e in s["measures"].items():
    label = measures.REGISTRY[m].label
    out.append((f"{label}: mean pair score", f"{np.mean(list(e['scores'].values())):.3f}"))
    cal = e.get("calibration")
    if cal:
      out.append((f"{label}: mean calibrated score", f"{np.mean([c['calibrated'] for c in cal.values()]):.3f}"))
      out.append((f"{label}: pairs above the null (p <= alpha)",
                  f"{sum(c['p_value'] <= s['alpha'] for c in cal.values())} of {len(cal)}"))
  return out


DECLARATION = declaration.Declaration(
    name="many_models", build=ManyModels, models=declaration.Models(any_names=True),
    defaults={**cka.DEFAULTS, **DEFAULTS},
    figures="beyond the paper: any number of models", hsic_minibatches=True, hint=cka.DEMO_HINT,
    key_numbers=key_numbers, findings=FINDINGS, kept=True)
