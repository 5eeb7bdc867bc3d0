"""`python main.py ARGS` in a new process that skips the imports: each run is forked
from a server that has imported what main.py imports (multiprocessing's
"forkserver"), and sets its environment (the device count above all) before its
JAX backend starts, as a new interpreter would. A new interpreter spends about
3.5 s importing; a forked one starts in a few hundredths of a second."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile

# What main.py's runs import; each server imports them once.
PRELOAD = ("jax", "jax.numpy", "flax.linen", "optax", "ml_collections", "scipy.stats", "main",
           "vitcnn_jax.jobs", "vitcnn_jax.analyses", "vitcnn_jax.plotting")
_context = None


def _config_from_env(env: dict[str, str]) -> None:
  """JAX reads its JAX_* variables once, at import (in the server): the ones this run
  sets otherwise are applied to its config."""
  import jax  # pylint: disable=g-import-not-at-top
  for name, value in env.items():
    key = name.lower()
    if not name.startswith("JAX_") or not hasattr(jax.config, key):
      continue
    current = getattr(jax.config, key)
    if isinstance(current, bool):
      value = value.lower() in ("1", "true", "yes", "on")
    elif isinstance(current, (int, float)):
      value = type(current)(value)
    if value != current:
      jax.config.update(key, value)


def _child(args: list[str], env: dict[str, str], cwd: str, out_path: str, err_path: str) -> None:
  """main.main(ARGS) with `env`, its output written where file descriptors 1 and 2 point,
  its exit status the process's."""
  os.environ.clear()
  os.environ.update(env)
  os.chdir(cwd)
  for fd, path in ((1, out_path), (2, err_path)):
    f = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.dup2(f, fd)
    os.close(f)
  code = 1
  try:
    _config_from_env(env)
    import main  # pylint: disable=g-import-not-at-top
    code = main.main(["main.py", *args])
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else int(e.code is not None)
  except BaseException:  # pylint: disable=broad-except  (a bug: Python would print it, status 1)
    import traceback  # pylint: disable=g-import-not-at-top
    traceback.print_exc()
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access  (no clean-up the server's modules did not ask for)


def run(args: list[str], env: dict[str, str], cwd: str, timeout: float) -> subprocess.CompletedProcess:
  """Like subprocess.run([python, main.py, *args], env=env, cwd=cwd, capture_output=True,
  text=True, timeout=timeout)."""
  global _context
  if _context is None:
    _context = multiprocessing.get_context("forkserver")
    _context.set_forkserver_preload(list(PRELOAD))
  with tempfile.TemporaryDirectory() as d:
    out, err = os.path.join(d, "out"), os.path.join(d, "err")
    for path in (out, err):
      open(path, "w").close()
    p = _context.Process(target=_child, args=(list(args), dict(env), cwd, out, err))
    p.start()
    p.join(timeout)
    if p.is_alive():
      p.kill()
      p.join()
      raise subprocess.TimeoutExpired(["main.py", *args], timeout)
    with open(out) as f, open(err) as g:
      return subprocess.CompletedProcess(args, p.exitcode, f.read(), g.read())
