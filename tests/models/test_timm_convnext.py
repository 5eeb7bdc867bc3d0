"""ConvNeXt v1 and v2 as timm publishes them: built by timm with random weights,
loaded by us, same outputs."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import compiled
from support import timm_ref
from support.numerics import assert_close, network
from vitcnn_jax import checkpoints

# Roundings per output: stem 48, per block 49 (depthwise) + 2x(C..4C) dots + norms,
# summed over the 5 blocks of TINY, the pooling (64 positions) and the head.
TOL = network(4_000)
TINY = dict(depths=(1, 1, 2, 1), dims=(16, 24, 32, 40), num_classes=7)
VERSIONS = {"v1": {}, "v2": dict(use_grn=True, ls_init_value=None)}


def _images(n: int = 2, size: int = 64) -> np.ndarray:
  return np.random.default_rng(2).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_timm_convnext_matches_timm(tmp_path, version):
  x = _images()
  path = tmp_path / f"convnext_{version}.safetensors"
  ref = timm_ref.timm_convnext_file(path, x, **TINY, **VERSIONS[version])
  model, params = checkpoints.load_model(str(path))
  assert (model.depths, model.widths, model.grn) == ((1, 1, 2, 1), (16, 24, 32, 40),
                                                     version == "v2")
  out, _ = compiled(model, params, x)
  scale = float(np.abs(ref).max())
  assert scale > 1e-2
  assert_close(out, ref, TOL * scale, version)
  checkpoints.save(str(tmp_path / "again.safetensors"), model, params)  # timm's names back
  import safetensors.numpy
  again = safetensors.numpy.load_file(str(tmp_path / "again.safetensors"))
  import safetensors.torch
  first = safetensors.torch.load_file(str(path))
  assert sorted(again) == sorted(first)
  for k, v in first.items():
    np.testing.assert_array_equal(again[k], v.numpy(), err_msg=k)
