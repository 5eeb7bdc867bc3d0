"""One model's pass over the sample, its stacks kept (`kept`), resumable.

The pass samples the examples as every analysis does (`data.sample`: the same
indices for the same source, num_examples, seed and repeat), runs the model's
forward with each captured point's Gram made where the forward makes it
(`protocol.Forward.layers`), and writes each minibatch's `registry.Stack`
atomically. A pass stopped midway resumes from the minibatch files that open;
the completion record is written last, so no reader ever sees half a pass.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.inputs import data
from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models.formats import arrays
from vitcnn_jax.run import kept
from vitcnn_jax.run import loading
from vitcnn_jax.run import progress
from vitcnn_jax.run import protocol
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


def _digest(a: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(a, np.int64).tobytes()).hexdigest()[:16]


def manifest(model: loading.Loaded, source: data.Source, how: Protocol) -> dict:
  """What a kept pass of `model` records of itself (see `kept`)."""
  reps = []
  for r in range(how.repeats):
    idx = how.indices(source, r)
    reps.append({"examples": _digest(np.sort(idx)), "order": _digest(idx),
                 "minibatches": -(-len(idx) // how.batch_size)})
  size = kept.bytes_per_minibatch(len(model.names), how.batch_size) * sum(r["minibatches"] for r in reps)
  return {"format": kept.FORMAT, "version": kept.VERSION,
          "model": {"name": model.name, "checkpoint": model.path, "digest": arrays.digest(model.path),
                    "label": model.label, "points": list(model.names), "policy": model.policy,
                    "size": model.size},
          "sample": {"source": source.identity, "repeats": reps},
          "protocol": dataclasses.asdict(how), "bytes": size}


@functools.lru_cache(maxsize=8)
def _step(module, points: tuple[str, ...], policy: str, precision: grams.Precision):
  """The jitted forward of a model (its flax `module`) to its `points`' stacked
  `registry.Stack`: one per architecture, points, preprocessing and precision in
  this process."""
  bare = loading.Loaded("model", "", "", module, None, list(points), policy)

  def step(params, images: jax.Array, mask: jax.Array) -> registry.Stack:
    fwd = protocol.Forward({"model": bare}, {"model": params}, {"model": images}, {"model": points},
                           precision=precision)
    return registry.Stack.of(fwd.layers("model", points, mask))

  return jax.jit(step)


def _load(source: data.Source, model: loading.Loaded, chunk: np.ndarray, rows: int
          ) -> tuple[np.ndarray, np.ndarray, str]:
  """(the model's uint8 inputs, padded to `rows`; the mask; the source pixels' digest)."""
  raw = source.images(chunk)
  images = np.zeros((rows, model.size, model.size, 3), np.uint8)
  images[:len(chunk)] = [preprocess.preprocess_image(img, model.size, model.policy) for img in raw]
  mask = (np.arange(rows) < len(chunk)).astype(np.float32)
  return images, mask, kept.pixel_digest(raw)


def keep(model: loading.Loaded, source: data.Source, how: Protocol, folder: str,
         precision: grams.Precision = grams.HIGHEST) -> kept.Pass:
  """`model`'s pass kept in `folder` (resumed where it stopped; nothing run if it is
  finished). A folder holding another pass (other model, sample or protocol) is
  refused, naming what differs."""
  record = manifest(model, source, how)
  out = kept.Pass(folder, record)
  _check_folder(out)
  todo = [(r, b) for r in range(how.repeats) for b in sorted(set(range(out.minibatches(r)))
                                                              - set(out.written(r)))]
  if not todo and os.path.exists(os.path.join(folder, kept.COMPLETE)):
    return out
  if jax.process_index() == 0:
    print(f"Keeping {model.name}'s pass: {len(model.names)} layers x {sum(map(out.minibatches, range(how.repeats)))}"
          f" minibatches of {how.batch_size}: {kept.describe_size(record['bytes'])} in {folder}"
          f"{f' ({len(todo)} minibatches left)' if len(todo) < sum(map(out.minibatches, range(how.repeats))) else ''}.")
  out.write_manifest()
  step = _step(model.model, tuple(model.names), model.policy, precision)
  params = jax.device_put(model.params)
  chunks = {r: how.indices(source, r) for r in {r for r, _ in todo}}
  load = lambda rb: _load(source, model, chunks[rb[0]][rb[1] * how.batch_size:(rb[1] + 1) * how.batch_size],
                          how.batch_size)
  with progress.Bar(len(todo), f"{model.name} pass", jax.process_index() == 0) as bar, \
       concurrent.futures.ThreadPoolExecutor(1) as pool:
    pending = pool.submit(load, todo[0]) if todo else None
    for i, (r, b) in enumerate(todo):
      images, mask, pixels = pending.result()
      if i + 1 < len(todo):
        pending = pool.submit(load, todo[i + 1])
      stack = jax.device_get(step(params, jnp.asarray(images), jnp.asarray(mask)))
      idx = chunks[r][b * how.batch_size:(b + 1) * how.batch_size]
      out.write_minibatch(r, b, {**{k: np.asarray(v) for k, v in stack._asdict().items()}, "mask": mask,
                                 "indices": np.r_[idx, -np.ones(how.batch_size - len(idx), int)],
                                 "pixels": np.asarray(pixels)})
      bar.update(1, int(mask.sum()))
  out.complete()
  return out


def _check_folder(new: kept.Pass) -> None:
  """`new.folder` is empty or holds (part of) this very pass."""
  path = os.path.join(new.folder, kept.MANIFEST)
  if not os.path.exists(path):
    return
  old = kept.read_json(path)
  diff = [d for d in kept.differences(old, new.manifest) if d != "bytes"]
  if diff:
    raise kept.KeptError(f"{new.folder} holds a kept pass of another run: its {', '.join(diff[:4])} "
                         f"differ from this run's. Delete the folder to keep this pass there, or "
                         "keep it in another workdir.")


def passes_of(models: Sequence[loading.Loaded], source: data.Source, how: Protocol, root: str,
              precision: grams.Precision = grams.HIGHEST) -> list[kept.Pass]:
  """Every model's kept pass under `root/NAME`, each run only if it is not finished."""
  return [keep(m, source, how, os.path.join(root, m.name), precision) for m in models]
