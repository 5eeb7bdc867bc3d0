"""Mean attention distance: analytic cases and the config end to end."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT, forward, run_main
from support import upstream_files as uf
from support.numerics import VIT_ROUNDINGS, assert_close, likely, network
from support.token_grids import grid_distances
from vitcnn_jax import checkpoints
from vitcnn_jax.analyses import attention_distance as ad
from vitcnn_jax.inputs import data
from vitcnn_jax.models.vit import model as vit


@pytest.mark.parametrize("grid,patch,expected", [(14, 16, 116.49), (7, 32, 115.50), (16, 14, 116.57)])
def test_uniform_attention_gives_the_ceiling(grid, patch, expected):
  n = grid * grid
  model = vit.ViT(num_classes=None, patch_size=patch, width=8, depth=1, mlp_dim=8, num_heads=2,
                  image_size=grid * patch)
  layer = model.attention()[0]
  assert (layer.num_heads, layer.num_prefix, layer.positions.shape) == (2, 1, (1, n, 2))
  ceiling = ad.uniform_distance(layer)  # float64
  assert abs(ceiling - expected) <= 0.005  # the published value's last digit
  assert_close(ad.distances(layer)[0], grid_distances((grid, grid), patch), 1e-12 * ceiling, "grid")
  dist = jnp.asarray(grid_distances((grid, grid), patch), jnp.float32)
  w = jnp.full((2, 3, n, n), 1.0 / n)
  got = np.asarray(ad.mean_distance(w, dist, 0))
  # float32: n*n products summed, relative likely(n * n) of the result.
  assert_close(got, np.full(got.shape, ceiling), likely(n * n) * ceiling, "uniform")


def test_self_attention_only_gives_zero_and_neighbours_give_the_patch_size():
  dist = jnp.asarray(grid_distances((5, 5), 16), jnp.float32)
  eye = jnp.eye(25)[None, None]
  assert float(np.abs(ad.mean_distance(eye, dist, 0)).max()) == 0.0
  right = np.zeros((25, 25))
  for q in range(25):
    y, x = divmod(q, 5)
    right[q, y * 5 + (x + 1 if x < 4 else x - 1)] = 1.0  # always one patch sideways
  np.testing.assert_allclose(ad.mean_distance(jnp.asarray(right)[None, None], dist, 0), 16.0, atol=1e-5)


def test_cls_conventions():
  grid, patch = 14, 16
  t = grid * grid + 1
  dist = jnp.asarray(grid_distances((grid, grid), patch), jnp.float32)
  w = jnp.full((1, 1, t, t), 1.0 / t)
  dropped = float(ad.mean_distance(w, dist, 1, "drop")[0, 0])
  renorm = float(ad.mean_distance(w, dist, 1, "renormalize")[0, 0])
  ceiling = grid_distances((grid, grid), patch).mean()  # 116.49 px
  bound = likely(t * t) * ceiling
  assert_close(renorm, ceiling, bound, "renormalize")
  assert_close(dropped, ceiling * (t - 1) / t, bound, "drop")  # CLS mass counts as distance 0
  with pytest.raises(ValueError, match="cls='keep' is not one of"):
    ad.mean_distance(w, dist, 1, "keep")


def test_config_end_to_end_matches_direct_computation(tmp_path):
  ckpt = uf.save(tmp_path / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8))
  wd = tmp_path / "wd"
  run_main(f"--config={ROOT}/configs/attention_distance.py:b16,examples=24,batch=8",
           f"--workdir={wd}", f"--config.models.vit.checkpoint={ckpt}", "--config.data.source=synthetic",
           "--config.data.num_examples=40")
  summary = json.loads((wd / "attention_distance.json").read_text())
  got = np.asarray(summary["mean_distance_px"])
  assert got.shape == (2, 3) and summary["blocks"] == [0, 1]
  assert (wd / "attention_distance.png").read_bytes()[:4] == b"\x89PNG"
  # Independent: weights captured by a separate forward, distances in float64 NumPy.
  model, params = checkpoints.load_model(ckpt)
  idx = data.sample(40, 24, 0, 0)
  imgs = (np.stack(data.SyntheticSource(40, 32, 0).images(idx)).astype(np.float32) - 127.5) / 127.5
  out = forward(model, params, imgs, "**/attn/weights")
  d = grid_distances((4, 4), 8)
  # Attention weights from two float32 forwards (compiled separately), then 24 x 16 x 16 sums.
  bound = d.max() * (network(VIT_ROUNDINGS) + likely(24 * 16 * 16))
  by_cls = {k: np.asarray(v) for k, v in summary["mean_distance_px_by_cls"].items()}
  np.testing.assert_array_equal(by_cls["drop"], got)  # the config's convention (the default)
  prefix = np.asarray(summary["prefix_attention"])
  for i in range(2):
    full = np.asarray(out[f"block{i:02d}/attn/weights"], np.float64)
    w = full[:, :, 1:, 1:]
    ref = (w * d).sum(-1).mean(-1).mean(0)
    assert_close(got[i], ref, bound, f"block {i}")
    ref = (w / w.sum(-1, keepdims=True) * d).sum(-1).mean(-1).mean(0)
    assert_close(by_cls["renormalize"][i], ref, bound, f"block {i}, rows renormalised")
    # The spatial queries' attention on the CLS token: weights of ~1, 24 x 16 sums.
    ref = full[:, :, 1:, 0].mean(-1).mean(0)
    assert_close(prefix[i], ref, network(VIT_ROUNDINGS) + likely(24 * 16), f"block {i}, CLS mass")
    assert 0 < prefix[i].min() and prefix[i].max() < 1
  assert summary["uniform_ceiling_px"] == pytest.approx([d.mean()] * 2)
  assert (summary["grid"], summary["token_pixels"], summary["heads"]) == ([4, 4], [8, 8], [3, 3])


def test_killed_run_resumes_to_the_same_result(tmp_path):
  """kill -9 mid-run (state saved after every step), then the same command again."""
  import signal
  import time
  from support import forked
  from conftest import device_env
  ckpt = uf.save(tmp_path / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8))
  # 256 steps, the state written after each: the kill lands long before the end.
  args = [f"--config={ROOT}/configs/attention_distance.py:b16,examples=1024,batch=4",
          f"--config.models.vit.checkpoint={ckpt}", "--config.data.source=synthetic",
          "--config.data.num_examples=1024", "--config.save_every_seconds=0"]
  run_main(*args, f"--workdir={tmp_path / 'whole'}", devices=1)
  wd = tmp_path / "killed"
  proc = forked.start(["main.py", *args, f"--workdir={wd}"], device_env(1), ROOT)
  state = wd / "attention_distance_state.npz"
  deadline = time.time() + 120
  while time.time() < deadline and proc.poll() is None:
    if state.exists() and int(np.load(state)["position"][2]) >= 3:
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  killed = proc.wait()
  assert not (wd / "attention_distance.npz").exists(), "finished before it could be killed"
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  # A copy whose saved partial sums are shifted by 1024 px per head: a resume that
  # really continues from the state ends 1 px (1024 / 1024 examples) higher.
  shifted = tmp_path / "shifted"
  shifted.mkdir()
  with np.load(state) as z:
    saved = {k: z[k] for k in z.files}
  assert int(saved["position"][2]) >= 1
  saved["open/distance/vit"] = saved["open/distance/vit"] + 1024.0
  np.savez(shifted / "attention_distance_state.npz", **saved)
  run_main(*args, f"--workdir={wd}", devices=1)  # a state is resumed on as many devices
  run_main(*args, f"--workdir={shifted}", devices=1)
  whole = np.load(tmp_path / "whole" / "attention_distance.npz")["mean_distance"]
  np.testing.assert_array_equal(np.load(wd / "attention_distance.npz")["mean_distance"], whole)
  np.testing.assert_allclose(np.load(shifted / "attention_distance.npz")["mean_distance"], whole + 1.0,
                             rtol=0, atol=1e-12)
