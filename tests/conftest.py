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


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def device_env(devices: int) -> dict[str, str]:
  """The environment for a child process with `devices` fake CPU devices; other
  XLA flags of ours (e.g. --xla_cpu_multi_thread_eigen=false) carry over."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  flags.append(f"--xla_force_host_platform_device_count={devices}")
  return dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")


def run_main(*args: str, devices: int = 1, check: bool = True, timeout: int = 300):
  """`python main.py ARGS` in a fresh process with `devices` fake CPU devices."""
  import subprocess  # pylint: disable=g-import-not-at-top
  env = device_env(devices)
  r = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *args], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=timeout)
  if check:
    assert r.returncode == 0, r.stderr[-3000:]
  return r


def pytest_addoption(parser):
  parser.addoption("--tolerances", action="store_true",
                   help="print the largest error/bound ratio of every float32 comparison")


def pytest_terminal_summary(terminalreporter, config):
  if not config.getoption("--tolerances"):
    return
  import numerics  # pylint: disable=g-import-not-at-top
  worst: dict[str, tuple[float, float, float, str]] = {}
  for test, what, err, bound in numerics.RECORD:
    ratio = err / bound if bound else float("inf")
    if test not in worst or ratio > worst[test][0]:
      worst[test] = (ratio, err, bound, what)
  terminalreporter.section("float32 errors against their bounds (largest per test)")
  for test, (ratio, err, bound, what) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
    terminalreporter.write_line(f"{ratio:8.3f}  err {err:.2e}  bound {bound:.2e}  {test}  {what}")
