"""vitcnn_jax: how do vision transformers and CNNs represent what they see?

The notebook API (`vitcnn_jax.api`) is available at the top level, a function
per analysis: `vitcnn_jax.cka(models, images)`, `vitcnn_jax.attention_distance(model,
images)`, ... (jax and flax load on first use).
"""

from __future__ import annotations

import importlib

from vitcnn_jax import declaration

__version__ = "0.1.0"


def __getattr__(name: str):
  if name in declaration.names():
    return importlib.import_module("vitcnn_jax.api").function(name)
  if name == "Result":
    return importlib.import_module("vitcnn_jax.jobs").Result
  if name == "zoo":
    return importlib.import_module("vitcnn_jax.zoo")
  raise AttributeError(f"module 'vitcnn_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted([*globals(), *declaration.names(), "Result", "zoo"])
