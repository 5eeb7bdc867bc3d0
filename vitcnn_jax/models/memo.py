"""What a model's architecture alone decides, computed once a process."""

from __future__ import annotations

import functools
from typing import Callable


def per_architecture(fn: Callable) -> Callable:
  """`fn(model, *keys)` made once per distinct arguments, for what an architecture
  alone decides and costs a trace (a sweep or a notebook asks many times); with a
  model that does not hash (a list field) it runs each time."""
  cached = functools.lru_cache(maxsize=64)(fn)

  @functools.wraps(fn)
  def call(*args):
    try:
      hash(args)
    except TypeError:
      return fn(*args)
    return cached(*args)
  return call
