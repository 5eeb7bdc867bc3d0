"""Minibatch CKA within and across two models (paper Figs 1, 2, B.1).

Protocol (paper, Appendix A): `num_examples` examples sampled without
replacement, minibatches of `batch_size`, HSIC accumulated over minibatches;
repeated `repeats` times with a new sample each time; mean and standard
deviation over repeats. Each device processes whole minibatches and the HSIC
matrices are summed with a psum, so 1 and N devices give the same result.
"""

from __future__ import annotations

import time
from typing import Sequence

import jax
import ml_collections
import numpy as np
from jax.sharding import PartitionSpec as P

from vitcnn_jax import cka
from vitcnn_jax import data
from vitcnn_jax import parallel
from vitcnn_jax import pipeline
from vitcnn_jax import plotting
from vitcnn_jax import preprocess
from vitcnn_jax import progress
from vitcnn_jax import results

DEMO_HINT = (", or run the offline demo: python main.py "
             "--config=configs/cka_vit_resnet.py:demo --workdir=/tmp/cka_demo")


def make_step(mesh, models: Sequence[pipeline.Loaded]):
  """jit(shard_map): per-device minibatch -> captured layers -> HSIC -> psum."""

  def local(params, images, mask):
    acts = []
    for m, p, x in zip(models, params, images):
      _, out = m.model.apply({"params": p}, preprocess.to_model_range(x), capture=m.names)
      acts += [out[n] for n in m.names]
    return jax.lax.psum(cka.hsic_matrix(acts, mask), parallel.AXIS)

  sharded = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(parallel.AXIS), P(parallel.AXIS)),
                          out_specs=P())
  return jax.jit(sharded)


def _fingerprint(config: ml_collections.ConfigDict, models, source) -> str:
  return results.fingerprint({
      "models": [(m.key, m.path, m.names, m.policy, m.size) for m in models],
      "data": source.name, "num_examples": config.num_examples,
      "batch_size": config.batch_size, "repeats": config.repeats, "seed": config.seed,
      "devices": jax.device_count()})


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  pipeline.check_batching(config.num_examples, config.batch_size)
  if config.repeats < 1:
    raise ValueError(f"config.repeats={config.repeats} must be >= 1.")
  keys = ["model_x"] + (["model_y"] if config.get("model_y") else [])
  models = [pipeline.load_model(config, k, DEMO_HINT) for k in keys]
  source = pipeline.make_source(config.data)
  mesh = parallel.mesh()
  step_fn = make_step(mesh, models)
  params = [parallel.replicate(mesh, m.params) for m in models]
  names = [n for m in models for n in m.names]

  state_path = results.workdir_path(workdir, "cka_state.npz")
  fp = _fingerprint(config, models, source)
  state = results.read_state(state_path, fp) or {}
  repeat, step = int(state.get("repeat", 0)), int(state.get("step", 0))
  hsic = state.get("hsic", np.zeros((len(names), len(names))))
  done = [m for m in state.get("per_repeat", np.zeros((0, len(names), len(names))))]
  is_main = jax.process_index() == 0

  def save():
    if is_main:
      results.write_npz(state_path, fingerprint=fp, repeat=repeat, step=step, hsic=hsic,
                        per_repeat=np.asarray(done).reshape(-1, len(names), len(names)))

  steps_per_repeat = pipeline.num_steps(config.num_examples, config.batch_size)
  bar = progress.Bar(config.repeats * steps_per_repeat, "CKA", enabled=is_main,
                     initial=repeat * steps_per_repeat + step)
  last_save, ran = time.time(), 0
  while repeat < config.repeats:
    indices = data.sample(len(source), config.num_examples, config.seed, repeat)
    for batch in pipeline.steps(mesh, source, indices, models, config.batch_size, start=step):
      hsic = hsic + np.asarray(step_fn(params, batch.images, batch.mask), np.float64)
      step += 1
      ran += 1
      bar.update(1, batch.examples)
      if config.get("stop_after") and ran >= config.stop_after:
        save()
        bar.close()
        print(f"Stopped after {ran} steps as asked (config.stop_after); state in {state_path}.")
        return {}
      if time.time() - last_save > config.get("save_every_seconds", 60):
        save()
        last_save = time.time()
    done.append(cka.cka_from_hsic(hsic, names))
    repeat, step, hsic = repeat + 1, 0, np.zeros_like(hsic)
    save()
  bar.close()
  return _write(config, workdir, models, np.asarray(done), is_main)


def _write(config, workdir: str, models, per_repeat: np.ndarray, is_main: bool) -> dict:
  mean, std = per_repeat.mean(axis=0), per_repeat.std(axis=0)
  spans, start = {}, 0
  for m in models:
    spans[m.key] = slice(start, start + len(m.names))
    start += len(m.names)
  blocks = {}
  for a in models:
    for b in models:
      if a.key <= b.key:
        tag = a.key[-1] + b.key[-1]  # "xx", "xy", "yy"
        blocks[tag] = (a, b, mean[spans[a.key], spans[b.key]], std[spans[a.key], spans[b.key]])
  summary = {
      "analysis": "cka",
      "models": {m.key: {"label": m.label, "checkpoint": m.path, "layers": m.names}
                 for m in models},
      "num_examples": config.num_examples, "batch_size": config.batch_size,
      "repeats": config.repeats, "devices": jax.device_count(),
      "files": {"npz": "cka.npz", **{f"heatmap_{t}": f"cka_{t}.png" for t in blocks}},
      "mean_cka": {t: float(v[2].mean()) for t, v in blocks.items()},
      "max_std_over_repeats": float(std.max()),
  }
  if is_main:
    arrays = {f"cka_{t}": v[2] for t, v in blocks.items()}
    arrays.update({f"std_{t}": v[3] for t, v in blocks.items()})
    arrays.update({f"names_{m.key[-1]}": np.asarray(m.names) for m in models})
    arrays["per_repeat"] = per_repeat
    results.write_npz(results.workdir_path(workdir, "cka.npz"), **arrays)
    results.write_json(results.workdir_path(workdir, "cka.json"), summary)
    for t, (a, b, mat, _) in blocks.items():
      title = f"CKA: {a.label} vs {b.label}" if a is not b else f"CKA within {a.label}"
      plotting.cka_heatmap(mat, a.names, b.names, row_label=a.label, col_label=b.label,
                           title=f"{title}\n{config.num_examples} examples x {config.repeats} repeats",
                           path=results.workdir_path(workdir, f"cka_{t}.png"))
    print(f"Wrote cka.npz, cka.json and {len(blocks)} heatmaps to {workdir}")
  return summary
