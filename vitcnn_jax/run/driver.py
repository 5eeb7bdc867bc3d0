"""The loop around every analysis: devices, steps, host sums, resume, files.

Given an analysis (`protocol.Analysis`), its loaded models and its sources, the
driver plans the devices (`memory`), compiles each pass's step over the mesh
(every device of every host), psums the step's sums across devices, adds them
on the host in float64 (`runstate.Steps`), shows progress,
saves a state it resumes from (`runstate`), honours `stop_after`, and writes
the results atomically from process 0. It loads nothing and checks no config:
`jobs.run_analysis` does that first.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import PartitionSpec as P

from vitcnn_jax.inputs import data
from vitcnn_jax.plotting import style
from vitcnn_jax.run import control
from vitcnn_jax.run import loading
from vitcnn_jax.run import memory
from vitcnn_jax.run import parallel
from vitcnn_jax.run import pipeline
from vitcnn_jax.run import programs
from vitcnn_jax.run import progress
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results
from vitcnn_jax.run import runstate
from vitcnn_jax.similarity import grams



def precision_of(config: ml_collections.ConfigDict) -> grams.Precision:
  """The Gram products' precision `config.gram_precision` names (a ValueError naming the field)."""
  try:
    return grams.gram_precision(config.get("gram_precision", "auto"))
  except ValueError as e:
    raise ValueError(f"config.gram_precision: {e}") from e


def random_of(seed: int, pass_: int, repeat: int, first: int, abstract=None) -> tuple:
  """The step's randomness: the key of (seed, pass, repeat) and the index of its first
  minibatch, which each device adds its own to (`Forward.key`). With `abstract` (a
  sharding), their shapes only."""
  if abstract is not None:
    return (jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=abstract),
            jax.ShapeDtypeStruct((), jnp.int32, sharding=abstract))
  key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), pass_), repeat)
  return key, jnp.asarray(first, jnp.int32)


def _program_key(p: protocol.Pass, models: dict[str, loading.Loaded], mesh,
                 precision: grams.Precision) -> tuple | None:
  """What decides the program of pass `p`'s step, beyond its inputs' signature;
  None where the pass does not say (`Pass.program`) or a part does not hash."""
  what = p.program()
  if what is None:
    return None
  key = (type(p), what, tuple((k, tuple(v), models[k].model, models[k].policy) for k, v in p.points.items()),
         mesh, precision)
  try:
    hash(key)
  except TypeError:
    return None
  return key


def compile_pass(p: protocol.Pass, models: dict[str, loading.Loaded], mesh,
                 precision: grams.Precision = grams.HIGHEST) -> programs.Step:
  names = list(p.points)
  grouped = mesh.shape[parallel.GROUP] > 1
  # The step reads each model's architecture and preprocessing, never the parameters
  # it was loaded with (they are its inputs): none are held by the function.
  models = {k: dataclasses.replace(models[k], params=None) for k in names}

  def reduce(key: str, s: jax.Array) -> jax.Array:
    if key.startswith(protocol.BOOT):  # one per minibatch, in minibatch order
      s = jax.lax.psum(s, parallel.GROUP)
      blocks = jnp.zeros((mesh.shape[parallel.AXIS], *s.shape), s.dtype)
      return jax.lax.psum(blocks.at[jax.lax.axis_index(parallel.AXIS)].set(s), parallel.AXIS)
    if key.startswith(protocol.ROWS):  # every device's rows in device order: a psum of placed blocks
      blocks = jnp.zeros((mesh.size, *s.shape), s.dtype).at[jax.lax.axis_index(parallel.AXES)].set(s)
      return jax.lax.psum(blocks, parallel.AXES).reshape(-1, *s.shape[1:])
    if jnp.issubdtype(s.dtype, jnp.integer):
      return jax.lax.pmax(s, parallel.AXES)
    return jax.lax.psum(s, parallel.AXES)

  def local(prescale, params, constants, images, labels, mask, random):
    key = None
    if random is not None:  # this device's minibatch's own key (the same on any device count)
      key = jax.random.fold_in(random[0], random[1] + jax.lax.axis_index(parallel.AXIS))
    fwd = protocol.Forward(models, dict(zip(names, params)), dict(zip(names, images)), p.points,
                           constants, grouped, precision, key, prescale)
    out = p.step(fwd, labels, mask)
    if any(k.startswith(protocol.ROWS) for k in out):
      out = {**out, protocol.ROWS_MASK: mask}
    return {k: jax.tree.map(lambda s, k=k: reduce(k, s), v) for k, v in out.items()}

  axis = P(parallel.AXES)
  return programs.Step(lambda prescale: jax.jit(jax.shard_map(
      functools.partial(local, prescale), mesh=mesh, in_specs=(P(), P(), axis, axis, axis, P()), out_specs=P())),
                       _program_key(p, models, mesh, precision))


def plan_devices(config: ml_collections.ConfigDict, p: protocol.Pass, models: dict[str, loading.Loaded],
                 precision: grams.Precision) -> tuple[memory.Plan, dict[tuple[int, int], programs.Step]]:
  """How many devices share a minibatch (`config.devices_per_minibatch`, 0 to
  choose), checked against device memory where it is known (GPU, TPU, or
  `config.device_memory_gib`) by compiling the step of pass `p`; and the steps
  by (minibatch, group) it compiled to measure them."""
  fixed, batch = config.get("devices_per_minibatch", 1), config.batch_size
  if fixed < 0:
    raise ValueError(f"config.devices_per_minibatch={fixed} must be >= 1, or 0 to choose it.")
  limit = memory.device_limit(config.get("device_memory_gib", 0.0))
  compiled = {}

  def peak(minibatch: int, group: int) -> int:
    mesh = parallel.mesh(group)
    rows = jax.device_count() * (minibatch // group)
    rep, sharded = parallel.replicated(mesh), parallel.batch_sharding(mesh)
    abstract = lambda shape, dtype, sh: jax.ShapeDtypeStruct(shape, dtype, sharding=sh)
    params = [jax.tree.map(lambda a: abstract(a.shape, a.dtype, rep), models[k].params) for k in p.points]
    images = [abstract((rows, models[k].size, models[k].size, 3), jnp.uint8, sharded) for k in p.points]
    step = compiled[minibatch, group] = compile_pass(p, models, mesh, precision)
    with parallel.uncached(mesh):
      return memory.step_bytes(step.compiled(
          params, None, images, abstract((rows,), jnp.int32, sharded),
          abstract((rows,), jnp.float32, sharded), random_of(0, 0, 0, 0, abstract=rep)))

  plan = memory.choose(batch, jax.device_count(), peak, limit, fixed)
  if limit is not None and jax.process_index() == 0:
    print(f"Memory plan: {plan.describe()}.")
  return plan, compiled


def run(config: ml_collections.ConfigDict, workdir: str, name: str, analysis: protocol.Analysis,
        models: dict[str, loading.Loaded], sources: dict[str, data.Source]
        ) -> tuple[dict[str, np.ndarray], dict] | None:
  """Runs `analysis` to completion (or to `config.stop_after` steps: None), writing NAME.{npz,json}
  and figures; `sources` by name ("data", and any the analysis adds). Returns its arrays and summary."""
  figures = control.plot_options(config)
  state = runstate.State(results.workdir_path(workdir, f"{name}_state.npz"),
                         runstate.identity(config, models, sources), jax.process_index() == 0)
  passes = list(analysis.passes())
  precision = precision_of(config)
  layout, compiled = plan_devices(config, passes[0], models, precision)
  planned = compiled.get((layout.minibatch, layout.devices_per_minibatch))  # run, not compiled again
  mesh = parallel.mesh(layout.devices_per_minibatch)
  params = {k: parallel.replicate(mesh, m.params) for k, m in models.items()}
  plan = runstate.examples(config, passes, sources)
  counts = [[pipeline.num_steps(len(idx), layout.rows) for _, idx in reps] for reps in plan]
  bar = progress.Bar(sum(map(sum, counts)), name.replace("_", " "),
                     enabled=jax.process_index() == 0, initial=_done(counts, state.position))
  _say_if_finished(state, len(passes), workdir, name)
  ran, last_save = 0, time.time()
  boot = runstate.Bootstrap(config.get("seed", 0), config.get("bootstrap", 0), state.pooled)
  with bar, parallel.uncached(mesh):  # a grouped step stays out of the CPU persistent cache
    for pi in range(state.position[0], len(passes)):
      p = passes[pi]
      p.setup(state.done[:pi])
      program = ((planned if pi == 0 and p.constants is None else None)
                 or compile_pass(p, models, mesh, precision))
      args = ([params[k] for k in p.points], parallel.replicate(mesh, p.constants))
      for repeat in range(state.position[1] if pi == state.position[0] else 0, p.repeats):
        start, sums = state.start(pi, repeat)
        steps = runstate.Steps(p, sums, boot, (pi, repeat), bar)
        source, indices = plan[pi][repeat]
        for step, b in enumerate(pipeline.steps(mesh, sources[source], indices,
                                                [models[k] for k in p.points], layout.rows,
                                                start=start, labels=p.labels), start + 1):
          labels = b.labels if b.labels is not None else b.mask.astype(np.int32)
          first = (step - 1) * mesh.shape[parallel.AXIS]  # its first minibatch, on any device count
          random = parallel.replicate(mesh, random_of(config.get("seed", 0), pi, repeat, first))
          given = (*args, b.images, labels, b.mask, random)
          steps.add(program(*given), first, b.examples, functools.partial(program, *given, prescale=True))
          ran += 1
          stop = bool(config.get("stop_after")) and ran >= config.stop_after
          if stop or time.time() - last_save > config.get("save_every_seconds", 60):
            state.save(pi, repeat, step, steps.fetch())
            last_save = time.time()
          if stop:
            bar.close()  # before the message (closing again on leaving is harmless)
            print(f"Stopped after {ran} steps as asked (config.stop_after); state in {state.path}.")
            return None
        state.finish(pi, repeat, p.repeats, steps.fetch())
  analysis.replicates = [state.pooled.get(pi, {}) for pi in range(len(passes))]
  arrays, summary = analysis.finalize(state.done)
  summary.update(inputs(models, sources))
  summary["memory_plan"] = dataclasses.asdict(layout)  # peak_bytes 0: not planned (no device memory known)
  write(workdir, name, summary, arrays, analysis.plot, figures)
  return arrays, summary


def inputs(models: dict[str, loading.Loaded], sources: dict[str, data.Source]) -> dict:
  """What a result's json says of its inputs: how each model was loaded, each source."""
  return {"models loaded": {k: m.setup for k, m in models.items()},
          "data": {k: {"source": s.name, "labels": data.labels_are(s)} for k, s in sources.items()}}


def _say_if_finished(state: runstate.State, passes: int, workdir: str, name: str) -> None:
  if state.position[0] >= passes and jax.process_index() == 0:
    print(f"{workdir} holds a finished {name} run of this config ({state.path}); writing its "
          f"results again from the saved sums. To recompute, delete "
          f"{os.path.basename(state.path)} or pass another --workdir.")


def _done(counts: list[list[int]], position: tuple[int, int, int]) -> int:
  """Steps before `position` (pass, repeat, step), for the progress bar."""
  p, r, s = position
  return sum(map(sum, counts[:p])) + (sum(counts[p][:r]) if p < len(counts) else 0) + s


def write(workdir: str, name: str, summary: dict, arrays: dict[str, np.ndarray] | None = None,
          plot: Callable | None = None, figures: style.Figures | None = None) -> None:
  """NAME.json (and NAME.npz, and the figures of `plot` written as `figures` says
  where it says anything), atomically, from process 0 only."""
  if jax.process_index() != 0:
    return
  if figures is None:
    plot = None
  summary = results.flag_non_finite(name, arrays, summary)
  if arrays is not None:
    results.write_npz(results.workdir_path(workdir, f"{name}.npz"), **arrays)
  results.write_json(results.workdir_path(workdir, f"{name}.json"), summary)
  if plot is not None:
    plot(arrays, summary, workdir, figures)
  print(f"Wrote {name}.{'{npz,json}' if arrays is not None else 'json'}"
        f"{' and figures' if plot else ''} to {workdir}")
