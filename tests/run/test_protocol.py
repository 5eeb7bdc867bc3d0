"""Which models a step runs as one loop (`protocol.Forward`)."""

from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np

from vitcnn_jax.models.vit.model import ViT
from vitcnn_jax.run import protocol


def _groups(modules: dict, shapes: dict | None = None) -> list[list[str]]:
  models = {k: types.SimpleNamespace(model=m, policy="inception") for k, m in modules.items()}
  params = {k: {"w": np.zeros((shapes or {}).get(k, (3,)), np.float32)} for k in modules}
  images = {k: np.zeros((2, 8, 8, 3), np.uint8) for k in modules}
  fwd = protocol.Forward(models, params, images, {k: ("x",) for k in modules})
  return fwd._alike({k: ("x",) for k in modules})


def test_models_of_one_architecture_and_shapes_are_one_group_others_apart():
  assert _groups({"a": ViT(num_classes=10), "b": ViT(num_classes=10), "c": ViT(num_classes=5)}) == [["a", "b"], ["c"]]
  assert _groups({"a": ViT(num_classes=10), "b": ViT(num_classes=10)}, {"b": (4,)}) == [["a"], ["b"]]


def test_modules_holding_arrays_are_kept_apart_not_an_error():
  gated = {k: ViT(num_classes=10, skip_gates=jnp.ones(12)) for k in "ab"}
  assert _groups(gated) == [["a"], ["b"]]
