"""ResNet v1 as timm and torchvision publish it: built by timm with random weights
and BatchNorm statistics, saved as its state dict, loaded by us, same outputs."""

from __future__ import annotations

import numpy as np
import pytest

import timm_ref
from conftest import compiled
from numerics import assert_close, network
from vitcnn_jax import checkpoints

# Roundings per logit: the stem (147), per unit its convs' fan-ins (at most 16 + 9 x 16 + 16
# + a 64-wide projection) and BatchNorms, five units, the pooling (4 positions) and the head.
TOL = network(1_500)
TINY = dict(layers=(1, 2, 1, 1), channels=(4, 8, 8, 16), num_classes=5)
KINDS = {"v1.5": {}, "v1": dict(v1=True), "basic": dict(basic=True)}


def _images() -> np.ndarray:
  return np.random.default_rng(3).uniform(-1, 1, (2, 64, 64, 3)).astype(np.float32)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_resnet_matches_timm(tmp_path, kind):
  x = _images()
  path = tmp_path / f"resnet_{kind}.safetensors"
  ref = timm_ref.timm_resnet_file(path, x, **TINY, **KINDS[kind])
  overrides = dict(stride_in="1x1") if kind == "v1" else {}
  c = checkpoints.load(str(path), **overrides)
  model = c.model
  assert (model.depth, model.widths, model.block, model.num_classes) == (
      (1, 2, 1, 1), (4, 8, 8, 16), "basic" if kind == "basic" else "bottleneck", 5)
  assert set(c.assumed) == {"bn_eps", "image_size"} | ({"stride_in"} - set(overrides))
  out, _ = compiled(model, c.params, x)
  scale = float(np.abs(ref).max())
  assert scale > 1e-2
  assert_close(out, ref, TOL * scale, kind)
  if kind == "v1":  # the stride's place is not in the file, and it matters
    wrong, _ = compiled(*checkpoints.load_model(str(path)), x)
    assert float(np.abs(np.asarray(wrong) - ref).max()) > 100 * TOL * scale
  checkpoints.save(str(tmp_path / "again.safetensors"), model, c.params)  # timm's names back
  import safetensors.numpy  # noqa: PLC0415
  import safetensors.torch  # noqa: PLC0415
  again = safetensors.numpy.load_file(str(tmp_path / "again.safetensors"))
  first = {k: v for k, v in safetensors.torch.load_file(str(path)).items()
           if not k.endswith("num_batches_tracked")}
  assert sorted(again) == sorted(first)
  for k, v in first.items():
    np.testing.assert_array_equal(again[k], v.numpy(), err_msg=k)
