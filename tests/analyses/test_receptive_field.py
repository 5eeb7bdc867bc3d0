"""Effective receptive fields: a 3x3 conv is exactly 3x3; the config end to end."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np

from conftest import ROOT, run_main
from support import upstream_files as uf
from support.numerics import VIT_ROUNDINGS, assert_close, network
from vitcnn_jax import checkpoints
from vitcnn_jax.analyses import receptive_field as rf
from vitcnn_jax.inputs import data


def _conv(x, k):
  return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def test_single_3x3_conv_is_exactly_3x3_and_stacking_grows_it():
  rng = np.random.default_rng(0)
  k = jnp.asarray(rng.uniform(0.5, 1.5, (3, 3, 3, 4)), jnp.float32)  # no zero weights
  x = jnp.asarray(rng.standard_normal((2, 9, 9, 3)), jnp.float32)
  k2 = jnp.ones((3, 3, 4, 4), jnp.float32)
  maps = np.asarray(rf.gradient_maps(lambda x: {"c1": _conv(x, k), "c2": _conv(_conv(x, k), k2)},
                                     ["c1", "c2"], x))
  support1 = maps[0] > 0
  expected = np.zeros((9, 9), bool)
  expected[3:6, 3:6] = True
  np.testing.assert_array_equal(support1, expected)
  support2 = maps[1] > 0
  expected[2:7, 2:7] = True
  np.testing.assert_array_equal(support2, expected)
  # A zero-weight (padding) image contributes nothing.
  w = rf.gradient_maps(lambda x: {"c1": _conv(x, k)}, ["c1"], x, weights=jnp.asarray([1.0, 0.0]))
  one = rf.gradient_maps(lambda x: {"c1": _conv(x, k)}, ["c1"], x[:1])
  np.testing.assert_array_equal(w, one)  # the padding image's weight is an exact 0


def test_config_end_to_end_matches_direct_gradient(tmp_path):
  vit = uf.save(tmp_path / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8))
  bit = uf.save(tmp_path / "bit.npz", uf.bt_bit(0, depth=(1, 1, 1, 1)))
  wd = tmp_path / "wd"
  run_main(f"--config={ROOT}/configs/receptive_field.py:examples=6,batch=4", f"--workdir={wd}",
           f"--config.models.vit.checkpoint={vit}", "--config.models.vit.overrides.resolution=32",
           f"--config.models.resnet.checkpoint={bit}", "--config.models.resnet.overrides.resolution=32",
           "--config.data.source=synthetic", "--config.data.num_examples=10")
  z = np.load(wd / "receptive_field.npz")
  assert list(z["vit_names"]) == ["block00/attn/residual", "block00/out", "block01/attn/residual", "block01/out"]
  assert list(z["resnet_names"])[:2] == ["root/conv", "block1/unit01/out"] and len(z["resnet_names"]) == 5
  assert z["vit_maps"].shape == (4, 32, 32) and z["resnet_maps"].shape == (5, 32, 32)
  assert json.loads((wd / "receptive_field.json").read_text())["num_examples"] == 6
  assert (wd / "receptive_field.png").read_bytes()[:4] == b"\x89PNG"
  # Direct: d(channel mean of the centre token of block01/out)/d input, one image at a time.
  model, params = checkpoints.load_model(vit)
  idx = data.sample(10, 6, 0, 0)
  imgs = (np.stack(data.SyntheticSource(10, 32, 0).images(idx)).astype(np.float32) - 127.5) / 127.5
  centre = 1 + 2 * 4 + 2  # cls + row 2 * 4 columns + column 2

  def f(img):
    _, out = model.apply({"params": params}, img[None], capture="block01/out")
    return out["block01/out"][0, centre].mean()

  grad = jax.jit(jax.grad(f))
  ref = np.mean([np.abs(np.asarray(grad(jnp.asarray(im)))).sum(-1) for im in imgs], axis=0)
  # Gradients from two float32 evaluations (batched jacrev, per-image grad): the backward
  # pass makes as many roundings as the forward, relative to the largest gradient.
  assert_close(z["vit_maps"][3], ref, 2 * network(VIT_ROUNDINGS) * float(np.abs(ref).max()), "ViT map")
  # The root conv (7x7, stride 2) sees a 7x7 window around its centre output.
  support = z["resnet_maps"][0] > 0
  ys, xs = np.nonzero(support)
  assert (ys.max() - ys.min() + 1, xs.max() - xs.min() + 1) == (7, 7)
