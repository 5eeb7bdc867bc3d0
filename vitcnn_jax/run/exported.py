"""Steps kept across processes as exported programs, so that a later run with
the same program traces no model.

JAX's persistent compilation cache hands a new process XLA's work, but JAX still
traces and lowers every program to find it there: for a small pair of models
that is most of what a warm process spends compiling. A step that says what
decides its program (`programs.Step`'s key) is therefore also kept as a
`jax.export` artifact (serialized StableHLO; no pickle) beside that cache, and a
later process with the same key and input signature calls the artifact instead
of tracing the models again.

The file's name is a digest of everything the traced program can depend on: the
step's key and input signature, the package's source, JAX's version and the
devices. A key whose text could hide a difference (an address, an elided array)
is never kept. Only single-process runs keep steps, and only where the
persistent cache takes every program (`programs.use_compilation_cache`; grouped
CPU steps stay out, `parallel.uncached`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
from typing import Any, Callable

import jax

from vitcnn_jax import fileio
from vitcnn_jax.similarity import lapack

_LOG = logging.getLogger(__name__)
FOLDER = "exported_steps"  # inside JAX's persistent compilation cache folder


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
  """sha256 of the package's Python source: any change to it is a new program."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  h = hashlib.sha256()
  for folder, dirs, files in sorted(os.walk(root)):
    dirs.sort()
    for name in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(folder, name)
      h.update(os.path.relpath(path, root).encode() + b"\0")
      with open(path, "rb") as f:
        h.update(f.read() + b"\0")
  return h.hexdigest()


def path_for(key: Any, signature: Any) -> str | None:
  """Where the step of `key` for inputs of `signature` is kept; None where it is
  not kept (no local persistent cache taking every program, several processes,
  or a key whose text does not say all of it)."""
  folder = jax.config.jax_compilation_cache_dir
  if (not jax.config.jax_enable_compilation_cache or not folder or fileio.is_remote(folder)
      or jax.process_count() > 1 or jax.config.jax_persistent_cache_min_compile_time_secs > 0):
    return None
  text = repr((key, signature))
  if " at 0x" in text or "..." in text:  # an object's address, or an array numpy elided
    return None
  devices = [(d.platform, d.device_kind, d.id) for d in jax.devices()]
  # How the CPU's LAPACK runs decides the program (`lapack.eigh`); asking also sets it
  # in this process, which runs the kept program without tracing the step that would.
  cpu_lapack = lapack.single_threaded() if jax.default_backend() == "cpu" else None
  what = repr((text, source_digest(), jax.__version__, devices, jax.config.jax_enable_x64,
               jax.config.jax_default_matmul_precision, cpu_lapack))
  return os.path.join(folder, FOLDER, hashlib.sha256(what.encode()).hexdigest() + ".jax_exported")


def compile_step(fn: Callable, args: tuple, path: str | None) -> jax.stages.Compiled:
  """`fn` (a jitted step) compiled for `args`: traced and lowered as usual where
  `path` is None; else called through the program kept at `path`, exported
  there first if it is not (an unreadable file is named, dropped and made again)."""
  program = None if path is None else _read(path) or _export(fn, args, path)
  if program is None:
    return fn.lower(*args).compile()

  def kept_step(*a):  # the name JAX's compile logs give it
    return program.call(*a)

  return jax.jit(kept_step).lower(*args).compile()


# A kept step is only read by the JAX version that wrote it (it is in the file's
# name), so custom calls need no promise of compatibility across versions (the
# CPU's LAPACK calls have none).
_ANY_CUSTOM_CALL = (jax.export.DisabledSafetyCheck.custom_call("ALL"),)


def _export(fn: Callable, args: tuple, path: str) -> jax.export.Exported | None:
  """`fn` exported for `args` and written to `path`; None where JAX cannot
  export it (the step is then compiled as usual, and a tracing error raised there)."""
  try:
    program = jax.export.export(fn, disabled_checks=_ANY_CUSTOM_CALL)(*args)
  except Exception as e:  # not exportable: compiled the usual way, which raises a real error again
    _LOG.debug("Step not kept for later processes (%s: %s).", type(e).__name__, e)
    return None
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fileio.atomic_write(path, lambda f: f.write(program.serialize()))
  return program


def _read(path: str) -> jax.export.Exported | None:
  """The kept step at `path`; None where there is none, or only a damaged file
  (removed: another process may have removed it first)."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except FileNotFoundError:
    return None
  try:
    return jax.export.deserialize(bytearray(data))
  except Exception as e:  # any damage to the file: it is only a cache
    _LOG.warning("The kept step %s could not be read (%s: %s); it is removed and compiled again.",
                 path, type(e).__name__, e)
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
    return None
