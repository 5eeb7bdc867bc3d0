"""main.py end to end: config file -> analysis by name -> files in the workdir."""

from __future__ import annotations

import json

import upstream_files as uf
from conftest import ROOT, run_main

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


def test_old_model_flags_name_the_new_field(tmp_path):
  r = _main(f"--config={ROOT}/configs/cka_vit_resnet.py", f"--workdir={tmp_path}",
            "--config.model_y.checkpoint=/x/bit.npz")
  assert r.returncode != 0 and "use --config.models.resnet.checkpoint" in r.stderr


def test_model_names_are_checked_against_the_analysis(tmp_path):
  """Before any checkpoint is read: old fields, missing and unread names."""
  import ml_collections
  import pytest
  from configs import common, skip_ratio
  from vitcnn_jax import analyses, zoo
  config = skip_ratio.get_config("b16_r50,examples=16,batch=8")
  config.data = zoo.data_spec("synthetic", num_examples=16)
  config.models.extra = common.model("/x.npz", ["**"], "extra")
  with pytest.raises(ValueError, match=r"\['extra'\] would be ignored"):
    analyses.run(config, str(tmp_path))
  del config.models["extra"], config.models["vit"]
  with pytest.raises(ValueError, match=r"reads vit \(optional\), mixer \(optional\), resnet "
                                       r"\(optional\), and at least one of \['vit', 'mixer'\]"):
    analyses.run(config, str(tmp_path))
  config.model_x = ml_collections.ConfigDict(dict(checkpoint="/x.npz"))
  with pytest.raises(ValueError, match="move this spec to config.models.vit"):
    analyses.run(config, str(tmp_path))
