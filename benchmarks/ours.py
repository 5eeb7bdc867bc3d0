"""Our side of the CKA benchmark: the sharded CKA step as a user runs it (compile
included, then warm), our forward alone, the FLOPs of both, and the step with one
measure or all of them."""

from __future__ import annotations

import os
import time

import numpy as np

from benchmarks import clocks
from benchmarks import peaks
from benchmarks import workload

# Every measure of vitcnn_jax.similarity.measures.NAMES, with the null (issue 34's budget: at most 1.3x
# the time of the step with linear CKA alone, forward included, and 1.1x its peak memory).
MEASURED = "all"


def step_inputs(s: workload.Setup, models, measures: tuple[str, ...] | str | None = None, null: bool = False):
  """The compiled-on-first-call step (with `measures`, "all": every one; None: the
  job's default), replicated params and the global (images, mask) minibatches."""
  import ml_collections
  from vitcnn_jax.analyses import cka as cka_job
  from vitcnn_jax.inputs import preprocess
  from vitcnn_jax.run import driver
  from vitcnn_jax.run import parallel
  from vitcnn_jax.similarity import measures as all_measures
  for m in models:  # the peers' inputs are normalised with the workload's stats
    assert np.allclose(preprocess.stats(m.policy), s.stats), (m.policy, s.stats)
  mesh = parallel.mesh()
  by_key = {m.name: m for m in models}
  fields = dict(repeats=1, num_examples=s.images, batch_size=s.batch)
  if measures is not None:
    fields.update(measures=all_measures.NAMES if measures == "all" else measures, null=null)
  step = driver.compile_pass(cka_job.CKA(ml_collections.ConfigDict(fields), by_key), by_key, mesh)
  params = [parallel.replicate(mesh, m.params) for m in models]
  images = workload.images(s)
  mask = np.ones((s.batch,), np.float32)
  batches = [(parallel.global_batch(mesh, images[i:i + s.batch]), parallel.global_batch(mesh, mask))
             for i in range(0, s.images, s.batch)]
  return step, params, batches


def _runner(step, params, batches):
  """The step compiled (as the driver does) and a call of it on one minibatch
  (images, mask), returning that minibatch's HSIC sums on the host."""
  import jax
  from vitcnn_jax.similarity import hsic
  from vitcnn_jax.similarity import scales
  step = step.compiled(params, None, [batches[0][0]] * 2, batches[0][1], batches[0][1], None)
  return lambda x, m: scales.unscale(jax.device_get(step(params, None, [x, x], m, m, None)), hsic.SCALES)["hsic"]


def part_ours(s: workload.Setup) -> dict:
  """Our sharded CKA step over all minibatches, timed as a user runs it (the first
  call compiles, or reads the compilation cache), then once more warm; plus
  forward-only time and FLOP counts."""
  if s.cache:
    clocks.enable_cache(s.cache)
  import jax
  from vitcnn_jax.similarity import linear_cka
  models = workload.jax_models(s)
  step, params, batches = step_inputs(s, models)
  rates = [clocks.matmul_rate(2048)]
  clock = clocks.CompileClock()  # JAX's compile events from here; rates before, between, after the work
  t = time.perf_counter()  # the run a user makes: compile (as the driver does), every minibatch, the CKA
  run = _runner(step, params, batches)
  sums = run(*batches[0])
  first_s = time.perf_counter() - t
  compile_phases = dict(clock.phases)
  sums = sums + sum(run(x, m) for x, m in batches[1:])
  ours_cka = linear_cka.cka_from_hsic(sums, [n for m in models for n in m.names])
  total_s = time.perf_counter() - t
  t = time.perf_counter()
  run(*batches[0])  # the first minibatch again, warm: the rest of first_s was compiling
  compile_s = first_s - (time.perf_counter() - t)
  second_s = second_diff = None
  if s.second:
    t = time.perf_counter()  # a notebook's second call: the step built again, every minibatch
    step, params, batches = step_inputs(s, models)
    run = _runner(step, params, batches)
    again = sum(run(x, m) for x, m in batches)
    second_s = time.perf_counter() - t
    second_diff = float(np.abs(again - sums).max() / np.abs(sums).max())
  rates.append(clocks.matmul_rate(2048))
  forward_s, fwd_flops = _forward(models, params, batches)
  gram_flops = _gram_flops(s, models, len(batches))
  rates.append(clocks.matmul_rate(2048))
  np.save(s.path("ours.npy"), ours_cka)
  return dict(total_s=total_s, ours_s=total_s - compile_s, compile_s=compile_s, forward_s=forward_s,
              second_s=second_s, second_diff=second_diff, device_peak_gib=peaks.device_peak_gib(s.device),
              compile_phases=compile_phases,
              fwd_flops=fwd_flops, gram_flops=gram_flops,
              matmul_flops_per_s=max(rates),  # the machine at its best: rates moved 2x on shared machines
              layers_x=len(models[0].names), layers_y=len(models[1].names), peak_gib=peaks.process_gib(),
              cache_entries=len(os.listdir(s.cache)) if s.cache else 0, jax=jax.__version__,
              backend=f"{jax.devices()[0].device_kind} ({jax.default_backend()})")


def _forward(models, params, batches) -> tuple[float, float]:
  """Seconds of our two forwards alone over every minibatch (compiled first) and
  their FLOPs, counted from the jaxpr (`clocks.matmul_flops`): XLA's GPU cost
  analysis leaves out cuBLAS calls."""
  import jax
  from vitcnn_jax.inputs import preprocess

  def forward(ps, x):
    return [m.model.apply({"params": p}, preprocess.normalize(x, m.policy), capture=())[0]
            for m, p in zip(models, ps)]

  fwd = jax.jit(forward)
  jax.block_until_ready(fwd(params, batches[0][0]))
  t = time.perf_counter()
  for x, _ in batches:
    jax.block_until_ready(fwd(params, x))
  forward_s = time.perf_counter() - t
  return forward_s, clocks.matmul_flops(jax.make_jaxpr(forward)(params, batches[0][0]).jaxpr) * len(batches)


def _point_dims(s: workload.Setup, models) -> list[int]:
  """The features of every captured point of both models, a minibatch's row each."""
  from vitcnn_jax.models import representations
  return [int(np.prod(v.shape[1:])) for m in models
          for v in representations.point_shapes(m.model, m.params, m.names, s.batch).values()]


def _gram_flops(s: workload.Setup, models, steps: int) -> int:
  """FLOPs of every captured point's Gram and the HSIC of every pair over `steps` minibatches."""
  dims = _point_dims(s, models)
  layers = len(dims)
  return steps * (sum(2 * s.batch * s.batch * d for d in dims) + 2 * layers * layers * s.batch**2)


def part_gram_dots(s: workload.Setup) -> dict:
  """Seconds of one bare (batch, D) x (D, batch) float32 dot at each captured
  point's D, the best of 3 calls, over every minibatch: the Grams at the rate
  this backend reaches on their own shapes (a skinny product at W's 32 rows),
  where the FLOP bound takes a square matmul's. A part of its own, so that its
  programs stay out of our runs' compilation cache."""
  import collections

  import jax
  import jax.numpy as jnp
  models = workload.jax_models(s)
  dot = jax.jit(lambda x: jnp.matmul(x, x.T, precision=jax.lax.Precision.HIGHEST))
  total = 0.0
  for d, count in collections.Counter(_point_dims(s, models)).items():
    x = jax.random.normal(jax.random.key(0), (s.batch, d), jnp.float32)
    total += count * clocks.best_seconds(lambda x=x: dot(x).block_until_ready(), 3)
  return dict(gram_dots_s=-(-s.images // s.batch) * total)


def part_step(s: workload.Setup, measures: tuple[str, ...] | str = ("linear_cka",), null: bool = False) -> dict:
  """The time of the sharded CKA step (forward and measures) over every minibatch,
  with `measures` ("all": every one)."""
  import jax
  from vitcnn_jax.run import driver
  from vitcnn_jax.run import memory
  from vitcnn_jax.run import parallel
  models = workload.jax_models(s)
  step, params, batches = step_inputs(s, models, measures, null)
  mesh = parallel.mesh()
  random = lambda i: parallel.replicate(mesh, driver.random_of(0, 0, 0, i))
  first = (params, None, [batches[0][0]] * 2, batches[0][1], batches[0][1], random(0))
  t = time.perf_counter()  # as the driver runs it: compiled, the compiler's freed memory handed back
  compiled = step.compiled(*first)
  jax.block_until_ready(compiled(*first))
  compile_s = time.perf_counter() - t
  t = time.perf_counter()
  for i, (x, m) in enumerate(batches):
    jax.device_get(compiled(params, None, [x, x], m, m, random(i)))
  return dict(step_s=time.perf_counter() - t, compile_s=compile_s, peak_gib=peaks.process_gib(),
              step_gib=memory.step_bytes(compiled) / memory.GIB)
