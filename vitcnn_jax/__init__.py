"""vitcnn_jax: how do vision transformers and CNNs represent what they see?

The notebook API (`vitcnn_jax.api`) is available at the top level:
`vitcnn_jax.cka(models, images)`, `vitcnn_jax.attention_distance(model, images)`, ...
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
API = ("cka", "attention_distance", "skip_ratio", "receptive_field", "localization",
       "head_subsets", "reference_cka", "linear_probe", "load", "Result")


def __getattr__(name: str):
  """The API's names, imported on first use (jax and flax load only then)."""
  if name in API:
    return getattr(importlib.import_module("vitcnn_jax.api"), name)
  if name == "zoo":
    return importlib.import_module("vitcnn_jax.zoo")
  raise AttributeError(f"module 'vitcnn_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted([*globals(), *API, "zoo"])
