"""ResNet v1 as timm and torchvision publish it: built by timm with random weights
and BatchNorm statistics, saved as its state dict, loaded by us, same outputs."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import compiled
from support import timm_ref
from support import upstream_files as uf
from support.numerics import assert_close, network
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
  import safetensors.numpy
  import safetensors.torch
  again = safetensors.numpy.load_file(str(tmp_path / "again.safetensors"))
  first = {k: v for k, v in safetensors.torch.load_file(str(path)).items()
           if not k.endswith("num_batches_tracked")}
  assert sorted(again) == sorted(first)
  for k, v in first.items():
    np.testing.assert_array_equal(again[k], v.numpy(), err_msg=k)


def test_the_analyses_that_run_on_bit_run_on_a_resnet_v1(tmp_path):
  """Its anatomy (units, residual points) is what the analyses read: CKA and skip
  ratios per unit (the real report runs the rest on the real ResNet); token
  analyses refuse it by name."""
  import vitcnn_jax as vj
  from conftest import NO_FIGURES
  path = tmp_path / "resnet.safetensors"
  timm_ref.timm_resnet_file(path, _images(), **TINY, basic=True)
  spec = {"res": {"checkpoint": str(path), "resolution": 32}}
  grey = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3)).astype(np.uint8)
  r = vj.cka(spec, grey, layers="blocks", repeats=1, batch_size=8, num_examples=8, **NO_FIGURES)
  assert r["cka_res_res"].shape == (5, 5)  # the five units' outputs
  np.testing.assert_allclose(np.diag(r["cka_res_res"]), 1, atol=1e-5)
  vit = uf.save(tmp_path / "vit.npz", uf.vt_vit(0))  # skip ratios show a CNN beside a ViT
  r = vj.skip_ratio({**spec, "vit": vit}, grey, batch_size=8, num_examples=8, **NO_FIGURES)
  assert r["res_ratio"].shape == (5,) and (r["res_ratio"] > 0).all()
  with pytest.raises(ValueError, match=r"needs a model with attention.*ResNet has none"):
    vj.attention_distance({"vit": spec["res"]}, grey, batch_size=8, num_examples=8)
