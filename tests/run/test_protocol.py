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


def test_a_step_is_unfit_where_any_of_its_exponents_says_so():
  """`protocol.unfit` reads every `log2_scale`, a prefixed one too (pc_share's
  `without/`), and nothing else: another integer sum at `grams.UNFIT` does not
  make a step run again."""
  from vitcnn_jax.similarity import grams
  fit, unfit = np.zeros(3, np.int32), np.array([0, grams.UNFIT, 0], np.int32)
  assert not protocol.unfit({"log2_scale": fit, "without/log2_scale": fit, "count": unfit})
  assert protocol.unfit({"log2_scale": fit, "without/log2_scale": unfit})
  assert protocol.unfit({"log2_scale": unfit})
