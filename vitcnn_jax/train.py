"""Supervised training of our models (demo models, training ablations).

Data-parallel over the mesh (params replicated, batch sharded; each process
loads its own rows), AdamW with warmup + cosine decay, periodic resumable
checkpoints, test accuracy, and the final params exported in the upstream npz
format so that `checkpoints.load_model` reads them like an official file.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import time
from typing import Any, Callable

import flax.serialization
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vitcnn_jax import checkpoints
from vitcnn_jax import fileio
from vitcnn_jax.inputs import data
from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models import get_model
from vitcnn_jax.models import memo
from vitcnn_jax.models import param_trees
from vitcnn_jax.models import sizes
from vitcnn_jax.run import accuracy
from vitcnn_jax.run import driver
from vitcnn_jax.run import loading
from vitcnn_jax.run import parallel
from vitcnn_jax.run import pipeline
from vitcnn_jax.run import progress
from vitcnn_jax.run import results
from vitcnn_jax.run import runstate


def build_model(config: ml_collections.ConfigDict, num_classes: int):
  kwargs = dict(config.model.to_dict())
  family = kwargs.pop("family")
  if "no_skip" in kwargs:
    kwargs["no_skip"] = tuple(kwargs["no_skip"])
  if "depth" in kwargs and isinstance(kwargs["depth"], list):
    kwargs["depth"] = tuple(kwargs["depth"])
  return get_model(family, num_classes=num_classes, **kwargs)


def _batch_indices(step: int, batch: int, n: int, seed: int, cache: dict) -> np.ndarray:
  """Global batch `step` of an endless stream of per-epoch permutations."""
  pos = step * batch + np.arange(batch)
  out = np.empty(batch, np.int64)
  for epoch in np.unique(pos // n):
    if epoch not in cache:
      cache.clear()
      cache[epoch] = np.random.default_rng((seed, int(epoch))).permutation(n)
    sel = pos // n == epoch
    out[sel] = cache[epoch][pos[sel] % n]
  return out


def subset(n: int, fraction: float, seed: int) -> np.ndarray:
  """The training examples of a data fraction (Fig 12): round(fraction * n) distinct
  indices drawn with `seed`, sorted; every index when fraction is 1."""
  if not 0 < fraction <= 1:
    raise ValueError(f"config.data_fraction={fraction} must be in (0, 1].")
  k = round(fraction * n)
  if k < 1:
    raise ValueError(f"config.data_fraction={fraction} of {n} examples keeps none; raise it.")
  return np.arange(n) if k == n else np.sort(data.sample(n, k, seed, 0))


def _load_rows(source: data.Source, indices: np.ndarray, size: int, policy: str):
  images = np.stack([preprocess.preprocess_image(im, size, policy) for im in source.images(indices)])
  return images, source.labels(indices).astype(np.int32)


def evaluate(model, params, source: data.Source, policy: str, mesh, batch: int = 512) -> float:
  """Top-1 accuracy over the whole source: the `accuracy.Accuracy` pass, compiled
  and fed as the driver does (last batch padded and masked)."""
  models, step = _accuracy_step(model, policy, mesh)
  rows = -(-batch // jax.device_count())
  indices = np.arange(len(source))
  bar = progress.Bar(pipeline.num_steps(len(indices), rows), "evaluate",
                     enabled=jax.process_index() == 0)
  sums: dict = {}
  replicated = [parallel.replicate(mesh, params)]
  for b in pipeline.steps(mesh, source, indices, list(models.values()), rows, labels=True):
    sums = runstate.add(sums, jax.device_get(step(replicated, None, b.images, b.labels, b.mask, None)))
    bar.update(1, b.examples)
  bar.close()
  return accuracy.Accuracy.of(sums, "model")


@memo.per_architecture
def _accuracy_step(model, policy: str, mesh) -> tuple[dict, Callable]:
  """The accuracy pass of `model`'s architecture (its models, its compiled step):
  made once a process, as a data-scale sweep evaluates several such models."""
  models = {"model": loading.Loaded("model", "", model.family, model, None, [], policy)}
  return models, driver.compile_pass(accuracy.Accuracy(models), models, mesh)


# Options added after models were first cached: at these values they leave a
# config's fingerprint (its cache file name) as it was.
NEUTRAL = {"data_fraction": 1.0, "subset_seed": 0, "init": "", "pretrain": None}
NEUTRAL_DATA = {"classes": ()}


def fingerprint(config: ml_collections.ConfigDict) -> str:
  """What names a trained model in the cache: the whole config, pre-training included."""
  c = config.to_dict()
  for fields, d in ((NEUTRAL, c), (NEUTRAL_DATA, c.get("data", {}))):
    for k, v in fields.items():
      if k in d and (d[k] == v or (v == () and not d[k])):
        del d[k]
  if c.get("pretrain"):
    c["pretrain"] = fingerprint(config.pretrain)
  return results.fingerprint(c)


def cache_path(config: ml_collections.ConfigDict, cache_dir: str) -> str:
  """Where the model `config` trains is cached: named by its whole training config."""
  return os.path.join(os.path.expanduser(cache_dir), f"{config.name}-{fingerprint(config)}.npz")


def cached(config: ml_collections.ConfigDict, cache_dir: str) -> str:
  """Path of the model `config` trains, training it first unless it is cached."""
  path = cache_path(config, cache_dir)
  if not fileio.exists(path):
    if jax.process_index() == 0:
      print(f"Training {config.name} once ({config.steps} steps of {config.batch_size} images; "
            f"the bar shows the time left); later runs read {path}." if config.steps else
            f"Initialising {config.name} once (untrained, seed {config.seed}); later runs read {path}.")
    train(config, path, os.path.expanduser(cache_dir))
  return path


def _initial_params(config: ml_collections.ConfigDict, model, params, workdir: str):
  """Random params, or for fine-tuning (Fig G.1) those of `config.init` (a checkpoint)
  or of the model `config.pretrain` trains, read at the model's resolution (a ViT's
  position embeddings resampled) with the head zeroed, like upstream's fine-tuning;
  every other array must match the model in shape."""
  init = config.get("init") or ""
  if config.get("pretrain"):
    if init:
      raise ValueError("config.init and config.pretrain both name a starting point; set one.")
    init = cached(config.pretrain, workdir)
  if not init:
    return params
  _, start = checkpoints.load_model(init, resolution=model.image_size)
  start, ours = param_trees.flatten(start), param_trees.flatten(params)
  head = [k for k in ours if k.split("/")[0] == "head"]
  wrong = [f"{k} {start[k].shape if k in start else 'missing'} vs {v.shape}"
           for k, v in ours.items() if k not in head and (k not in start or start[k].shape != v.shape)]
  if wrong:
    raise ValueError(f"config.init={init!r} does not fit config.model: {wrong[:3]}"
                     f"{' ...' if len(wrong) > 3 else ''} (file vs model).")
  return param_trees.unflatten({k: np.zeros_like(v) if k in head else np.asarray(start[k], v.dtype)
                                for k, v in ours.items()})


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """`configs/train.py`: trains `config.train`, exports to `config.export` (default
  WORKDIR/NAME.npz). Not an analysis: it makes a model, with optimizer state."""
  export = config.get("export") or os.path.join(workdir, f"{config.train.name}.npz")
  return train(config.train, export, workdir)


def train(config: ml_collections.ConfigDict, export_path: str, workdir: str) -> dict[str, Any]:
  """Trains `config.model` on `config.data` and writes `export_path` (npz) + .json."""
  train_src = pipeline.make_source(config.data, config.data.split)
  test_src = pipeline.make_source(config.data, config.data.test_split)
  if not train_src.num_classes:
    raise ValueError(f"{train_src.name} has no class labels to train on.")
  model = build_model(config, train_src.num_classes)
  size = sizes.to_pair(model.image_size)[0]
  policy = config.get("policy") or model.default_policy
  mesh = parallel.mesh()
  b = config.batch_size
  if b % jax.device_count():
    raise ValueError(f"config.batch_size={b} must be a multiple of the {jax.device_count()} devices.")
  local = b // jax.process_count()
  # Without a block's skips a model has the same parameters, drawn the same way,
  # and trains as the full model with those skips gated off: a skip-ablation
  # sweep compiles one init and one step, the full model's.
  full, gates = _gated(model)
  params = _compiled_init(full)(jax.random.PRNGKey(config.seed), jnp.zeros((1, size, size, 3)))["params"]
  params = _initial_params(config, model, params, workdir)
  if not config.steps:  # untrained: the seeded initialisation, a baseline beside trained models
    return _finish(config, model, parallel.replicate(mesh, params), [], (train_src, test_src), mesh, export_path)
  settings = (config.lr, config.warmup_steps, config.steps, config.weight_decay)
  tx = _optimizer(*settings)
  examples = subset(len(train_src), config.get("data_fraction", 1.0), config.get("subset_seed", 0))
  state = {"params": params, "opt_state": tx.init(params), "step": 0}

  ckpt_path = os.path.join(workdir, f"{os.path.basename(export_path)}.train_state")
  if fileio.exists(ckpt_path):
    state = flax.serialization.from_bytes(state, fileio.read_bytes(ckpt_path))
  state = parallel.replicate(mesh, state)

  def save(state) -> None:
    if jax.process_index() == 0:
      blob = flax.serialization.to_bytes(jax.device_get(state))
      fileio.atomic_write(ckpt_path, lambda f: f.write(blob))

  perms: dict = {}

  def rows(step: int):
    idx = examples[_batch_indices(step, b, len(examples), config.seed, perms)]
    return _load_rows(train_src, idx[jax.process_index() * local:][:local], size, policy)

  step = functools.partial(_compiled_step(full, policy, *settings), gates=gates)
  state, losses, stopped = _steps(config, model.family, state, step, rows, mesh, save)
  if stopped:
    return {"stopped_at": stopped, "losses": losses}
  return _finish(config, model, state["params"], losses, (train_src, test_src), mesh, export_path, examples)


def _finish(config: ml_collections.ConfigDict, model, params, losses: list, srcs: tuple, mesh,
            export_path: str, examples: np.ndarray | None = None) -> dict[str, Any]:
  """The model's test accuracy, its npz and json (by process 0), and the summary."""
  train_src, test_src = srcs
  policy = config.get("policy") or model.default_policy
  acc = evaluate(model, params, test_src, policy, mesh)
  summary = {"family": model.family, "test_accuracy": acc, "steps": config.steps,
             "final_train_loss": float(np.mean(losses[-20:])) if losses else None,
             "data": train_src.name, "test_data": test_src.name, "num_classes": train_src.num_classes,
             "train_examples": 0 if examples is None else len(examples),
             "no_skip": list(config.model.get("no_skip", [])),
             "examples_digest": None if examples is None else results.fingerprint(examples.tolist())}
  if jax.process_index() == 0:
    checkpoints.save(export_path, model, jax.device_get(params))
    results.write_json(export_path[:-len(".npz")] + ".json", summary)
  print(f"{model.family}: test accuracy {acc:.4f} on {test_src.name}; exported {export_path}")
  return {**summary, "losses": losses}


def _steps(config: ml_collections.ConfigDict, label: str, state, train_step, rows, mesh, save
           ) -> tuple[Any, list[float], int]:
  """Steps from `state`'s step to `config.steps`, the next batch loading while one
  runs, saved every `save_every_seconds`: (state, losses, step stopped at by
  `config.stop_after`, or 0)."""
  start = int(jax.device_get(state["step"]))
  bar = progress.Bar(config.steps, f"train {label}", enabled=jax.process_index() == 0, initial=start)
  losses, last_save = [], time.time()
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    pending = pool.submit(rows, start) if start < config.steps else None
    for step in range(start, config.steps):
      images, labels = pending.result()
      if step + 1 < config.steps:
        pending = pool.submit(rows, step + 1)
      state, loss = train_step(state, parallel.global_batch(mesh, images),
                               parallel.global_batch(mesh, labels))
      losses.append(float(loss))
      bar.update(1, config.batch_size)
      bar.bar.set_description(f"train {label} loss {np.mean(losses[-20:]):.3f}")
      if time.time() - last_save > config.get("save_every_seconds", 60):
        save(state)
        last_save = time.time()
      if config.get("stop_after") and step + 1 - start >= config.stop_after:
        save(state)
        bar.close()
        return state, losses, step + 1
  bar.close()
  save(state)
  return state, losses, 0


def _optimizer(lr: float, warmup_steps: int, steps: int, weight_decay: float
               ) -> optax.GradientTransformation:
  """AdamW, gradients clipped to norm 1, linear warmup then cosine decay to 1% of lr."""
  if not 0 <= warmup_steps < steps:
    raise ValueError(f"config.warmup_steps={warmup_steps} must be in [0, config.steps={steps}).")
  sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup_steps, steps, lr * 0.01)
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=weight_decay))


def _gated(model) -> tuple[Any, np.ndarray | None]:
  """(full model, (depth,) 0/1 gates of its blocks' skips) for a model that can go
  without some blocks' skips, the full one included (all gates 1: x * 1 + y = x + y),
  so that a skip sweep and its full model share one step (x * 0 + y = y; the step's
  fusions, so its gradients' rounding, differ from a static copy's); (model, None)
  for any other."""
  if not hasattr(model, "skip_gates"):
    return model, None
  skipless = tuple(model.no_skip)
  return model.clone(no_skip=()), np.array([b not in skipless for b in range(model.depth)], np.float32)


@memo.per_architecture
def _compiled_init(model) -> Callable:
  """`model.init` jit-compiled once a process: a sweep draws many models of one
  architecture (each from its seed), and each new jit would trace it again."""
  return jax.jit(model.init)


@memo.per_architecture
def _compiled_step(model, policy: str, *optimizer):
  """(state, images, labels, gates) -> (state, loss): the jit-compiled step of
  cross-entropy for `model` with `_optimizer(*optimizer)`, made once a process."""
  tx = _optimizer(*optimizer)

  def loss_fn(params, images, labels, gates):
    gated = model if gates is None else model.clone(skip_gates=gates)
    logits, _ = gated.apply({"params": params}, preprocess.normalize(images, policy), capture=(),
                            train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  @jax.jit
  def train_step(state, images, labels, gates):
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], images, labels, gates)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
            "step": state["step"] + 1}, loss
  return train_step
