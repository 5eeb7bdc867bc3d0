"""The one data path around every analysis: models, data, devices, resume, files.

An analysis (see `Analysis`) says which representation points it needs and
how to reduce one device's minibatch to sums over examples; this driver does
the rest: loads the configured models and the source, samples (seeded, once
per repeat), shards steps over every device of every host, psums the step's
sums across devices, adds them on the host in float64 (fetched in groups, not
once per step), shows progress, saves a fingerprinted state it resumes from,
honours `stop_after`, and writes the results atomically from process 0.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import PartitionSpec as P

from vitcnn_jax import checkpoints
from vitcnn_jax import hsic
from vitcnn_jax import data
from vitcnn_jax import loading
from vitcnn_jax import memory
from vitcnn_jax import parallel
from vitcnn_jax import pipeline
from vitcnn_jax import plotting
from vitcnn_jax import preprocess
from vitcnn_jax import progress
from vitcnn_jax import results

Sums = dict[str, Any]  # named sums over examples (arrays), the result of a step
FETCH_EVERY = 32  # steps whose device results are fetched to the host together


class Forward:
  """What a step sees of the models: their captured points on this device's rows,
  `constants`, the arrays its pass's `setup` made (e.g. fitted probes), and
  `minibatch_sums`, the HSIC sums of this device's share of its minibatch."""

  def __init__(self, models: dict[str, loading.Loaded], params: dict, images: dict,
               points: dict[str, Sequence[str]], constants: Any = None,
               grouped: bool = False, precision: hsic.Precision = hsic.HIGHEST):
    self.models, self._params, self._images, self._points = models, params, images, points
    self.constants = constants
    self._grouped, self._precision = grouped, precision

  def minibatch_sums(self, acts: Sequence[jax.Array], mask: jax.Array) -> Sums:
    """`hsic.minibatch_sums` of these rows' activations (one per layer), for a
    minibatch held by this device or spread over its group of devices."""
    return hsic.minibatch_sums(acts, mask, parallel.AXES, parallel.GROUP if self._grouped else None,
                              self._precision)

  def inputs(self, name: str) -> jax.Array:
    """Model `name`'s input images, float32 in [-1, 1]."""
    return preprocess.to_model_range(self._images[name])

  def logits(self, name: str) -> jax.Array:
    """Model `name`'s class logits on its inputs."""
    return self.models[name].model.apply({"params": self._params[name]}, self.inputs(name),
                                         capture=[])[0]

  def __call__(self, name: str, images: jax.Array | None = None) -> dict[str, jax.Array]:
    """{point: activation} of model `name` on its inputs (or on `images`)."""
    x = self.inputs(name) if images is None else images
    return self.models[name].model.apply({"params": self._params[name]}, x,
                                         capture=list(self._points[name]))[1]


class Pass(Protocol):
  """One sweep over the data (`repeats` times, each on a new sample)."""
  title: str
  points: dict[str, Sequence[str]]  # model name -> representation points it needs
  repeats: int
  labels: bool  # whether steps need class labels

  def step(self, forward: Forward, labels: jax.Array, mask: jax.Array) -> Sums:
    """Sums over this device's valid rows (mask 1); jit-compiled, no I/O. Floating
    leaves are summed over devices; integer leaves (e.g. scale exponents) must be
    equal on all devices and are kept once; leaves named `rows/...` are this
    device's rows themselves, which the host concatenates (valid rows only, in
    the order of the examples): only for a few rows, e.g. a probe's shots.

    Optional members: `host_sums(result)` turns a step's result into float64
    sums on the host (default: as is); `setup(done)` runs before the pass with
    the sums of the passes before it and may set `constants`, a pytree of arrays
    the step reads as `forward.constants`; `examples(repeat, sources)` gives the
    (source name, indices) of a repeat (default: `config.num_examples` sampled
    from the source "data", a new draw each repeat)."""


class Analysis(Protocol):
  name: str  # file stem of the results: NAME.npz, NAME.json, NAME_state.npz

  def passes(self) -> Sequence[Pass]: ...

  def finalize(self, sums: list[list[Sums]]) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays and a JSON summary from sums[pass][repeat] (float64)."""

  def plot(self, arrays: dict[str, np.ndarray], summary: dict, workdir: str) -> None: ...


# The fields of the models before they were a mapping, and their names now.
LEGACY_FIELDS = {"model_x": "vit", "model_y": "resnet", "model": "vit"}


# The driver's fields, the same for every analysis, and their defaults.
CONTROL = dict(
    save_every_seconds=60,  # resumable state written at most this often
    stop_after=0,  # >0: stop (resumably) after this many steps, for time-boxed jobs
    # Devices sharing one minibatch (the estimator's n stays batch_size); 0: the fewest
    # whose memory holds the step (always 1 where the device reports no memory: CPU).
    devices_per_minibatch=0,
    device_memory_gib=0.0,  # per device; 0: what the device reports
    # Gram and HSIC dots: "auto" (highest on CPU and TPU, bf16_6x on GPU), "highest",
    # "bf16_3x", "bf16_6x", "bf16_9x" or "tf32_3x" (see vitcnn_jax/hsic.py).
    gram_precision="auto",
    # Figures: a PDF or SVG beside each PNG (format "pdf"/"svg"), CKA colour scale.
    plot=dict(format="png", vmin=0.0, vmax=1.0),
)


def check_config(config: ml_collections.ConfigDict, module) -> None:
  """What needs neither model nor data: value ranges, figure options, minibatches."""
  for field in ("num_examples", "batch_size"):  # (an analysis choosing its own examples has none)
    if config.get(field, 1) < 1:
      raise ValueError(f"config.{field}={config.get(field)} must be >= 1.")
  for field in ("seed", "stop_after", "save_every_seconds"):
    if config.get(field, 0) < 0:
      raise ValueError(f"config.{field}={config.get(field)} must be >= 0.")
  plot_options(config)
  if getattr(module, "HSIC_MINIBATCHES", False):
    pipeline.check_batching(config.num_examples, config.batch_size)


def check_sources(config: ml_collections.ConfigDict, sources: dict[str, data.Source]) -> None:
  if "num_examples" in config and config.num_examples > len(sources["data"]):
    raise ValueError(f"config.num_examples={config.num_examples}, but the data ({sources['data'].name}) "
                     f"has {len(sources['data'])} examples, sampled without replacement; lower "
                     "config.num_examples.")


def run_analysis(config: ml_collections.ConfigDict, workdir: str, module) -> dict | None:
  """Checks what needs no model (config values, the data), then loads the models
  and builds and runs the analysis of `module` (see `vitcnn_jax.analyses`)."""
  check_config(config, module)
  sources = {"data": pipeline.make_source(config.data)}
  if getattr(module, "TEST_SPLIT", False):  # e.g. probes: fit on data, score on test
    sources["test"] = pipeline.make_source(config.data, config.data.test_split)
  check_sources(config, sources)
  models = load_models(config, module.MODELS, getattr(module, "OPTIONAL_MODELS", ()),
                       getattr(module, "HINT", ""), getattr(module, "ONE_OF", ()))
  return run(config, workdir, module.build(config, models), models, sources)


def load_models(config: ml_collections.ConfigDict, required: Sequence[str] | None,
                optional: Sequence[str] = (), hint: str = "",
                one_of: Sequence[str] = ()) -> dict[str, loading.Loaded]:
  """The models of `config.models` (name -> spec), by name.

  `required` names the models an analysis reads (with `optional` ones it reads
  when present, at least one of `one_of` if given); None means any number of
  models under any names.
  """
  for old, new in LEGACY_FIELDS.items():
    if old in config:
      raise ValueError(f"config.{old}: models are now the mapping config.models (name -> spec); "
                       f"move this spec to config.models.{new} (configs/*.py show the names "
                       "each analysis reads).")
  names = list(config.get("models") or {})
  wanted = "any names" if required is None else ", ".join(
      [*required, *(f"{n} (optional)" for n in optional)])
  if not names:
    raise ValueError(f"config.models is empty; give it the models to analyse ({wanted}){hint}")
  if required is not None:
    missing = [n for n in required if n not in names]
    extra = [n for n in names if n not in (*required, *optional)]
    if missing or extra:
      raise ValueError(f"config.models has {names}; this analysis reads {wanted}"
                       f"{f', so {missing} is missing' if missing else ''}"
                       f"{f', so {extra} would be ignored: remove or rename it' if extra else ''}.")
    if one_of and not set(one_of) & set(names):
      raise ValueError(f"config.models has {names}; this analysis reads {wanted}, and at least "
                       f"one of {list(one_of)}.")
  return {n: loading.load_model(config, n, hint) for n in names}


ROWS = "rows/"  # step results that are rows, gathered rather than summed
ROWS_MASK = "rows/.mask"


def compile_pass(p: Pass, models: dict[str, loading.Loaded], mesh,
                 precision: hsic.Precision = hsic.HIGHEST) -> Callable:
  names = list(p.points)
  grouped = mesh.shape[parallel.GROUP] > 1

  def reduce(key: str, s: jax.Array) -> jax.Array:
    if key.startswith(ROWS):  # every device's rows in device order: a psum of placed blocks
      blocks = jnp.zeros((mesh.size, *s.shape), s.dtype).at[jax.lax.axis_index(parallel.AXES)].set(s)
      return jax.lax.psum(blocks, parallel.AXES).reshape(-1, *s.shape[1:])
    if jnp.issubdtype(s.dtype, jnp.integer):
      return jax.lax.pmax(s, parallel.AXES)
    return jax.lax.psum(s, parallel.AXES)

  def local(params, constants, images, labels, mask):
    fwd = Forward(models, dict(zip(names, params)), dict(zip(names, images)), p.points, constants,
                  grouped, precision)
    out = p.step(fwd, labels, mask)
    if any(k.startswith(ROWS) for k in out):
      out = {**out, ROWS_MASK: mask}
    return {k: jax.tree.map(lambda s, k=k: reduce(k, s), v) for k, v in out.items()}

  axis = P(parallel.AXES)
  return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), axis, axis, axis),
                               out_specs=P()))


def plan_devices(config: ml_collections.ConfigDict, p: Pass, models: dict[str, loading.Loaded],
                 precision: hsic.Precision) -> tuple[memory.Plan, dict]:
  """How many devices share a minibatch (`config.devices_per_minibatch`, 0 to
  choose), checked against device memory where it is known (GPU, TPU, or
  `config.device_memory_gib`) by compiling the step of pass `p`; and the
  compiled steps by (minibatch, group) it measured."""
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
    step = compile_pass(p, models, mesh, precision)
    compiled[minibatch, group] = step.lower(params, None, images, abstract((rows,), jnp.int32, sharded),
                                            abstract((rows,), jnp.float32, sharded)).compile()
    return memory.step_bytes(compiled[minibatch, group])

  plan = memory.choose(batch, jax.device_count(), peak, limit, fixed)
  if limit is not None and jax.process_index() == 0:
    print(f"Memory plan: {plan.describe()}.")
  return plan, compiled


def _add(sums: Sums, got: Sums) -> Sums:
  """Step results into the host sums, float64; valid rows appended for `rows/` keys."""
  keep = np.asarray(got.pop(ROWS_MASK, ())) > 0
  out = dict(sums)
  for k, v in got.items():
    v = np.asarray(v, np.float64)
    if k.startswith(ROWS):
      out[k] = np.concatenate([sums[k], v[keep]]) if k in sums else v[keep]
    else:
      out[k] = sums.get(k, 0.0) + v
  return out


def _identity(config: ml_collections.ConfigDict, models, sources: dict[str, data.Source]) -> dict:
  """What determines a run's result, by part: a resumed state must match every part.
  Checkpoints and data count by their contents, not their paths."""
  cfg = config.to_dict()
  for volatile in ("stop_after", "save_every_seconds", "device_memory_gib", "plot"):  # not the result
    cfg.pop(volatile, None)
  return {"config": results.fingerprint(cfg),
          "data": " | ".join(s.identity for s in sources.values()),
          "device count": jax.device_count(),
          "checkpoints": {k: checkpoints.digest(m.path) for k, m in models.items()},
          "representation points": results.fingerprint({k: m.names for k, m in models.items()})}


class _State:
  """Where a run stands: finished sums per pass and repeat, and the open ones."""

  def __init__(self, path: str, identity: dict):
    self.path, self.identity = path, identity
    saved = results.read_state(path, identity) or {}
    self.position = tuple(int(v) for v in saved.get("position", (0, 0, 0)))  # pass, repeat, step
    self.done: list[list[Sums]] = []
    self.open: Sums = {}
    for key, value in saved.items():
      kind, *where = key.split("/")
      if kind == "done":
        p, r, name = int(where[0]), int(where[1]), "/".join(where[2:])
        while len(self.done) <= p:
          self.done.append([])
        while len(self.done[p]) <= r:
          self.done[p].append({})
        self.done[p][r][name] = value
      elif kind == "open":
        self.open["/".join(where)] = value

  def save(self) -> None:
    arrays = {f"done/{p}/{r}/{k}": v for p, reps in enumerate(self.done)
              for r, sums in enumerate(reps) for k, v in sums.items()}
    arrays.update({f"open/{k}": v for k, v in self.open.items()})
    results.write_npz(self.path, identity=json.dumps(self.identity, default=str),
                      position=np.asarray(self.position), **arrays)


def _plan(config: ml_collections.ConfigDict, passes: Sequence[Pass],
          sources: dict[str, data.Source]) -> list[list[tuple[str, np.ndarray]]]:
  """(source name, indices) of every repeat of every pass."""
  def default(repeat, sources):
    return "data", data.sample(len(sources["data"]), config.num_examples, config.seed, repeat)
  return [[getattr(p, "examples", default)(r, sources) for r in range(p.repeats)] for p in passes]


def run(config: ml_collections.ConfigDict, workdir: str, analysis: Analysis,
        models: dict[str, loading.Loaded], sources: dict[str, data.Source]) -> dict | None:
  """Runs `analysis` to completion (or to `config.stop_after` steps) and writes its
  files; `sources` by name ("data", the configured one, and any the analysis adds)."""
  is_main = jax.process_index() == 0
  figures = plot_options(config)
  state = _State(results.workdir_path(workdir, f"{analysis.name}_state.npz"),
                 _identity(config, models, sources))
  passes = list(analysis.passes())
  try:
    precision = hsic.gram_precision(config.get("gram_precision", "auto"))
  except ValueError as e:
    raise ValueError(f"config.gram_precision: {e}") from e
  layout, _ = plan_devices(config, passes[0], models, precision)
  rows = layout.rows
  mesh = parallel.mesh(layout.devices_per_minibatch)
  params = {k: parallel.replicate(mesh, m.params) for k, m in models.items()}
  plan = _plan(config, passes, sources)
  counts = [[pipeline.num_steps(len(idx), rows) for _, idx in reps] for reps in plan]
  total = sum(map(sum, counts))
  first_pass, first_repeat, first_step = state.position
  done_before = sum(map(sum, counts[:first_pass])) + sum(counts[first_pass][:first_repeat]
                                                         if first_pass < len(plan) else []) + first_step
  if first_pass >= len(passes) and is_main:
    print(f"{workdir} holds a finished {analysis.name} run of this config ({state.path}); "
          f"writing its results again from the saved sums. To recompute, delete "
          f"{os.path.basename(state.path)} or pass another --workdir.")
  bar = progress.Bar(total, analysis.name.replace("_", " "), enabled=is_main, initial=done_before)
  ran, last_save = 0, time.time()

  def save(position):
    state.position = position
    if is_main:
      state.save()

  for pi, p in enumerate(passes):
    if pi < first_pass:
      continue
    if hasattr(p, "setup"):  # a pass that depends on the ones before it
      p.setup(state.done[:pi])
    step_fn = compile_pass(p, models, mesh, precision)
    constants = parallel.replicate(mesh, getattr(p, "constants", None))
    used = [models[k] for k in p.points]
    pparams = [params[k] for k in p.points]
    while len(state.done) <= pi:
      state.done.append([])
    for repeat in range(first_repeat if pi == first_pass else 0, p.repeats):
      start = first_step if (pi, repeat) == (first_pass, first_repeat) else 0
      sums = {k: np.asarray(v, np.float64) for k, v in state.open.items()} if start else {}
      pending: list = []

      def fetch():
        nonlocal sums
        for got in jax.device_get(pending):  # one transfer; added in step order
          sums = _add(sums, p.host_sums(got) if hasattr(p, "host_sums") else got)
        pending.clear()

      source_name, indices = plan[pi][repeat]
      step = start
      for b in pipeline.steps(mesh, sources[source_name], indices, used, rows, start=start,
                              labels=p.labels):
        labels = b.labels if b.labels is not None else b.mask.astype(np.int32)
        pending.append(step_fn(pparams, constants, b.images, labels, b.mask))
        step, ran = step + 1, ran + 1
        bar.update(1, b.examples)
        stop = bool(config.get("stop_after")) and ran >= config.stop_after
        due = stop or time.time() - last_save > config.get("save_every_seconds", 60)
        if due or len(pending) >= FETCH_EVERY:
          fetch()
        if due:
          state.open = sums
          save((pi, repeat, step))
          last_save = time.time()
        if stop:
          bar.close()
          print(f"Stopped after {ran} steps as asked (config.stop_after); state in {state.path}.")
          return None
      fetch()
      state.done[pi].append(sums)
      state.open = {}
      save((pi, repeat + 1, 0) if repeat + 1 < p.repeats else (pi + 1, 0, 0))
  bar.close()
  arrays, summary = analysis.finalize(state.done)
  write(workdir, analysis.name, summary, arrays, analysis.plot, figures)
  return summary


def plot_options(config: ml_collections.ConfigDict) -> dict:
  """`plotting.options` from `config.plot` (format, vmin, vmax), checked before any work."""
  given = dict(config.get("plot") or {})
  unknown = sorted(set(given) - {"format", "vmin", "vmax"})
  if unknown:
    raise ValueError(f"config.plot has no field {unknown[0]!r}; it has format, vmin and vmax.")
  if given.get("format", "png") not in plotting.FORMATS:
    raise ValueError(f"config.plot.format={given['format']!r} is not one of {plotting.FORMATS}.")
  if not given.get("vmin", 0.0) < given.get("vmax", 1.0):
    raise ValueError(f"config.plot.vmin={given.get('vmin', 0.0)} must be below "
                     f"config.plot.vmax={given.get('vmax', 1.0)}.")
  return given


def write(workdir: str, name: str, summary: dict, arrays: dict[str, np.ndarray] | None = None,
          plot: Callable | None = None, figures: dict | None = None) -> None:
  """NAME.json (and NAME.npz, figures drawn with `plotting.options(**figures)`),
  atomically, from process 0 only."""
  if jax.process_index() != 0:
    return
  if arrays is not None:
    results.write_npz(results.workdir_path(workdir, f"{name}.npz"), **arrays)
  results.write_json(results.workdir_path(workdir, f"{name}.json"), summary)
  if plot is not None:
    with plotting.options(**(figures or {})):
      plot(arrays, summary, workdir)
  print(f"Wrote {name}.{'{npz,json}' if arrays is not None else 'json'}"
        f"{' and figures' if plot else ''} to {workdir}")
