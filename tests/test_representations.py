"""Sharded capture over the 8 fake CPU devices of the test process (conftest)."""

from __future__ import annotations

import jax
import numpy as np

from conftest import IN_PROCESS_DEVICES
from numerics import VIT_ROUNDINGS, assert_close, network
from vitcnn_jax import parallel, representations
from vitcnn_jax.models import ViT


def test_capture_fn_on_eight_devices():
  assert jax.device_count() == IN_PROCESS_DEVICES == 8
  model = ViT(num_classes=5, patch_size=8, image_size=32, width=32, depth=2, mlp_dim=64, num_heads=4)
  x = np.random.default_rng(0).integers(0, 256, (16, 32, 32, 3), dtype=np.uint8)
  params = model.init(jax.random.PRNGKey(0), x.astype(np.float32))["params"]
  mesh = parallel.mesh()
  f = representations.capture_fn(model, ["block*/out", "**/attn/weights"], mesh)
  out = f(parallel.replicate(mesh, params), parallel.global_batch(mesh, x))
  assert sorted(out) == ["block00/attn/weights", "block00/out", "block01/attn/weights", "block01/out"], sorted(out)
  assert len(out["block01/out"].sharding.device_set) == 8
  assert out["block01/out"].addressable_shards[0].data.shape == (2, 17, 32)
  _, ref = model.apply({"params": params}, (x.astype(np.float32) - 127.5) / 127.5)
  for k, v in out.items():
    # Sharded jit against eager: two float32 evaluations, relative to the values' scale.
    assert_close(v, ref[k], network(VIT_ROUNDINGS) * float(np.abs(ref[k]).max()), k)
  names = list(representations.point_shapes(model, params, "block01/**"))
  assert names[:3] == ["block01/in", "block01/ln1", "block01/attn/weights"], names
