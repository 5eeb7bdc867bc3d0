"""vitcnn_jax: how do vision transformers and CNNs represent what they see?

The notebook API (`vitcnn_jax.api`) is available at the top level, a function
per analysis: `vitcnn_jax.cka(models, images)`, `vitcnn_jax.attention_distance(model,
images)`, ... (jax and flax load on first use). `__all__` lists the API.
"""

from __future__ import annotations

import importlib as _importlib
import os as _os

from vitcnn_jax.run import declaration as _declaration

__version__ = "0.1.0"
__all__ = sorted([*_declaration.names(), "Result", "zoo"])


def _cpu_threads() -> None:
  """XLA's CPU thread pool at twice the cores, unless PJRT_NPROC or NPROC sets it
  (read once, when jax first starts its CPU client; later, this changes nothing).
  jaxlib's batched LAPACK calls, the measures' per-pair SVDs among them, split the
  batch over that pool and block their own pool thread until it is done: with one
  thread a core, one core sits idle (on 2 cores: 35,156 SVDs of 32 x 32 in a loop
  took 0.56 s with 2 threads, 0.31 s with 4; see docs/measures.md, the measures' overhead)."""
  if "PJRT_NPROC" not in _os.environ and "NPROC" not in _os.environ:
    cores = len(_os.sched_getaffinity(0)) if hasattr(_os, "sched_getaffinity") else _os.cpu_count()
    _os.environ["PJRT_NPROC"] = str(2 * (cores or 1))


# XLA:CPU hands every dot and convolution that stands alone to YNNPACK. Its dots
# compute a small output on one thread however long the inner dimension: a Gram of
# 32 rows of 150,528 features (a ViT-B/16 layer at W's minibatch) took there about
# twice the time of Eigen's contraction, which splits the inner dimension over
# XLA's pool, and so did the measures' all-pairs products of flattened Grams; a
# ViT's attention logits took 1.3 to 1.6x. Its convolutions took 1.2 to 2.2x
# Eigen's time at every k x k one timed, of BiT-R50 and ViT-B/16 at W's minibatch
# and of ResNet-18 at 1,000 images (docs/benchmarks.md, XLA:CPU's dots and
# convolutions). Dots fused with their neighbours stay YNNPACK's.
CPU_CONTRACTIONS = "--xla_cpu_experimental_ynn_fusion_type=-individual_dot,-individual_convolution"


def _cpu_contractions() -> None:
  """Appends `CPU_CONTRACTIONS` to XLA_FLAGS unless the user's flags choose
  YNNPACK's fusions themselves (read once, when jax first starts its CPU client,
  as `_cpu_threads`)."""
  flags = _os.environ.get("XLA_FLAGS", "")
  if "--xla_cpu_experimental_ynn_fusion_type" not in flags:
    _os.environ["XLA_FLAGS"] = f"{flags} {CPU_CONTRACTIONS}".strip()


_cpu_threads()
_cpu_contractions()


def __getattr__(name: str):
  if name in _declaration.names():
    return _importlib.import_module("vitcnn_jax.api").function(name)
  if name == "Result":
    return _importlib.import_module("vitcnn_jax.jobs").Result
  if name == "zoo":
    return _importlib.import_module("vitcnn_jax.inputs.zoo")
  raise AttributeError(f"module 'vitcnn_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
  return list(__all__)
