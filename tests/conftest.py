"""Shared fixtures; required dependencies fail (not skip) under CI."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def require(module: str):
  """Imports `module`; a missing one skips locally but fails when CI is set."""
  if os.environ.get("CI"):
    return importlib.import_module(module)
  return pytest.importorskip(module)
