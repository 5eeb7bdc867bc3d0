"""Training: the loss falls, resuming continues exactly, the export reloads identically."""

from __future__ import annotations

import json
import logging
import os
import re

import jax
import numpy as np
import pytest

from conftest import ROOT, run_main
from support.idx_files import striped, write_idx
from vitcnn_jax import checkpoints, train
from vitcnn_jax.inputs import zoo
from vitcnn_jax.models import param_trees


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("idx")
  images, labels = striped(512, seed=0)
  write_idx(d, "train", images, labels)
  images, labels = striped(128, seed=1)
  write_idx(d, "t10k", images, labels)
  return str(d)


def _config(idx_dir, variant="vit_demo", steps=40):
  c = zoo.demo_training(variant, steps=steps, batch=32, data=idx_dir)
  c.warmup_steps = 5
  if variant.startswith("vit"):
    c.model.image_size, c.model.patch_size, c.model.width, c.model.depth = 16, 4, 32, 2
  else:
    c.model.image_size = 32
  return c


@pytest.fixture(scope="module")
def vit_run(idx_dir, tmp_path_factory):
  wd = tmp_path_factory.mktemp("train")
  out = train.train(_config(idx_dir), str(wd / "vit.npz"), str(wd))
  return wd, out


def test_loss_falls_and_model_learns(vit_run):
  _, out = vit_run
  losses = out["losses"]
  assert len(losses) == 40
  assert np.mean(losses[-5:]) < 0.85 * np.mean(losses[:5])  # from ln(10) = 2.30
  assert out["test_accuracy"] > 0.5  # chance is 0.1


def test_export_reloads_with_identical_logits(vit_run, idx_dir):
  wd, out = vit_run
  summary = json.loads((wd / "vit.json").read_text())
  assert summary["test_accuracy"] == out["test_accuracy"]
  model, params = checkpoints.load_model(str(wd / "vit.npz"))
  assert (model.width, model.depth, model.image_size, model.num_classes) == (32, 2, 16, 10)
  trained = train.build_model(_config(idx_dir), 10)
  assert model == trained
  from vitcnn_jax.run import parallel
  from vitcnn_jax.run import pipeline
  acc = train.evaluate(model, params, pipeline.make_source(_config(idx_dir).data, "t10k"),
                       "resize", parallel.mesh())
  assert acc == out["test_accuracy"]


def test_resumed_training_continues_from_the_checkpoint(vit_run, idx_dir, tmp_path, caplog):
  wd, _ = vit_run
  cfg = _config(idx_dir)
  cfg.stop_after = 15
  first = train.train(cfg, str(tmp_path / "vit.npz"), str(tmp_path))
  assert first["stopped_at"] == 15 and not (tmp_path / "vit.npz").exists()
  cfg.stop_after = 0
  with jax.log_compiles(), caplog.at_level(logging.WARNING):
    rest = train.train(cfg, str(tmp_path / "vit.npz"), str(tmp_path))
  # Initialised and evaluated with the init and accuracy step `vit_run` compiled for
  # this architecture: not traced again (a sweep of one architecture compiles each once).
  assert not [r for r in caplog.records if re.search(r"\b(local|init)\b|jit_(local|init)", r.getMessage())], \
      caplog.text[-2000:]
  assert len(rest["losses"]) == 25
  a = param_trees.flatten(checkpoints.load_model(str(tmp_path / "vit.npz"))[1])
  b = param_trees.flatten(checkpoints.load_model(str(wd / "vit.npz"))[1])
  # The same compiled step on the same batches in one process: identical up to the
  # npz round trip, which is exact for float32.
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_gap_and_noskip_variants_train(idx_dir, tmp_path):
  """(The BiT trains in the demo test below.) The no-skip copy has the settings of
  `vit_run`, whose compiled step (the full model's, its skips gated) it steps with."""
  for variant, steps in (("vit_gap_demo", 3), ("vit_noskip_demo", 40)):
    cfg = _config(idx_dir, variant, steps=steps)
    if steps == 3:
      cfg.warmup_steps = 1
    out = train.train(cfg, str(tmp_path / f"{variant}.npz"), str(tmp_path))
    assert np.isfinite(out["losses"]).all()
  model, _ = checkpoints.load_model(str(tmp_path / "vit_gap_demo.npz"))
  assert model.pool == "gap"
  cfg = _config(idx_dir, "vit_gap_demo", steps=3)
  cfg.warmup_steps = 3
  with pytest.raises(ValueError, match=r"config.warmup_steps=3 must be in \[0, config.steps=3\)"):
    train.train(cfg, str(tmp_path / "x.npz"), str(tmp_path))


def test_demo_end_to_end_at_reduced_size(vit_run, idx_dir, tmp_path):
  """The :demo config path: train both tiny models, reload, CKA on held-out images."""
  flags = [f"--config={ROOT}/configs/cka_vit_resnet.py:demo,examples=64,batch=16,repeats=1",
           f"--workdir={tmp_path / 'wd'}", f"--config.cache_dir={tmp_path / 'cache'}",
           f"--config.data.path={idx_dir}"]
  for key in ("models.vit", "models.resnet"):  # CKA of each block's output
    flags += [f"--config.{key}.train.data.path={idx_dir}", f"--config.{key}.capture=('blocks',)"]
  # The BiT: 4 steps, two stages of one unit (a stride-1 and a stride-2 unit; half the
  # compile of the demo's four).
  flags += ["--config.models.resnet.train.steps=4", "--config.models.resnet.train.warmup_steps=1",
            "--config.models.resnet.train.model.depth=(1, 1)"]
  # The ViT as `vit_run` trains it: the init, step and evaluation it compiled, not new ones.
  vit = _config(idx_dir)
  flags += [f"--config.models.vit.train.{k}={vit[k]}" for k in ("steps", "warmup_steps", "batch_size")]
  flags += [f"--config.models.vit.train.model.{k}={vit.model[k]}"
            for k in ("image_size", "patch_size", "width", "depth")]
  r = run_main(*flags)
  assert "test accuracy" in r.stdout
  wd = tmp_path / "wd"
  for f in ("cka.npz", "cka.json", "cka_vit_vit.png", "cka_resnet_resnet.png", "cka_resnet_vit.png"):
    assert (wd / f).exists(), f
  cached = sorted(os.listdir(tmp_path / "cache"))
  assert any(f.startswith("vit_demo-") and f.endswith(".npz") for f in cached)
  bit = [f for f in cached if f.startswith("bit_demo-") and f.endswith(".npz")]
  assert len(bit) == 1 and checkpoints.load_model(str(tmp_path / "cache" / bit[0]))[0].depth == (1, 1)
  # Second run reuses the cached models: no training output (one step shows it).
  r = run_main(*flags[:1], f"--workdir={tmp_path / 'wd2'}", *flags[2:], "--config.stop_after=1")
  assert "test accuracy" not in r.stdout and "Stopped after 1 steps" in r.stdout
