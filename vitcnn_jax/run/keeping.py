"""One model's pass over the sample, its stacks kept (`kept`), resumable.

The pass samples the examples as every analysis does (`data.sample`: the same
indices for the same source, num_examples, seed and repeat), loads them as every
analysis does (`pipeline.steps`: a minibatch on each device of every host, each
process its own devices' rows), runs the model's forward with each captured
point's Gram made where the forward makes it (`protocol.Forward.layers`), and
writes each minibatch's `registry.Stack` atomically, each process its own
devices'. A pass stopped midway resumes from the first step with a minibatch
missing; the completion record is written last, by process 0 once every process
is done, so no reader ever sees half a pass.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils as multihost
from jax.sharding import PartitionSpec as P

from vitcnn_jax import checkpoints
from vitcnn_jax import fileio
from vitcnn_jax.inputs import data
from vitcnn_jax.models import anatomy
from vitcnn_jax.models.formats import arrays
from vitcnn_jax.models.formats import in_memory
from vitcnn_jax.run import kept
from vitcnn_jax.run import loading
from vitcnn_jax.run import parallel
from vitcnn_jax.run import pipeline
from vitcnn_jax.run import progress
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results
from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import registry


@dataclasses.dataclass(frozen=True)
class Protocol:
  """What every kept pass of one comparison shares beyond its examples."""
  num_examples: int
  batch_size: int
  repeats: int
  seed: int
  precision: str  # `config.gram_precision`, as named there

  def indices(self, source: data.Source, repeat: int) -> np.ndarray:
    return data.sample(len(source), self.num_examples, self.seed, repeat)


def shared(source: data.Source, how: Protocol) -> dict:
  """What a kept pass records of the run beyond its model (`kept.SHARED`)."""
  reps = []
  for r in range(how.repeats):
    idx = how.indices(source, r)
    reps.append({"examples": results.fingerprint(sorted(idx.tolist())), "order": results.fingerprint(idx.tolist()),
                 "minibatches": -(-len(idx) // how.batch_size)})
  return {"format": kept.FORMAT, "version": kept.VERSION, "sample": {"source": source.identity, "repeats": reps},
          "protocol": dataclasses.asdict(how)}


def manifest(model: loading.Loaded, source: data.Source, how: Protocol) -> dict:
  """What a kept pass of `model` records of itself (see `kept`)."""
  out = shared(source, how)
  minibatches = sum(r["minibatches"] for r in out["sample"]["repeats"])
  capture = model.capture if isinstance(model.capture, str) else list(model.capture)
  return {**out, "model": {"name": model.name, "checkpoint": model.path, "digest": arrays.digest(model.path),
                           "points": list(model.names), "policy": model.policy, "size": model.size,
                           "capture": capture, "request": model.request, "outline": model.outline.record()},
          "shown": {"label": model.label, "setup": model.setup}, "stamp": arrays.stamp(model.path),
          "bytes": kept.bytes_per_minibatch(len(model.names), how.batch_size) * minibatches}


def reuse(name: str, spec: ml_collections.ConfigDict, source: data.Source, how: Protocol,
          folder: str) -> loading.Loaded | None:
  """Model `name` (its config `spec`) as its finished kept pass in `folder`
  records it, without loading it (no parameters): where that pass was kept from
  the same request (`loading.request`), checkpoint bytes, sample and protocol.
  None where there is no such pass: the model is loaded and its pass kept."""
  if not fileio.exists(os.path.join(folder, kept.COMPLETE)):
    return None
  try:
    old = kept.read_json(os.path.join(folder, kept.MANIFEST))
  except kept.KeptError:
    return None
  model = old.get("model") or {}
  if any(old.get(k) != v for k, v in shared(source, how).items()) or model.get("request") != loading.request(spec):
    return None
  path = spec.checkpoint
  if not path.startswith(in_memory.IN_MEMORY):
    try:
      path = checkpoints.locate(path)[0]
    except Exception:  # unreachable: loading it says why
      return None
  if path != model["checkpoint"]:
    return None
  now = arrays.stamp(path)  # the same files, sizes and times: the same bytes, not read again
  if (now is None or now != old.get("stamp")) and arrays.digest(path) != model["digest"]:
    return None
  capture = model["capture"] if isinstance(model["capture"], str) else tuple(model["capture"])
  label, label_from = loading.label_of(spec, old["shown"]["setup"]["family"])
  return loading.Loaded(name, path, label, None, None, list(model["points"]), model["policy"],
                        {**old["shown"]["setup"], "label": label, "label from": label_from}, capture,
                        anatomy.Outline.of_record(model["outline"]), model["request"])


@functools.lru_cache(maxsize=8)
def _step(module, points: tuple[str, ...], policy: str, precision: grams.Precision, mesh, prescale: bool):
  """The forward of a model (its flax `module`) to its `points`' `registry.Stack`,
  one minibatch a device over `mesh` (leading axis: the devices), and the
  largest exponent over every device (`grams.UNFIT`: run it again with
  `prescale`); one program per architecture, points, preprocessing, precision,
  mesh and `prescale` in this process."""
  bare = loading.Loaded("model", "", "", module, None, list(points), policy)

  def local(params, images: jax.Array, mask: jax.Array) -> tuple[registry.Stack, jax.Array]:
    fwd = protocol.Forward({"model": bare}, {"model": params}, {"model": images}, {"model": points},
                           precision=precision, prescale=prescale)
    stack = registry.Stack.of(fwd.layers("model", points, mask))
    return jax.tree.map(lambda a: a[None], stack), jax.lax.pmax(jnp.max(stack.e), parallel.AXES)

  return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(parallel.AXES), P(parallel.AXES)),
                               out_specs=(P(parallel.AXES), P())))


def _stack(model: loading.Loaded, precision: grams.Precision, mesh, params, images: jax.Array,
           mask: jax.Array) -> registry.Stack:
  """One step's stacks of `model` (`_step`): made from the features as they are,
  or where a layer left float32's range, from them prescaled."""
  step = functools.partial(_step, model.model, tuple(model.names), model.policy, precision, mesh)
  stack, top = step(False)(params, images, mask)
  if grams.needs_prescaling(top):
    stack, _ = step(True)(params, images, mask)
  return stack


def _first_missing(out: kept.Pass, repeat: int, per_step: int) -> int | None:
  """The first step of `repeat` with a minibatch not yet written (None: all are)."""
  missing = sorted(set(range(out.minibatches(repeat))) - set(out.written(repeat)))
  return missing[0] // per_step if missing else None


def keep(model: loading.Loaded, source: data.Source, how: Protocol, folder: str,
         precision: grams.Precision = grams.HIGHEST) -> kept.Pass:
  """`keep_together` of one model."""
  return keep_together([model], source, how, [folder], precision)[0]


def keep_together(models: Sequence[loading.Loaded], source: data.Source, how: Protocol,
                  folders: Sequence[str], precision: grams.Precision = grams.HIGHEST) -> list[kept.Pass]:
  """Each model's pass kept in its folder, the models in lockstep so that each
  step's images are read and preprocessed once for all of them (as a fused run
  reads them), a minibatch on each device of every host, each process writing
  its own devices' minibatches; each pass resumed from its first step with a
  minibatch missing, a finished one not run. A folder holding another pass
  (other model, sample or protocol) is refused, naming what differs."""
  outs = [kept.Pass(f, manifest(m, source, how)) for m, f in zip(models, folders)]
  for out in outs:
    _check_folder(out)
  mesh = parallel.mesh(1)
  # A finished pass (its completion record written last) is not read again to find what is missing.
  run = [i for i, out in enumerate(outs) if not fileio.exists(os.path.join(out.folder, kept.COMPLETE))]
  starts = {i: {r: _first_missing(outs[i], r, mesh.size) for r in range(how.repeats)} for i in run}
  if not run:
    return outs
  for i in run:
    _say(models[i], outs[i], jax.process_index() == 0)
  params = [parallel.replicate(mesh, models[i].params) for i in run]
  firsts = {r: min((starts[i][r] for i in run if starts[i][r] is not None), default=None)
            for r in range(how.repeats)}
  total = sum(pipeline.num_steps(how.num_examples, how.batch_size) - s for s in firsts.values() if s is not None)
  label = models[run[0]].name if len(run) == 1 else f"{len(run)} models'"
  with progress.Bar(total, f"{label} pass", jax.process_index() == 0) as bar:
    for r, first in ((r, s) for r, s in firsts.items() if s is not None):
      indices = how.indices(source, r)
      for s, b in enumerate(pipeline.steps(mesh, source, indices, [models[i] for i in run], how.batch_size,
                                           start=first, digests=True), first):
        for k, i in enumerate(run):
          if starts[i][r] is not None and s >= starts[i][r]:
            _write_local(outs[i], r, s, indices, how.batch_size,
                         _stack(models[i], precision, mesh, params[k], b.images[k], b.mask), b.digests)
        bar.update(1, b.examples)
  multihost.sync_global_devices(f"kept passes {outs[run[0]].folder}")  # every process's files are written
  if jax.process_index() == 0:
    for i in run:
      outs[i].complete()
  multihost.sync_global_devices(f"kept passes finished {outs[run[0]].folder}")  # then read by any process
  return outs


def _say(model: loading.Loaded, out: kept.Pass, say: bool) -> None:
  """The pass's manifest written (process 0), and its size said before anything is."""
  if not say:
    return
  out.write_manifest()
  total = sum(map(out.minibatches, range(len(out.manifest["sample"]["repeats"]))))
  print(f"Keeping {model.name}'s pass: {len(model.names)} layers x {total} minibatches of "
        f"{out.manifest['protocol']['batch_size']}: {kept.describe_size(out.manifest['bytes'])} in {out.folder}.")


def _write_local(out: kept.Pass, repeat: int, step: int, indices: np.ndarray, rows: int,
                 stack: registry.Stack, digests: list[str]) -> None:
  """This process's devices' minibatches of one step, each to its file."""
  first = step * jax.device_count() + jax.process_index() * jax.local_device_count()
  shards = {k: sorted(getattr(stack, k).addressable_shards, key=lambda s: s.index[0].start or 0)
            for k in kept.STACK}
  for j in range(jax.local_device_count()):
    b = first + j
    if b >= out.minibatches(repeat):
      break
    arrays = {k: np.asarray(leaf[j].data)[0] for k, leaf in shards.items()}
    idx = indices[b * rows:(b + 1) * rows]
    out.write_minibatch(repeat, b, {**arrays, "mask": (np.arange(rows) < len(idx)).astype(np.float32),
                                    "indices": np.r_[idx, -np.ones(rows - len(idx), int)],
                                    "pixels": np.asarray(digests[j])})


def _check_folder(new: kept.Pass) -> None:
  """`new.folder` is empty or holds (part of) this very pass."""
  path = os.path.join(new.folder, kept.MANIFEST)
  if not os.path.exists(path):
    return
  old = kept.read_json(path)
  diff = [d for d in kept.differences(old, new.manifest) if d != "bytes" and not d.startswith(("shown", "stamp"))]
  if diff:
    raise kept.KeptError(f"{new.folder} holds a kept pass of another run: its {', '.join(diff[:4])} "
                         f"differ from this run's. Delete the folder to keep this pass there, or "
                         "keep it in another workdir.")


def passes_of(models: Sequence[loading.Loaded], source: data.Source, how: Protocol, root: str,
              precision: grams.Precision = grams.HIGHEST) -> list[kept.Pass]:
  """Every model's kept pass under `root/NAME` (`keep_together`)."""
  return keep_together(models, source, how, [os.path.join(root, m.name) for m in models], precision)
