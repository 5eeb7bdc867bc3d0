"""Python runs in new processes that skip the imports: each is forked from a server
that has imported what main.py imports (multiprocessing's "forkserver"), and sets
its environment (the device count above all) before its JAX backend starts, as a
new interpreter would. A new interpreter spends about 3.5 s importing; a forked one
starts in a few hundredths of a second. `start(ARGV)` is `python ARGV` (a script
and its arguments, -c CODE or -m MODULE and its arguments), returning at once
(concurrent runs, kills); `run(ARGS)` is `python main.py ARGS` to its end."""

from __future__ import annotations

import multiprocessing
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile

# What main.py's runs import; each server imports them once.
PRELOAD = ("jax", "jax.numpy", "flax.linen", "optax", "ml_collections", "scipy.special", "main",
           "vitcnn_jax.jobs", "vitcnn_jax.analyses", "vitcnn_jax.plotting.cka")
_context = None


def _config_from_env(env: dict[str, str]) -> None:
  """JAX reads its JAX_* variables once, at import (in the server): the ones this run
  sets otherwise are applied to its config."""
  import jax
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


def _execute(argv: list[str]) -> None:
  """`python ARGV` in this process, as the interpreter sets sys.argv and sys.path[0]."""
  if argv[0] == "-c":
    sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
    exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
  elif argv[0] == "-m":  # the current folder first on sys.path, the module's file as sys.argv[0]
    sys.argv, sys.path[0] = list(argv[1:]), os.getcwd()
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
  else:
    sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.abspath(argv[0]))
    import main  # preloaded
    if os.path.samefile(argv[0], main.__file__):  # its absl flags exist once: call, not rerun
      sys.exit(main.main(list(argv)))
    runpy.run_path(argv[0], run_name="__main__")


def _child(argv: list[str], env: dict[str, str], cwd: str, out_path: str, err_path: str) -> None:
  """`_execute` with `env` and `cwd`, its output written where file descriptors 1 and 2
  point, its exit status the process's."""
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
    _execute(argv)
    code = 0
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else int(e.code is not None)
  except BaseException:  # a bug: Python would print it, status 1
    import traceback
    traceback.print_exc()
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no clean-up the server's modules did not ask for


class Child:
  """A forked run, like subprocess.Popen with captured text output."""

  def __init__(self, argv: list[str], env: dict[str, str], cwd: str):
    global _context
    if _context is None:
      _context = multiprocessing.get_context("forkserver")
      _context.set_forkserver_preload(list(PRELOAD))
    self.args = list(argv)
    self._dir = tempfile.mkdtemp(prefix="forked_")
    self._out, self._err = os.path.join(self._dir, "out"), os.path.join(self._dir, "err")
    for path in (self._out, self._err):
      open(path, "w").close()
    self._process = _context.Process(target=_child, args=(self.args, dict(env), cwd, self._out,
                                                          self._err))
    self._process.start()
    self.pid = self._process.pid

  def poll(self) -> int | None:
    return self._process.exitcode

  def send_signal(self, sig: int) -> None:
    """As Popen's: nothing once the run has ended (its pid may be reused)."""
    if self.poll() is None:
      os.kill(self.pid, sig)

  def wait(self, timeout: float | None = None) -> subprocess.CompletedProcess:
    """The finished run's exit status and output; killed after `timeout` seconds."""
    self._process.join(timeout)
    if self._process.is_alive():
      os.kill(self.pid, signal.SIGKILL)
      self._process.join()
      shutil.rmtree(self._dir, ignore_errors=True)
      raise subprocess.TimeoutExpired(self.args, timeout)
    with open(self._out) as f, open(self._err) as g:
      out, err = f.read(), g.read()
    shutil.rmtree(self._dir, ignore_errors=True)
    return subprocess.CompletedProcess(self.args, self._process.exitcode, out, err)


def start(argv: list[str], env: dict[str, str], cwd: str) -> Child:
  """Like subprocess.Popen([python, *argv], env=env, cwd=cwd, stdout=PIPE, stderr=PIPE,
  text=True): argv is [SCRIPT, *ARGS] (relative to `cwd`), ["-c", CODE, *ARGS] or
  ["-m", MODULE, *ARGS]."""
  return Child(argv, env, cwd)


def run(args: list[str], env: dict[str, str], cwd: str, timeout: float) -> subprocess.CompletedProcess:
  """Like subprocess.run([python, main.py, *args], env=env, cwd=cwd, capture_output=True,
  text=True, timeout=timeout)."""
  return start(["main.py", *args], env, cwd).wait(timeout)
