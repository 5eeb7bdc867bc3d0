"""Compiled programs: each compiled once, then reused.

Within a process, a pass's step is kept by what decides its program and by its
inputs' signature (`Step`): a notebook's second call, or a report's next
section on the same models, compiles nothing. Across processes, JAX's
persistent compilation cache (`use_compilation_cache`, on by default under the
project's cache folder) hands a run the programs an earlier run compiled.
"""

from __future__ import annotations

import collections
import contextlib
import gc
from typing import Callable, Iterator

import jax
import numpy as np

from vitcnn_jax.run import exported
from vitcnn_jax.run import memory

_JAX_OWN: list[str | None] = []  # JAX's cache folder as the user set it, before ours


def users_compilation_cache() -> str | None:
  """The persistent compilation cache folder JAX had before any run of ours set
  one (JAX_COMPILATION_CACHE_DIR, or the user's own `jax.config` setting)."""
  if not _JAX_OWN:
    _JAX_OWN.append(jax.config.jax_compilation_cache_dir or None)
  return _JAX_OWN[0]


def use_compilation_cache(folder: str | None) -> None:
  """JAX's persistent compilation cache in `folder` (None: off), every program
  written to it: a later process compiling the same program reads it back
  instead of compiling. JAX's default skips programs compiled in under a second,
  and those are most of a job's (a comparison's pair programs, a measure's steps
  at a new shape): a process would compile them all again. Grouped CPU steps
  still stay out of it (`parallel.uncached`)."""
  users_compilation_cache()  # read before the first change
  if folder is not None:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  if folder == (jax.config.jax_compilation_cache_dir or None):
    return
  jax.config.update("jax_enable_compilation_cache", folder is not None)
  if folder is not None:
    jax.config.update("jax_compilation_cache_dir", folder)


# Compiled steps kept for later runs in this process (a notebook's next call, a
# report's next section), by program and input signature; the oldest dropped first.
KEEP_COMPILED = 16
_COMPILED: collections.OrderedDict[tuple, jax.stages.Compiled] = collections.OrderedDict()


class Step:
  """A pass's step over the mesh, compiled once per input signature (shapes,
  dtypes, shardings) before it first runs, then the host memory the compiler
  freed handed back (`memory.release_freed`: run at once, the step's buffers
  would add to it). A pass that says what its program is (`Pass.program`) shares
  its compiled steps with every later run of the same program in this process:
  no trace, no compile; and, through `exported`, with later processes: no trace
  of the models. The cache holds compiled programs, not the pass or its models'
  parameters.

  `make(prescale)` gives the function: its layers made from the features as they
  are, or with `prescale` scaled first (`grams.Parts`), the program a minibatch
  is run again with where a layer left float32's range; compiled only then."""

  def __init__(self, make: Callable[[bool], Callable], key: tuple | None):
    self._make, self._key, self._own = make, key, {}

  def compiled(self, *args, prescale: bool = False) -> jax.stages.Compiled:
    """The step compiled for `args` (arrays, or `jax.ShapeDtypeStruct`s with shardings)."""
    signature = _signature(args)
    cache = self._own if self._key is None else _COMPILED
    key = (self._key, prescale, signature)
    if key in cache:
      if cache is _COMPILED:
        _COMPILED.move_to_end(key)
      return cache[key]
    path = None if self._key is None else exported.path_for((self._key, prescale), signature)
    with _no_cycle_collection():
      cache[key] = exported.compile_step(self._make(prescale), args, path)
    memory.release_freed()
    while len(_COMPILED) > KEEP_COMPILED:
      _COMPILED.popitem(last=False)
    return cache[key]

  def __call__(self, *args, prescale: bool = False):
    return self.compiled(*args, prescale=prescale)(*args)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
  """Python's cycle collector paused (as `timeit` does): tracing a large step
  makes enough objects to start a full collection over every object of the
  process, 0.11 s of workload W's 0.8 s trace on 2 cores. Its garbage is
  collected after, as usual."""
  was = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if was:
      gc.enable()


def _signature(args) -> tuple:
  leaves, tree = jax.tree.flatten(args)
  return tree, tuple((tuple(np.shape(a)), np.dtype(a.dtype).str, bool(getattr(a, "weak_type", False)),
                      getattr(a, "sharding", None)) for a in leaves)
