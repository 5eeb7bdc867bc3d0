"""A minibatch spread over a group of devices, the memory planner, Gram precisions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from conftest import ROOT
from support.cka_ref import np_hsic1
from support.numerics import assert_close, cka_bound, likely, worst
from vitcnn_jax.run import memory
from vitcnn_jax.run import parallel
from vitcnn_jax.similarity import device_ring
from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import scales

N = 64  # the estimator's minibatch
SIZES = (64, 64, 40)  # the last minibatch is shorter: its rows end in padding


def _layers(rng, rows: int) -> list[np.ndarray]:
  base = rng.standard_normal((rows, 5))
  return [(base @ rng.standard_normal((5, 30)) + rng.standard_normal((rows, 30))).astype(np.float32),
          (3.0 + np.tanh(base[:, :2, None] * rng.standard_normal((rows, 2, 6)))).astype(np.float32),
          (1e-3 * rng.standard_normal((rows, 9))).astype(np.float32)]


def _grouped_hsic(acts: list[np.ndarray], mask: np.ndarray, group: int, stacked: bool = False
                  ) -> np.ndarray:
  """HSIC summed over all minibatches, `group` devices per minibatch, steps of
  (devices / group) minibatches, rows laid out as the pipeline lays them out;
  `stacked`: the layers (of one shape) as one stack (`hsic.stacked_sums`)."""
  mesh = parallel.mesh(group)
  per_step = jax.device_count() // group * N

  def local(m, *a):
    where = (m, parallel.AXES, parallel.GROUP if group > 1 else None)
    out = hsic.stacked_sums([jnp.stack(a)], *where) if stacked else hsic.activation_sums(list(a), *where)
    return {k: (jax.lax.pmax(v, parallel.AXES) if k == "log2_scale" else jax.lax.psum(v, parallel.AXES))
            for k, v in out.items()}

  f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P(parallel.AXES), out_specs=P()))
  steps = -(-len(mask) // per_step)
  pad = lambda x: np.concatenate([x, np.zeros((steps * per_step - len(x), *x.shape[1:]), x.dtype)])
  acts, mask = [pad(a) for a in acts], pad(mask)
  total = 0.0
  for s in range(steps):
    rows = slice(s * per_step, (s + 1) * per_step)
    total = total + scales.unscale(jax.device_get(f(mask[rows], *[a[rows] for a in acts])), measures.SCALES)["hsic"]
  return total


@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("chunk", ["whole layers", "feature slices"])
def test_a_minibatch_spread_over_devices_equals_one_device_holding_it(group, chunk, monkeypatch):
  if chunk == "feature slices":  # slices of 7 features: the loop and a shorter tail
    monkeypatch.setattr(device_ring, "GROUP_SLICE_BYTES", 4 * (N // group) * 7)
  rng = np.random.default_rng(0)
  acts = _layers(rng, N * len(SIZES))
  mask = np.concatenate([(np.arange(N) < n).astype(np.float32) for n in SIZES])
  want = 0.0
  for i, n in enumerate(SIZES):  # each minibatch alone on one device, in float64 NumPy
    rows = slice(i * N, i * N + n)
    want = want + np.asarray([[np_hsic1(a[rows], b[rows]) for b in acts] for a in acts])
  got = _grouped_hsic(acts, mask, group)
  scale = np.sqrt(np.outer(np.diag(want), np.diag(want)))
  # Per minibatch one float32 HSIC: the mean (N terms), the Gram (30), the U-centring
  # (2N) and the dot (N*N), relative to the scale by Cauchy-Schwarz; then the sums
  # over the group's row blocks and over the minibatches.
  bound = likely(N, 30, 2 * N, N * N) + worst(group + len(SIZES))
  err = assert_close(got / scale, want / scale, bound, f"{group} devices per minibatch, {chunk}")
  print(f"{group} devices per minibatch, {chunk}: max relative HSIC error {err:.1e}")


@pytest.mark.parametrize("group", [1, 4])
def test_stacked_layers_on_one_device_or_spread_over_a_group(group):
  """`stacked_sums` (localization's tokens and patches: one batched program on a
  device, the layers one by one over a group) equals float64 NumPy either way."""
  rng = np.random.default_rng(3)
  base = rng.standard_normal((N * len(SIZES), 4))
  acts = [(base @ rng.standard_normal((4, 12)) + rng.standard_normal((len(base), 12))).astype(np.float32)
          for _ in range(3)]
  mask = np.concatenate([(np.arange(N) < n).astype(np.float32) for n in SIZES])
  want = 0.0
  for i, n in enumerate(SIZES):
    rows = slice(i * N, i * N + n)
    want = want + np.asarray([[np_hsic1(a[rows], b[rows]) for b in acts] for a in acts])
  got = _grouped_hsic(acts, mask, group, stacked=True)
  scale = np.sqrt(np.outer(np.diag(want), np.diag(want)))
  # As above, with Grams of 12 features.
  bound = likely(N, 12, 2 * N, N * N) + worst(group + len(SIZES))
  assert_close(got / scale, want / scale, bound, f"stacked, {group} devices per minibatch")


def test_grouped_moments_add_up_to_the_minibatch_ones():
  rng = np.random.default_rng(1)
  acts = _layers(rng, N)
  mask = np.ones(N * 2, np.float32)
  mask[N:] = 0  # a second, all-padding minibatch
  acts = [np.concatenate([a, a]) for a in acts]
  mesh = parallel.mesh(4)

  def local(m, *a):
    out = hsic.activation_sums(list(a), m, parallel.AXES, parallel.GROUP)
    return jax.lax.psum(out["moments"] * grams.pow2(4 * out["log2_scale"]), parallel.AXES)

  f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P(parallel.AXES), out_specs=P()))
  got = np.asarray(f(mask, *acts), np.float64)
  want = [N * np.sum(np.mean(a[:N].reshape(N, -1).astype(np.float64), axis=0) ** 4) for a in acts]
  np.testing.assert_allclose(got, want, rtol=worst(4 * 30 + 8))


# --- the planner ----------------------------------------------------------------------


def test_the_planner_takes_the_smallest_group_that_fits():
  peaks = {1: 40, 2: 22, 4: 13, 8: 8}  # GiB by group size, for a minibatch of 1,024
  calls = []

  def peak(minibatch, group):
    calls.append((minibatch, group))
    return int(peaks[group] * minibatch / 1024 * memory.GIB)

  plan = memory.choose(1024, 8, peak, 16 * memory.GIB)
  assert (plan.devices_per_minibatch, plan.rows) == (4, 256)
  assert calls == [(1024, 1), (1024, 2), (1024, 4)]  # stops at the first that fits
  assert "minibatch 1,024 over 4 devices (256 rows each): 13.00 of 16.0 GiB" in plan.describe()
  assert memory.choose(1024, 8, peak, 80 * memory.GIB).devices_per_minibatch == 1
  with pytest.raises(MemoryError, match=r"largest minibatch that fits over 8 devices is about 512 "
                                        r"\(halving from 1,024\): set config.batch_size=512"):
    memory.choose(1024, 8, peak, 6 * memory.GIB)
  with pytest.raises(MemoryError, match="no minibatch of at least 4 fits"):
    memory.choose(1024, 8, peak, 1)
  with pytest.raises(ValueError, match="devices_per_minibatch=3 must divide both the 8 devices"):
    memory.choose(1024, 8, peak, 16 * memory.GIB, fixed=3)


def test_the_heap_that_free_keeps_goes_back_to_the_os():
  """`memory.release_freed` returns the pages of freed heap blocks that glibc keeps
  (as it keeps the compiler's): 64 MiB of 64 KiB blocks freed between live ones
  stay resident after free() and go after it (in a child process: its own heap)."""
  import subprocess
  import sys
  code = """
import ctypes, os
from vitcnn_jax.run import memory
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
blocks = [libc.malloc(64 << 10) for _ in range(2048)]  # below glibc's mmap threshold: on the heap
for p in blocks:
  ctypes.memset(p, 1, 64 << 10)
before = rss()
for p in blocks[::2]:  # every other one: a live block after each
  libc.free(p)
kept = rss()
memory.release_freed()
print(before, kept, rss())
"""
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  before, kept, after = map(int, r.stdout.split()[-3:])
  freed = 64 << 20
  assert before - kept < freed / 10, ("free() alone handed the blocks back: nothing left to test",
                                      before, kept)
  assert kept - after > 0.9 * freed, (before, kept, after)


def test_one_memory_limit_for_the_device_the_config_and_the_benchmark(monkeypatch):
  """A 16 GiB device's own figure, config.device_memory_gib=16 and paper_scale's
  PLAN for 16 GiB give one limit, with the planner's headroom: a step of 14.5 GiB
  does not fit (it did in the benchmark's plans, compared with the full 16)."""
  from benchmarks import paper_scale

  class Device:
    def memory_stats(self):
      return {"bytes_limit": 16 * memory.GIB}

  limit = memory.device_limit(16)
  assert limit == int(16 * memory.GIB * memory.HEADROOM) < 14.5 * memory.GIB
  monkeypatch.setattr(jax, "local_devices", lambda: [Device()])
  assert memory.device_limit() == limit
  peak = lambda minibatch, group: int(14.5 / group * memory.GIB)
  plan = paper_scale.plan_for(16, peak)
  assert (plan.limit_bytes, plan.devices_per_minibatch) == (limit, 2)


# --- Gram precisions ------------------------------------------------------------------


# Dot algorithms XLA's CPU backend refuses; the others it runs (in float32).
CPU_UNSUPPORTED = {"bf16_9x", "tf32_3x"}


@pytest.mark.parametrize("name", sorted(grams.GRAM_PRECISIONS))
def test_each_gram_precision_against_float64(name):
  rng = np.random.default_rng(2)
  acts = _layers(rng, N)
  sums = jax.jit(lambda *a: hsic.activation_sums(list(a), precision=grams.gram_precision(name)))
  if jax.default_backend() == "cpu" and name in CPU_UNSUPPORTED:
    with pytest.raises(Exception, match="not supported"):
      sums(*acts)
    return
  want = np.asarray([[np_hsic1(a, b) for b in acts] for a in acts])
  got = scales.unscale(jax.device_get(sums(*acts)), measures.SCALES)["hsic"]
  scale = np.sqrt(np.outer(np.diag(want), np.diag(want)))
  err = assert_close(got / scale, want / scale, cka_bound(N, 30),
                     f"gram_precision={name} on {jax.default_backend()}")
  print(f"gram_precision={name} on {jax.default_backend()}: max relative HSIC error {err:.1e}")


def test_auto_precision_per_backend_and_bad_names():
  assert grams.gram_precision("auto", "cpu") == jax.lax.Precision.HIGHEST
  assert grams.gram_precision("auto", "tpu") == jax.lax.Precision.HIGHEST
  assert grams.gram_precision("auto", "gpu") == jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X6
  with pytest.raises(ValueError, match="'fp16' is not one of"):
    grams.gram_precision("fp16")


def test_grouped_steps_are_kept_out_of_the_persistent_cache_on_cpu():
  """Inside `uncached` of a grouped mesh, nothing compiled is written to the
  persistent cache (its minimum compile time is out of reach); outside, and for
  one device per minibatch, the cache is as configured."""
  key = "jax_persistent_cache_min_compile_time_secs"
  before = getattr(jax.config, key)
  with parallel.uncached(parallel.mesh(2)):
    assert getattr(jax.config, key) >= 1e30
  assert getattr(jax.config, key) == before
  with parallel.uncached(parallel.mesh(1)):
    assert getattr(jax.config, key) == before
  with pytest.raises(RuntimeError), parallel.uncached(parallel.mesh(4)):
    raise RuntimeError("a failed compile")
  assert getattr(jax.config, key) == before  # restored on errors too


def test_the_persistent_compilation_cache_is_on_by_default_and_can_be_moved_or_turned_off(
    tmp_path, monkeypatch):
  """`config.compilation_cache` over VITCNN_JAX_COMPILATION_CACHE over JAX's own
  folder over CACHE_DIR/xla; "none" turns it off; a file is refused by name.
  `programs.use_compilation_cache` sets JAX's cache to the folder chosen."""
  import ml_collections
  from vitcnn_jax.run import control
  from vitcnn_jax.run import programs
  config = ml_collections.ConfigDict({"cache_dir": str(tmp_path / "c"), "compilation_cache": ""})
  monkeypatch.delenv(control.COMPILATION_CACHE_ENV, raising=False)
  assert control.compilation_cache(config, None) == str(tmp_path / "c" / "xla")
  assert control.compilation_cache(config, "/jax/own") == "/jax/own"
  monkeypatch.setenv(control.COMPILATION_CACHE_ENV, str(tmp_path / "env"))
  assert control.compilation_cache(config, "/jax/own") == str(tmp_path / "env")
  monkeypatch.setenv(control.COMPILATION_CACHE_ENV, "none")
  assert control.compilation_cache(config, "/jax/own") is None
  config.compilation_cache = str(tmp_path / "field")
  assert control.compilation_cache(config, "/jax/own") == str(tmp_path / "field")
  (tmp_path / "file").write_text("")
  config.compilation_cache = str(tmp_path / "file")
  with pytest.raises(ValueError, match="config.compilation_cache=.*is a file"):
    control.compilation_cache(config, None)
  before = jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache
  try:
    programs.use_compilation_cache(str(tmp_path / "field"))
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "field")
    assert jax.config.jax_enable_compilation_cache
    programs.use_compilation_cache(None)
    assert not jax.config.jax_enable_compilation_cache
  finally:
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_enable_compilation_cache", before[1])
