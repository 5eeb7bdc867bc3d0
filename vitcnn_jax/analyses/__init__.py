"""Analyses chosen by name (`config.analysis`); each module has `run(config, workdir)`."""

from __future__ import annotations

import importlib

import ml_collections

ANALYSES = ("attention_distance", "cka", "head_subsets", "inspect", "localization",
            "receptive_field", "skip_ratio", "train")


def run(config: ml_collections.ConfigDict, workdir: str):
  name = config.get("analysis")
  if name not in ANALYSES:
    raise ValueError(f"config.analysis={name!r} is not one of {ANALYSES}.")
  return importlib.import_module(f"vitcnn_jax.analyses.{name}").run(config, workdir)
