"""Training ablations (paper Figs 8, 12, G.1): no-skip models, data fractions,
fine-tuning, class subsets, and the reference_cka analysis over such a family."""

from __future__ import annotations

import json
import logging

import jax
import ml_collections
import numpy as np
import pytest

from configs import common as config_common
from configs import data_scale, skip_ablation
from configs import train as train_configs
from conftest import forward
from support.idx_files import striped, write_idx
from support.numerics import VIT_ROUNDINGS, assert_close, network
from vitcnn_jax import checkpoints, demos, jobs, train
from vitcnn_jax.analyses import reference_cka
from vitcnn_jax.inputs import data
from vitcnn_jax.inputs import datasets
from vitcnn_jax.inputs import zoo
from vitcnn_jax.models import param_trees
from vitcnn_jax.run import loading
from vitcnn_jax.run import parallel
from vitcnn_jax.run import pipeline

TINY = dict(image_size=16, patch_size=4, width=16, depth=4, mlp_dim=32, num_heads=2)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """One cache of trained models for the module: each family is trained once."""
  return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("idx")
  write_idx(d, "train", *striped(400, seed=0))
  write_idx(d, "t10k", *striped(60, seed=1))
  return str(d)


def _tiny(config, idx_dir: str, steps: int = 4):
  """A training config of the demo shrunk to seconds: tiny model, tiny data, and one
  learning rate (fine-tuning's lower one too: the schedule is compiled into the step,
  so each architecture's models share one compiled step)."""
  config.model.update(TINY)
  config.data.path = idx_dir
  config.steps, config.batch_size, config.warmup_steps, config.lr = steps, 16, 1, 1e-3
  if config.get("pretrain"):
    _tiny(config.pretrain, idx_dir, steps)
  return config


class Recording:
  """Records the training indices a run reads (wraps train._load_rows; the test
  split's reads, for the final accuracy, are not recorded)."""

  def __init__(self, monkeypatch):
    self.read: list[int] = []
    real = train._load_rows

    def load(source, indices, size, policy):
      if source.name.endswith("[train]"):
        self.read += [int(i) for i in indices]
      return real(source, indices, size, policy)
    monkeypatch.setattr(train, "_load_rows", load)


def _train(idx_dir, tmp_path, name="m", steps=4, **changes):
  c = _tiny(train_configs.changed(zoo.demo_training("vit_demo"), name, **changes),
            idx_dir, steps)
  return c, train.train(c, str(tmp_path / f"{name}.npz"), str(tmp_path))


def test_data_fraction_trains_on_exactly_its_seeded_subset(tmp_path, monkeypatch):
  # 64 examples: 4 steps of 16 (the module's step, compiled once) read a subset of 16
  # through and all 64 (one epoch).
  small = str(tmp_path / "idx")
  write_idx(small, "train", *striped(64, seed=0))
  write_idx(small, "t10k", *striped(16, seed=1))
  rec = Recording(monkeypatch)
  _, out = _train(small, tmp_path, "a", data_fraction=0.25)
  want = train.subset(64, 0.25, 0)
  assert len(want) == 16 and out["train_examples"] == 16
  assert set(rec.read) == set(want.tolist())  # every read is in it, and each was read
  other = train.subset(64, 0.25, 1)
  assert len(other) == 16 and set(other.tolist()) != set(want.tolist())
  rec.read.clear()
  _, out = _train(small, tmp_path, "b", data_fraction=0.25, subset_seed=1)
  assert set(rec.read) <= set(other.tolist())
  np.testing.assert_array_equal(train.subset(400, 1.0, 5), np.arange(400))
  rec.read.clear()
  _, out = _train(small, tmp_path, "c")
  assert set(rec.read) == set(range(64)) and out["train_examples"] == 64
  for bad in (0.0, 1.5, 0.001):
    with pytest.raises(ValueError, match="data_fraction"):
      train.subset(400, bad, 0)


def test_a_no_skip_model_exports_and_reloads_only_with_its_ablation(idx_dir, tmp_path, caplog):
  c, out = _train(idx_dir, tmp_path, "noskip", no_skip=1)
  assert out["no_skip"] == [1]
  # Trained through gates on the full model's step, which the full model then steps
  # with (no step compiled for it): without block 1's skips, its losses differ.
  with jax.log_compiles(), caplog.at_level(logging.WARNING):
    _, full = _train(idx_dir, tmp_path, "full")
  assert not [r for r in caplog.records if "train_step" in r.getMessage()], caplog.text[-2000:]
  assert full["losses"][0] == out["losses"][0] and full["losses"][-1] != out["losses"][-1]
  path = str(tmp_path / "noskip.npz")
  model, params = checkpoints.load_model(path, no_skip=(1,))
  plain, _ = checkpoints.load_model(path)
  assert model.no_skip == (1,) and plain.no_skip == ()
  x = np.random.default_rng(0).uniform(-1, 1, (3, 16, 16, 3)).astype(np.float32)
  got = forward(model, params, x, ["block01/attn/residual", "block01/attn/out", "block01/out",
                                   "block01/mlp/out"])
  # No identity path in block 1: each residual sum is its branch alone.
  np.testing.assert_array_equal(got["block01/attn/residual"], got["block01/attn/out"])
  np.testing.assert_array_equal(got["block01/out"], got["block01/mlp/out"])
  assert not np.array_equal(forward(plain, params, x, ["block01/out"])["block01/out"],
                            got["block01/out"])
  # The step's form: the full model with block 1's skips gated off by an input, the
  # same network (its fusions, so its rounding, differ).
  gates = np.array([1, 0, 1, 1], np.float32)
  gated = jax.jit(lambda p, x, g: plain.clone(skip_gates=g).apply(
      {"params": p}, x, capture=["block01/out", "block02/out"])[1])(params, x, gates)
  static = forward(model, params, x, ["block01/out", "block02/out"])
  for k in static:
    assert_close(gated[k], static[k], network(VIT_ROUNDINGS) * np.abs(static[k]).max(), k)
  # A config that trained it loads it with the ablation, without being told.
  spec = config_common.trained(c, "paper", "x")
  cfg = ml_collections.ConfigDict(dict(models=dict(m=spec), cache_dir=str(tmp_path)))
  with pytest.raises(ValueError, match="config.models.m.checkpoint is empty"):
    loading.load_model(cfg, "m")  # loading only loads: the training is resolved first
  assert loading.load_model(demos.resolve(cfg), "m").model.no_skip == (1,)


def test_fine_tuning_starts_from_the_checkpoint_with_a_zero_head(idx_dir, tmp_path):
  # Pre-trained on the data-scale demo's classes: the architecture and settings of its
  # "pretrained" model, whose compiled init and step the two tests share.
  c, _ = _train(idx_dir, tmp_path, "pre", classes=data_scale.PRETRAIN)
  _, pre = checkpoints.load_model(str(tmp_path / "pre.npz"))
  tuned = train_configs.changed(c, "tuned", classes=(3, 4, 5, 6), init=str(tmp_path / "pre.npz"))
  model = train.build_model(tuned, 4)
  params = param_trees.random_params(model, np.zeros((1, 16, 16, 3), np.float32))
  start = param_trees.flatten(train._initial_params(tuned, model, params, str(tmp_path)))
  pre = param_trees.flatten(pre)
  assert start["head/kernel"].shape == (16, 4) and not start["head/kernel"].any()
  assert not start["head/bias"].any()
  for k, v in start.items():
    if not k.startswith("head/"):
      np.testing.assert_array_equal(v, pre[k], err_msg=k)
  wide = train_configs.changed(tuned, "wide", width=24)
  wmodel = train.build_model(wide, 4)
  wparams = param_trees.random_params(wmodel, np.zeros((1, 16, 16, 3), np.float32))
  with pytest.raises(ValueError, match=r"does not fit config.model: "
                                       r"\['Transformer/encoder_norm/bias \(16,\) vs \(24,\)"):
    train._initial_params(wide, wmodel, wparams, str(tmp_path))


def test_a_class_subset_keeps_and_renumbers_those_classes(idx_dir):
  full = datasets.IdxSource(idx_dir, "t10k")
  sub = data.ClassSubset(full, (7, 2))
  labels = full.labels(np.arange(len(full)))
  rows = np.flatnonzero((labels == 7) | (labels == 2))
  assert len(sub) == len(rows) and sub.num_classes == 2
  np.testing.assert_array_equal(sub.labels(np.arange(len(sub))), (labels[rows] == 2).astype(int))
  np.testing.assert_array_equal(sub.images([1])[0], full.images([rows[1]])[0])
  with pytest.raises(ValueError, match=r"classes=\[3, 3\] must be distinct labels in 0..9"):
    data.ClassSubset(full, (3, 3))


def _tiny_job(config, idx_dir: str, cache: str):
  """The job at tiny size, each block's output only (one compile of a small step)."""
  for spec in config.models.values():
    _tiny(spec.train, idx_dir)
    spec.overrides.resolution = 16
    spec.capture = ("blocks",)
  config.data.path = idx_dir
  config.cache_dir = cache
  return config


def test_skip_ablation_demo_at_tiny_size(idx_dir, cache, tmp_path):
  cfg = _tiny_job(skip_ablation.get_config("demo,examples=48,batch=8,repeats=1"), idx_dir, cache)
  wd = tmp_path / "wd"
  jobs.run(cfg, str(wd))
  summary = json.loads((wd / "reference_cka.json").read_text())
  z = np.load(wd / "reference_cka.npz")
  names = ["full", "no_skip0", "no_skip1", "no_skip2", "no_skip3"]
  assert list(summary["models"]) == names and summary["accuracy_examples"] == 60
  mesh, test = parallel.mesh(), pipeline.make_source(cfg.data)
  for name in names:
    m = loading.load_model(demos.resolve(cfg), name)
    assert m.model.no_skip == (() if name == "full" else (int(name[-1]),))
    acc = train.evaluate(m.model, m.params, test, m.policy, mesh)
    assert summary["accuracy"][name] == pytest.approx(acc, abs=1e-12)  # hit counts agree exactly
    assert summary["accuracy_drop_points"][name] == pytest.approx(
        100 * (summary["accuracy"]["full"] - acc))
    # The same-layer CKA is the diagonal of the model's block against the reference.
    block = z["cka_full_full"] if name == "full" else z[f"cka_full_{name}"]
    np.testing.assert_array_equal(z[f"same_layer_{name}"], np.diag(block))
  np.testing.assert_allclose(z["same_layer_full"], 1.0, atol=1e-5)
  for f in ("reference_cka.png", "accuracy.png", "cka_full_no_skip2.png", "cka_no_skip2_no_skip2.png"):
    assert (wd / f).exists(), f
  assert not (wd / "cka_no_skip1_no_skip2.png").exists()  # only within and against the reference
  assert summary["models"]["no_skip2"]["without_skip"] == ["block02"]  # from the model's anatomy
  assert summary["models"]["full"]["without_skip"] == []
  _, middle = reference_cka.DECLARATION.verdicts(summary)[1]  # Fig 8's finding applies here
  worst = max(names[1:], key=summary["accuracy_drop_points"].get)
  assert middle is not None and middle.shown == (worst in ("no_skip1", "no_skip2"))


def test_data_scale_demos_at_tiny_size(idx_dir, cache, tmp_path):
  """(Results only: the figures are reference_cka's, checked in the skip ablation.)"""
  cfg = _tiny_job(data_scale.get_config("demo,examples=48,batch=8,repeats=1"), idx_dir, cache)
  cfg.plot.format = "none"
  jobs.run(cfg, str(tmp_path / "a"))
  summary = json.loads((tmp_path / "a" / "reference_cka.json").read_text())
  assert list(summary["same_layer_cka"]) == ["fraction003", "fraction010", "fraction030", "fraction100"]
  for name, n in (("fraction003", 12), ("fraction010", 40), ("fraction030", 120), ("fraction100", 400)):
    trained = json.loads(open(loading.load_model(demos.resolve(cfg), name).path[:-4] + ".json").read())
    assert trained["train_examples"] == n, name
  cfg = _tiny_job(data_scale.get_config("demo_finetune,examples=16,batch=8,repeats=1"), idx_dir,
                  cache)
  cfg.plot.format = "none"
  jobs.run(cfg, str(tmp_path / "b"))
  summary = json.loads((tmp_path / "b" / "reference_cka.json").read_text())
  assert summary["reference"] == "pretrained" and "accuracy" not in summary
  assert [v for _, v in reference_cka.DECLARATION.verdicts(summary)][1] is None  # no skip ablation here
  tuned = loading.load_model(demos.resolve(cfg), "finetuned")
  assert tuned.model.num_classes == 5
  assert json.loads(open(tuned.path[:-4] + ".json").read())["data"].endswith("classes [5, 6, 7, 8, 9]")


def test_reference_must_be_a_model_and_accuracy_needs_matching_classes(idx_dir, cache, tmp_path):
  cfg = _tiny_job(skip_ablation.get_config("demo,examples=8,batch=8,repeats=1"), idx_dir, cache)
  cfg.reference = "fulll"
  with pytest.raises(ValueError, match=r"config.reference='fulll' is not one of the models"):
    jobs.run(cfg, str(tmp_path / "a"))
  cfg.reference = "full"
  cfg.data.classes = (0, 1)
  with pytest.raises(ValueError, match=r"models.full .* has 10 output classes but .* has 2"):
    jobs.run(cfg, str(tmp_path / "b"))
