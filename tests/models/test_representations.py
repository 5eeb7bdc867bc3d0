"""Capture through the driver's forward wrapper on the 8 fake CPU devices of the test
process (conftest): each device's rows, only the selected points, sums psummed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from conftest import IN_PROCESS_DEVICES
from support.numerics import VIT_ROUNDINGS, assert_close, network, worst
from vitcnn_jax.models import representations
from vitcnn_jax.models import ViT, param_trees
from vitcnn_jax.run import driver
from vitcnn_jax.run import loading
from vitcnn_jax.run import parallel
from vitcnn_jax.run import protocol


class _SumsOfPoints(protocol.Pass):
  """A pass whose sums are the selected activations summed over valid rows."""
  title, repeats, labels = "capture", 1, False
  points = {"m": ["block*/out", "**/attn/weights"]}
  seen: list[str] = []

  def step(self, forward, labels, mask):
    del labels
    out = forward("m")
    self.seen[:] = sorted(out)
    return {k: jnp.einsum("b...,b->...", v, mask) for k, v in out.items()}


def test_forward_wrapper_on_eight_devices():
  assert jax.device_count() == IN_PROCESS_DEVICES == 8
  model = ViT(num_classes=5, patch_size=8, image_size=32, width=32, depth=2, mlp_dim=64, num_heads=4)
  x = np.random.default_rng(0).integers(0, 256, (16, 32, 32, 3), dtype=np.uint8)
  mask = np.r_[np.ones(13), np.zeros(3)].astype(np.float32)  # 3 padding rows
  params = param_trees.random_params(model, x[:1].astype(np.float32))
  mesh = parallel.mesh()
  m = loading.Loaded("m", "<init>", "ViT", model, params, [], "resize")
  p = _SumsOfPoints()
  step = driver.compile_pass(p, {"m": m}, mesh)
  got = step([parallel.replicate(mesh, params)], None, [parallel.global_batch(mesh, x)],
             parallel.global_batch(mesh, mask.astype(np.int32)), parallel.global_batch(mesh, mask), None)
  assert p.seen == ["block00/attn/weights", "block00/out", "block01/attn/weights", "block01/out"]
  _, ref = model.apply({"params": params}, (x.astype(np.float32) - 127.5) / 127.5)
  for k, v in got.items():
    want = np.einsum("b...,b->...", np.asarray(ref[k], np.float64), mask)
    scale = np.einsum("b...,b->...", np.abs(np.asarray(ref[k], np.float64)), mask).max()
    # Two float32 forwards (sharded jit, eager), then 13 rows summed over 8 devices.
    assert_close(v, want, (network(VIT_ROUNDINGS) + worst(16)) * scale, k)
  names = list(representations.point_shapes(model, params, "block01/**"))
  assert names[:3] == ["block01/in", "block01/ln1", "block01/attn/weights"], names
  # Traced once per architecture and selection: asked again, the same; another selection,
  # batch or parameter shape is traced anew.
  shapes = representations.point_shapes(model, params, ["block01/**"])
  assert list(shapes) == names and shapes["block01/out"].shape == (1, 17, 32)
  shapes.clear()  # a caller's copy
  assert list(representations.point_shapes(model, params, "block01/**")) == names
  assert list(representations.point_shapes(model, params, "block00/out")) == ["block00/out"]
  assert representations.point_shapes(model, params, "block01/out", batch=3)["block01/out"].shape[0] == 3
  wider = {**params, "head": {"kernel": np.zeros((32, 7), np.float32), "bias": np.zeros(7, np.float32)}}
  assert representations.point_shapes(model.clone(num_classes=7), wider, "logits")["logits"].shape == (1, 7)
