"""Workdirs and resumable states: checked before any work, one run at a time, and a
state resumed only by the run that wrote it (same config, checkpoint contents, data)."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import numpy as np
import pytest

from conftest import ROOT, device_env, run_main
from support import forked
from support import upstream_files as uf
from support.idx_files import striped, write_idx
from vitcnn_jax import jobs
from vitcnn_jax.inputs import zoo
from vitcnn_jax.run import workdir

VIT = dict(width=48, depth=2, heads=3, mlp=96, patch=8)


def _config(ckpt, **data):
  """Attention distance on 64 examples in minibatches of 4: 2 steps on 8 devices."""
  from configs import attention_distance
  config = attention_distance.get_config("b16,examples=64,batch=4")
  config.models.vit.checkpoint = str(ckpt)
  config.data = zoo.data_spec(**(data or dict(source="synthetic", num_examples=64)))
  return config


@pytest.fixture
def ckpt(tmp_path):
  return uf.save(tmp_path / "vit.npz", uf.vt_vit(0, **VIT))


def test_unusable_workdirs_are_refused_before_any_work(tmp_path, ckpt):
  with pytest.raises(ValueError, match="--workdir is empty"):
    jobs.run(_config(ckpt), "")
  a_file = tmp_path / "results.txt"
  a_file.write_text("x")
  with pytest.raises(NotADirectoryError, match="results.txt is a file"):
    jobs.run(_config(ckpt), str(a_file))
  with pytest.raises(PermissionError, match="cannot create it"):
    jobs.run(_config(ckpt), str(a_file / "sub"))


def test_a_workdir_held_by_a_live_run_is_refused(tmp_path, ckpt):
  wd = tmp_path / "wd"
  wd.mkdir()
  other = subprocess.Popen(["sleep", "60"])
  try:
    (wd / workdir.LOCK).write_text(f"{other.pid} {socket.gethostname()} 2026-01-01 00:00:00")
    with pytest.raises(RuntimeError, match=rf"in use by another run \(pid {other.pid}"):
      jobs.run(_config(ckpt), str(wd))
    assert not (wd / "attention_distance.npz").exists()
  finally:
    other.kill()
    other.wait()
  # The same lock, its run gone: taken over, and released after the run.
  jobs.run(_config(ckpt), str(wd))
  assert (wd / "attention_distance.npz").exists() and not (wd / workdir.LOCK).exists()


def test_a_second_run_in_a_busy_workdir_is_refused(tmp_path, ckpt):
  """A real concurrent run: main.py in a child process, then this process."""
  wd = tmp_path / "wd"
  args = [f"--config={ROOT}/configs/attention_distance.py:b16,examples=1024,batch=4",
          f"--config.models.vit.checkpoint={ckpt}", "--config.data.source=synthetic",
          "--config.data.num_examples=1024", f"--workdir={wd}"]
  child = forked.start(["main.py", *args], device_env(1), ROOT)
  deadline = time.time() + 120
  while not (wd / workdir.LOCK).exists() and child.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  r = run_main(*args, check=False)
  done = child.wait(timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert r.returncode != 0 and f"--workdir={wd} is in use by another run" in r.stderr
  assert (wd / "attention_distance.npz").exists() and not (wd / workdir.LOCK).exists()


def _stopped(config, wd):
  config.stop_after = 1
  jobs.run(config, str(wd))
  assert (wd / "attention_distance_state.npz").exists()
  assert not (wd / "attention_distance.npz").exists()
  config.stop_after = 0


def test_a_checkpoint_replaced_at_the_same_path_is_not_resumed(tmp_path, ckpt):
  wd = tmp_path / "wd"
  config = _config(ckpt)
  _stopped(config, wd)
  uf.save(ckpt, uf.vt_vit(1, **VIT))  # other weights, same path and shapes
  with pytest.raises(ValueError, match="its checkpoints differ from this run's"):
    jobs.run(config, str(wd))


def test_data_changed_in_place_is_not_resumed(tmp_path, ckpt):
  images, labels = striped(64, size=32)
  write_idx(tmp_path / "idx", "t10k", images, labels)
  wd = tmp_path / "wd"
  config = _config(ckpt, source="idx", path=str(tmp_path / "idx"), split="t10k")
  _stopped(config, wd)
  write_idx(tmp_path / "idx", "t10k", 255 - images, labels)
  with pytest.raises(ValueError, match="its data differ from this run's"):
    jobs.run(config, str(wd))


def test_a_corrupt_state_file_names_itself_and_the_way_out(tmp_path, ckpt):
  wd = tmp_path / "wd"
  wd.mkdir()
  (wd / "attention_distance_state.npz").write_bytes(b"PK\x03\x04 truncated")
  with pytest.raises(ValueError, match=r"attention_distance_state.npz: not a readable state "
                                       r"file.*delete it to start over"):
    jobs.run(_config(ckpt), str(wd))


def test_results_respect_the_umask(tmp_path, ckpt):
  old = os.umask(0o022)
  try:
    jobs.run(_config(ckpt), str(tmp_path / "wd"))
  finally:
    os.umask(old)
  mode = os.stat(tmp_path / "wd" / "attention_distance.npz").st_mode & 0o777
  assert mode == 0o644, oct(mode)
  assert np.load(tmp_path / "wd" / "attention_distance.npz")["mean_distance"].shape == (2, 3)
