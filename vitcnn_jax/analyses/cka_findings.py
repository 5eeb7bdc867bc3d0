"""The findings of the CKA analysis (paper Figs 1, 2, B.1) and the statistics
they read: what its summary records of them, their checks under each variant
(layer set, bootstrap replicates) and its key numbers. Not an analysis itself:
`cka.DECLARATION` names these."""

from __future__ import annotations

import numpy as np

from vitcnn_jax.models import capturing
from vitcnn_jax.run import declaration
from vitcnn_jax.similarity import measures

# A finding holds over the images where it holds in at least this share of the
# bootstrap replicates (resampled minibatches).
SHOWN_IN = 0.95


def off_diagonal(m: np.ndarray) -> float:
  return float(m[~np.eye(len(m), dtype=bool)].mean()) if len(m) > 1 else float("nan")


def _lower_half_match(cross: np.ndarray) -> float:
  """Mean relative depth (0 first layer, 1 last) of the column layer most similar
  to each layer of the lower half of the rows."""
  best = cross[:max(1, len(cross) // 2)].argmax(axis=1)
  return float(np.mean(best / max(1, cross.shape[1] - 1)))


def finding_statistics(cka: np.ndarray, models: list, keep: dict[str, np.ndarray] | None = None) -> dict:
  """What the findings read from a (layers x layers) CKA matrix of every model's
  layers, each model's rows `keep[name]` (indices into its layers; default all)
  alone: the mean off-diagonal CKA within each model and, for each CNN and ViT,
  the lower-half best match."""
  index, start = {}, 0
  for m in models:
    index[m.name] = start + (np.arange(len(m.names)) if keep is None else keep[m.name])
    start += len(m.names)
  block = lambda a, b: cka[np.ix_(index[a.name], index[b.name])]
  return {"mean_off_diagonal_cka": {m.name: off_diagonal(block(m, m)) for m in models},
          "lower_half_best_match": {f"{c.name}_in_{v.name}": _lower_half_match(block(c, v))
                                    for c in models for v in models
                                    if c.outline.kind == "CNN" and v.outline.kind == "ViT"}}


def block_outputs(m) -> np.ndarray:
  """The indices of a model's captured layers that are its block outputs (its
  "blocks" preset), or of all of them where fewer than two are: the findings'
  other layer set."""
  patterns = m.outline.presets.get("blocks", ())
  found = [i for i, n in enumerate(m.names) if capturing.matches(n, patterns)]
  return np.asarray(found) if len(found) > 1 else np.arange(len(m.names))


def _block_outputs(models: list) -> dict[str, np.ndarray] | None:
  """`block_outputs` of every model; None where that is every captured layer of
  every model (the run has no other layer set to compare with)."""
  out = {m.name: block_outputs(m) for m in models}
  return None if all(len(out[m.name]) == len(m.names) for m in models) else out


def _layer_set(models: list) -> str:
  """The name of the layers every model captured: their preset where it is one for all."""
  one = lambda c: c if isinstance(c, str) else c[0] if len(c) == 1 else ""
  captures = {one(m.capture) if one(m.capture) in m.outline.presets else "" for m in models}
  return captures.pop() if len(captures) == 1 and "" not in captures else "as captured"


def summary_statistics(mean: np.ndarray, models: list) -> dict:
  """Figs 1 and 2's statistics of the mean linear CKA on the captured layers (and
  the name of that layer set) and, for the findings' check of the layer set, on
  each model's block outputs alone: the summary's entries the findings read."""
  out = {**finding_statistics(mean, models), "layer_set": _layer_set(models)}
  outputs = _block_outputs(models)
  if outputs is not None:
    out["block_outputs"] = {**finding_statistics(mean, models, outputs),
                            "layers": {k: len(v) for k, v in outputs.items()}}
  return out


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


FINDINGS = (
    declaration.Finding(
        "ViT representations are more uniform across depth than a ResNet's: CKA between "
        "ViT layers stays high over most of the network, while the ResNet shows a "
        "stage-wise block structure (here: the mean off-diagonal CKA within every model "
        "with attention over one token grid is above that within every model with "
        "neither attention nor tokens).", _uniformity),
    declaration.Finding(
        "Across models, the lower half of the ResNet matches about the lowest quarter of "
        "the ViT (here: the ViT layer most similar to each layer of the ResNet's lower "
        "half lies, on average, in the ViT's lowest third).", _lower_half))


def score_text(entry: dict) -> str:
  """A pair's score and its interval, e.g. "0.829 [0.826, 0.832]"."""
  interval = entry["interval"]
  return f"{entry['value']:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")


def key_numbers(s: dict) -> list[tuple[str, str]]:
  label = lambda m: measures.REGISTRY[m].label
  others = [(f"mean {label(m)} {t} (null {e['null']['mean'][t]:.3f})" if "null" in e
             else f"mean {label(m)} {t}", f"{v:.3f}")
            for m, e in s.get("measures", {}).items() if m != "linear_cka" for t, v in e["mean"].items()]
  scores = [(f"{label(m)} score {t} (monotone layer matching)", score_text(e))
            for m, e in s.get("measures", {}).items() for t, e in e.get("matching", {}).get("score", {}).items()]
  return ([(f"mean CKA {k}", f"{v:.3f}") for k, v in s["mean_cka"].items()] + others + scores
          + [(f"mean off-diagonal CKA within {k}", f"{v:.3f}")
             for k, v in s["mean_off_diagonal_cka"].items()]
          + [("largest std over repeats", f"{s['max_std_over_repeats']:.4f}")])
