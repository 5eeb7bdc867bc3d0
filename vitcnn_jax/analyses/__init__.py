"""Analyses chosen by name (`config.analysis`).

An analysis module defines `MODELS` (the names in `config.models` it reads;
None: any), `build(config, models) -> driver.Analysis`, which the driver runs,
and optionally `HSIC_MINIBATCHES = True` (each step's rows are HSIC minibatches,
so their sizes are checked before any model is loaded). `inspect` reads one
checkpoint and runs no data, so it has `run(config, workdir)` and writes through
`driver.write`. The notebook API (`vitcnn_jax.api`) builds the same analyses.
"""

from __future__ import annotations

import importlib

import jax
import ml_collections

from vitcnn_jax import workdir as workdir_lib

ANALYSES = ("attention_distance", "cka", "head_subsets", "inspect", "linear_probe",
            "localization", "receptive_field", "reference_cka", "skip_ratio")
# Jobs a config may name that are not analyses: training makes a model (optimizer
# state, its own checkpoints) rather than reducing representations to sums.
# The report runs other analyses and writes one page over them.
OTHER_JOBS = {"train": "vitcnn_jax.train", "report": "vitcnn_jax.report"}


def run(config: ml_collections.ConfigDict, workdir: str):
  name = config.get("analysis")
  if name not in ANALYSES and name not in OTHER_JOBS:
    raise ValueError(f"config.analysis={name!r} is not one of {ANALYSES + tuple(OTHER_JOBS)}.")
  module = importlib.import_module(OTHER_JOBS.get(name, f"vitcnn_jax.analyses.{name}"))
  if jax.process_index() != 0:  # process 0 alone writes, so it alone checks and locks
    return _run(module, name, config, workdir)
  workdir = workdir_lib.check(workdir)
  with workdir_lib.lock(workdir):
    return _run(module, name, config, workdir)


def _run(module, name: str, config: ml_collections.ConfigDict, workdir: str):
  try:
    if hasattr(module, "build"):
      from vitcnn_jax import driver  # pylint: disable=g-import-not-at-top
      return driver.run_analysis(config, workdir, module)
    return module.run(config, workdir)
  except AttributeError as e:
    if isinstance(e.__context__, KeyError):  # how ConfigDict reports a missing field
      config_file = {"cka": "cka_vit_resnet"}.get(name, name)
      field = str(e.__context__.args[0]).strip("'\"")
      raise ValueError(f"The config has no field {field!r} that analysis "
                       f"{name!r} needs; start from configs/{config_file}.py.") from e
    raise
