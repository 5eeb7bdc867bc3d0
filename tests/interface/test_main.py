"""main.py end to end: config file -> analysis by name -> files in the workdir."""

from __future__ import annotations

import json

from conftest import ROOT, run_main
from support import upstream_files as uf

def _main(*args: str):
  """main.py itself, in a child process: these tests are about its flags."""
  return run_main(*args, devices=1, check=False)


def test_inspect_writes_architecture_and_points(tmp_path):
  ckpt = uf.save(tmp_path / "bit.npz", uf.bt_bit(0, depth=(1, 1, 1, 1)))
  wd = tmp_path / "wd"
  r = _main(f"--config={ROOT}/configs/inspect.py:{ckpt}", f"--workdir={wd}",
            "--config.capture=block1/**")
  assert r.returncode == 0, r.stderr
  summary = json.loads((wd / "inspect.json").read_text())
  assert summary["family"] == "bit"
  assert summary["architecture"]["depth"] == [1, 1, 1, 1]
  names = [p["name"] for p in summary["points"]]
  assert names == [f"block1/unit01/{n}" for n in
                   ("preact", "shortcut", "conv1", "preact2", "conv2", "preact3", "conv3", "out")]
  assert summary["points"][-1]["shape"] == [56, 56, 128]
  assert "block1/unit01/conv2" in r.stdout
  assert summary["image_size_source"] == "default (not in the file)"
  assert "image_size           224: not recorded in the file" in r.stdout


def test_bad_config_field_is_named(tmp_path):
  r = _main(f"--config={ROOT}/configs/inspect.py", f"--workdir={tmp_path}")
  assert r.returncode != 0 and "config.checkpoint is empty" in r.stderr
  r = _main(f"--config={ROOT}/configs/inspect.py:{tmp_path}/missing.npz", f"--workdir={tmp_path}")
  assert r.returncode != 0 and "missing.npz" in r.stderr
  r = _main(f"--config={ROOT}/configs/inspect.py", f"--workdir={tmp_path}", "--config.analysis=ckaa")
  assert r.returncode != 0 and "config.analysis='ckaa' is not one of" in r.stderr
  r = _main(f"--config={ROOT}/configs/inspect.py:{tmp_path}/x.npz", f"--workdir={tmp_path}",
            "--config.analysis=cka")
  assert r.returncode != 0 and "no field 'num_examples' that analysis 'cka' needs" in r.stderr


def test_model_names_are_checked_against_the_analysis(tmp_path):
  """Before any checkpoint is read: missing and unread names."""
  import pytest
  from configs import common, head_subsets, localization
  from vitcnn_jax import jobs
  from vitcnn_jax.inputs import zoo
  config = head_subsets.get_config("l16_r50,examples=16,batch=8")
  config.data = zoo.data_spec("synthetic", num_examples=16)
  config.models.extra = common.model("/x.npz", ["**"], "extra")
  with pytest.raises(ValueError, match=r"\['extra'\] would be ignored"):
    jobs.run(config, str(tmp_path))
  del config.models["extra"], config.models["vit"]
  with pytest.raises(ValueError, match=r"reads vit, resnet, so \['vit'\] is missing"):
    jobs.run(config, str(tmp_path))
  one = localization.get_config("l16,examples=16,batch=8")
  one.models.extra = common.model("/x.npz", ["**"], "extra")
  with pytest.raises(ValueError, match=r"has \['extra', 'vit'\]; this analysis reads 1 model under"):
    jobs.run(one, str(tmp_path))


def _one_message(r, *expected: str) -> None:
  """A user's mistake: exit 2, one `main.py: error:` message, no traceback."""
  assert r.returncode == 2, r.stderr[-3000:]
  assert "Traceback" not in r.stderr, r.stderr[-3000:]
  lines = [l for l in r.stderr.splitlines() if l.strip() and "examples/s" not in l]
  assert lines[0].startswith("main.py: error: ") and len(lines) <= 3, lines
  for text in expected:
    assert text in r.stderr, r.stderr


def test_mistakes_print_one_clean_message_and_exit_2(tmp_path):
  cfg = f"--config={ROOT}/configs/cka_vit_resnet.py:examples=16,batch=8"
  r = _main(cfg, f"--workdir={tmp_path}", "--config.num_exmaples=3")
  _one_message(r, "the config has no field 'num_exmaples'", 'Did you mean "num_examples"')
  assert "\\n" not in r.stderr and "\\'" not in r.stderr  # not the repr of a repr
  r = _main(cfg, f"--workdir={tmp_path}", f"--config.models.resnet.checkpoint={tmp_path}/none.npz",
            "--config.data.source=synthetic", "--config.data.num_examples=64")
  _one_message(r, f"config.models.resnet.checkpoint='{tmp_path}/none.npz' is not reachable")
  r = _main(cfg, f"--workdir={tmp_path}", "--config.plot.format=jpg")
  _one_message(r, "config.plot.format='jpg' is not one of ('png', 'pdf', 'svg', 'none')")
  r = _main(cfg, f"--workdir={tmp_path}", "--config.plot.vmin=1.5")
  _one_message(r, "config.plot.vmin=1.5 must be below vmax=1.0")
  r = _main(cfg, f"--workdir={tmp_path}", "--config.num_exmaples=3", "--verbose")
  assert r.returncode == 2 and "Traceback" in r.stderr and "num_exmaples" in r.stderr
  assert "Unable to initialize backend" not in r.stderr


def test_train_config_variants():
  from configs import train
  c = train.get_config("vit_demo,steps=5,no_skip=1,fraction=0.03,subset_seed=2")
  assert c.analysis == "train" and c.train.steps == 5 and list(c.train.model.no_skip) == [1]
  assert c.train.data_fraction == 0.03 and c.train.subset_seed == 2 and c.export == ""
  c = train.get_config("bit_demo")
  assert c.train.model.family == "bit" and "no_skip" not in c.train.model
