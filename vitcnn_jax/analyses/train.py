"""Train a model from `config.train` and export it as an upstream-format npz."""

from __future__ import annotations

import os

import ml_collections

from vitcnn_jax import train as train_lib


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  export = config.get("export") or os.path.join(workdir, f"{config.train.name}.npz")
  return train_lib.train(config.train, export, workdir)
