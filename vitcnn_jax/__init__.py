"""vitcnn_jax: how do vision transformers and CNNs represent what they see?

The notebook API (`vitcnn_jax.api`) is available at the top level, a function
per analysis: `vitcnn_jax.cka(models, images)`, `vitcnn_jax.attention_distance(model,
images)`, ... (jax and flax load on first use).
"""

from __future__ import annotations

import importlib
import os
import warnings

from vitcnn_jax.run import declaration

__version__ = "0.1.0"


def _cpu_threads() -> None:
  """XLA's CPU thread pool at twice the cores, unless PJRT_NPROC or NPROC sets it
  (read once, when jax first starts its CPU client; later, this changes nothing).
  jaxlib's batched LAPACK calls, the measures' per-pair SVDs among them, split the
  batch over that pool and block their own pool thread until it is done: with one
  thread a core, one core sits idle (on 2 cores: 35,156 SVDs of 32 x 32 in a loop
  took 0.56 s with 2 threads, 0.31 s with 4; see docs/measures.md, the measures' overhead)."""
  if "PJRT_NPROC" not in os.environ and "NPROC" not in os.environ:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ["PJRT_NPROC"] = str(2 * (cores or 1))


_cpu_threads()

# Modules that moved into folders (run/, similarity/, inputs/, models/): the old
# `from vitcnn_jax import NAME` still works, and says where NAME lives now.
_MOVED = {**{m: "run" for m in ("accuracy", "control", "declaration", "driver", "loading", "memory",
                                  "parallel", "pipeline", "programs", "progress", "protocol", "results",
                                  "runstate", "workdir")},
          **{m: "similarity" for m in ("descriptive", "hsic", "layerpairs", "matching", "measures",
                                         "neighbours", "probe", "subspaces")},
          **{m: "inputs" for m in ("data", "packaged", "preprocess")}, "representations": "models"}


def __getattr__(name: str):
  if name in declaration.names():
    return importlib.import_module("vitcnn_jax.api").function(name)
  if name == "Result":
    return importlib.import_module("vitcnn_jax.jobs").Result
  if name == "zoo":
    return importlib.import_module("vitcnn_jax.inputs.zoo")
  if name in _MOVED:
    new = f"vitcnn_jax.{_MOVED[name]}.{name}"
    warnings.warn(f"vitcnn_jax.{name} is now {new}; import it from there.", DeprecationWarning,
                  stacklevel=2)
    return importlib.import_module(new)
  raise AttributeError(f"module 'vitcnn_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted([*globals(), *declaration.names(), "Result", "zoo"])
