"""Shared fixtures; required dependencies fail (not skip) under CI."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Every in-process test sees 8 fake CPU devices (set before JAX is imported), so
# analyses run sharded everywhere; child processes choose their own count.
IN_PROCESS_DEVICES = 8
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={IN_PROCESS_DEVICES}").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tests' programs are tiny and their time is XLA compiling them: on CPU they are
# compiled with LLVM's optimizations off (XLA's own HLO passes run as for users),
# which cuts most of LLVM's share of the compile. The arithmetic is the same
# up to the order of float32 sums, which every bound here allows for (as for
# another CPU). The runtime venv's notebook run keeps the users' default (`users_env`).
TEST_ONLY_XLA_FLAG = "--xla_backend_optimization_level=0"
if os.environ["JAX_PLATFORMS"] == "cpu" and "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " " + TEST_ONLY_XLA_FLAG
# One compilation cache for this test session and its child processes: the same
# models and steps recur across tests (fresh per session: nothing carries over).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit
  import shutil
  import tempfile
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="vitcnn_jax_xla_cache_")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


def require(module: str):
  """Imports `module`; a missing one skips locally but fails when CI is set."""
  if os.environ.get("CI"):
    return importlib.import_module(module)
  return pytest.importorskip(module)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The notebook API's results only, for runs whose figures another test checks (each
# analysis's own module).
NO_FIGURES = {"plot": {"format": "none"}}


def device_env(devices: int) -> dict[str, str]:
  """The environment for a child process with `devices` fake CPU devices; other
  XLA flags of ours (e.g. --xla_cpu_multi_thread_eigen=false) carry over."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  flags.append(f"--xla_force_host_platform_device_count={devices}")
  return dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")


def users_env(**extra: str) -> dict[str, str]:
  """This process's environment with XLA compiling as it does for users (no
  `TEST_ONLY_XLA_FLAG`), and `extra`."""
  flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != TEST_ONLY_XLA_FLAG)
  return dict(os.environ, XLA_FLAGS=flags, **extra)


def run_main(*args: str, devices: int | None = None, check: bool = True, timeout: int = 300):
  """`python main.py ARGS`: main.py's own `main()` in this process when `devices`
  is None (its exit status and output, a bug's traceback as exit status 1), or in
  a new process with `devices` fake CPU devices (`forked`: one that skips the imports)."""
  if devices is None:
    r = _in_process(args)
  else:
    from support import forked
    r = forked.run(list(args), device_env(devices), ROOT, timeout)
  if check:
    assert r.returncode == 0, r.stderr[-3000:]
  return r


def _in_process(args):
  import contextlib
  import io
  import subprocess
  import traceback
  import main
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      code = main.main(["main.py", *args])
    except Exception:  # a bug: Python would print it, status 1
      traceback.print_exc()
      code = 1
  return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def pytest_addoption(parser):
  parser.addoption("--tolerances", action="store_true",
                   help="print the largest error/bound ratio of every float32 comparison")


@pytest.fixture(autouse=True)
def _tolerances(request):
  """Moves this test's float32 comparisons into its report, so that they reach
  the summary from pytest-xdist's worker processes too."""
  from support import numerics
  yield
  request.node.user_properties += [("tolerance", (str(t), str(w), float(e), float(b)))
                                   for t, w, e, b in numerics.RECORD]
  numerics.RECORD.clear()


def pytest_terminal_summary(terminalreporter, config):
  if not config.getoption("--tolerances"):
    return
  records = [value for reports in terminalreporter.stats.values() for r in reports
             if getattr(r, "when", "") == "teardown"
             for key, value in getattr(r, "user_properties", ()) if key == "tolerance"]
  worst: dict[str, tuple[float, float, float, str]] = {}
  for test, what, err, bound in records:
    ratio = err / bound if bound else float("inf")
    if test not in worst or ratio > worst[test][0]:
      worst[test] = (ratio, err, bound, what)
  terminalreporter.section("float32 errors against their bounds (largest per test)")
  for test, (ratio, err, bound, what) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
    terminalreporter.write_line(f"{ratio:8.3f}  err {err:.2e}  bound {bound:.2e}  {test}  {what}")


def forward(model, params, images, capture=None) -> dict:
  """{point: activation} of one compiled forward (eager Flax is many times slower),
  in the model's order (a compiled function returns dicts sorted by key)."""
  import jax
  kw = {} if capture is None else {"capture": capture if isinstance(capture, str) else tuple(capture)}
  order = []

  def f(p, x):
    out = model.apply({"params": p}, x, **kw)[1]
    order.extend(out)
    return out

  out = jax.jit(f)(params, images)
  return {k: out[k] for k in order}


def compiled(model, params, images, **kw):
  """`model.apply` as one compiled program: (logits, points). Eager Flax compiles
  each op of each shape apart, several times the time for a parity check."""
  import jax
  return jax.jit(lambda p, x: model.apply({"params": p}, x, **kw))(params, images)



def load_stating_everything(folder, caplog, fields: dict | None = None):
  """`checkpoints.load(folder)`, asserting that nothing was assumed (no field, no
  warning) and that the model's `fields` are as given."""
  import logging
  from vitcnn_jax import checkpoints
  with caplog.at_level(logging.WARNING, "vitcnn_jax"):
    c = checkpoints.load(folder)
  assert not c.assumed and "assumed" not in caplog.text, (c.assumed, caplog.text)
  for field, value in (fields or {}).items():
    assert getattr(c.model, field) == value, (folder, field, getattr(c.model, field))
  return c

@pytest.fixture(params=["cache-sized slices", "slices of a few features", "one dot"])
def gram_path(request, monkeypatch):
  """Each way a layer's Gram is made (`grams._gram_parts`): the CPU's slices as
  configured (one slice for these small layers), slices of 2-5 features (the
  loop and, where no divisor fits, its tail, each slice's mean from the slice;
  the flattened Grams' products are
  sliced too, `grams.flat_products`), and one dot over the centred copy (GPU
  and TPU)."""
  import jax
  from vitcnn_jax.similarity import grams
  if request.param == "slices of a few features":
    monkeypatch.setattr(grams, "CACHE_SLICE_BYTES", 4 * 16 * 3)  # 16 rows: 3 features a slice
  if request.param == "one dot":
    monkeypatch.setattr(grams, "SLICED_BACKENDS", ())
  jax.clear_caches()  # programs traced with the other path
  yield request.param
  jax.clear_caches()


@pytest.fixture(scope="module")
def tiny_vit_bit(tmp_path_factory) -> tuple[str, str]:
  """A tiny ViT (vision_transformer format, 32 px, patch 8) and BiT (big_transfer
  format, two stages of one unit: the first stage's stride-1 and the second's
  stride-2 unit, half the compile of four) checkpoint: the CKA jobs' test pair."""
  from support import upstream_files as uf
  d = tmp_path_factory.mktemp("ckpt")
  vit = uf.save(d / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8))
  bit = uf.save(d / "bit.npz", uf.bt_bit(0, depth=(1, 1)))
  return vit, bit
