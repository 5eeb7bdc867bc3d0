"""What a checkpoint holds (`configs/inspect.py`): the inferred architecture, the
tensor each field was read from, its preprocessing, and every representation
point with its shape."""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from vitcnn_jax import checkpoints
from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models import param_trees
from vitcnn_jax.models import representations
from vitcnn_jax.run import driver
from vitcnn_jax.run import loading


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  if not config.get("checkpoint"):
    raise ValueError("config.checkpoint is empty: pass --config.checkpoint=/path/or/gs://file.npz")
  overrides = loading.overrides(config)
  c = checkpoints.load(config.checkpoint, **overrides)
  model, params = c.model, c.params
  policy, policy_from = c.preprocessing(config.get("policy") or "")
  points = representations.point_shapes(model, params, config.get("capture") or None)
  fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)
            if f.name not in ("parent", "name")}
  summary = {
      "checkpoint": config.checkpoint,
      "file": c.path,
      "family": model.family,
      "format": c.fmt,
      "architecture": fields,
      "evidence": c.evidence,
      "assumed": sorted(c.assumed),
      "policy": policy,
      "preprocessing": preprocess.describe(policy),
      "policy from": policy_from,
      "num_params": int(sum(np.size(v) for v in param_trees.flatten(params).values())),
      "points": [{"name": k, "shape": list(v.shape[1:])} for k, v in points.items()],
  }
  summary["sources"] = sources(c.evidence, summary["assumed"])
  lines = [f"{model.family} ({c.fmt} format) {fields}"]
  lines += [f"  from {where}: {', '.join(names) or 'nothing'}" for where, names in
            summary["sources"].items()]
  lines += [f"  {k:20s} from {v}" + ("  [assumed: pass --config.overrides." + k + "=... if "
                                       "it was trained otherwise]" if k in summary["assumed"] else "")
            for k, v in c.evidence.items()]
  if "image_size" not in c.evidence:  # a ResNet: any size works, none is recorded
    given = "resolution" in overrides or "image_size" in overrides
    summary["image_size_source"] = "override" if given else "default (not in the file)"
    lines.append(f"  {'image_size':20s} {fields['image_size']}: " + (
        "as overridden" if given else "not recorded in the file, so the default; the points "
        "below are at this size. Pass --config.overrides.resolution=N for the size the model "
        "was trained at (32 for the demo ResNet)"))
  lines.append(f"  {'preprocessing':20s} {policy}: {summary['preprocessing']} (from {policy_from})")
  lines += [f"{summary['num_params']:,} parameters",
           f"{len(points)} representation points (per-example shapes):"]
  lines += [f"  {p['name']:40s} {tuple(p['shape'])}" for p in summary["points"]]
  print("\n".join(lines))
  driver.write(workdir, "inspect", summary)
  return summary


def sources(evidence: dict[str, str], assumed: list[str]) -> dict[str, list[str]]:
  """The architecture's fields by where each was read: the weights, the settings
  files beside them (a Hugging Face folder's), or nowhere (assumed)."""
  out: dict[str, list[str]] = {"the weights (or the format)": [], "config.json": [],
                               "preprocessor_config.json": [], "assumed": []}
  for field, why in evidence.items():
    where = ("assumed" if field in assumed else
             next((f for f in ("config.json", "preprocessor_config.json") if why.startswith(f)),
                  "the weights (or the format)"))
    out[where].append(field)
  return out
