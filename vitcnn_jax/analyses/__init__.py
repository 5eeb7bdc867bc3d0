"""The analyses, one module each, found by name: every module here that ends
with a `DECLARATION` (`vitcnn_jax/run/declaration.py`) is one, and nothing else
needs to know of it (`main.py`, the notebook API, the configs and the report
read its declaration). Any other module here is a part of one analysis, named
for it (`cka_findings`: the findings `cka` declares)."""

from __future__ import annotations

import importlib

from vitcnn_jax.run import declaration


def names() -> list[str]:
  return declaration.names()


def get(name: str) -> declaration.Declaration:
  """The declaration of analysis `name`."""
  if name not in declaration.names():
    raise ValueError(f"{name!r} is not an analysis; they are {declaration.names()}.")
  return importlib.import_module(f"{__name__}.{name}").DECLARATION
