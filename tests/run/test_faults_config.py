"""Config values and load_model overrides out of range: an error naming the field."""

from __future__ import annotations

import pytest

from support import upstream_files as uf
from vitcnn_jax import jobs, checkpoints
from vitcnn_jax.inputs import zoo

VIT = dict(width=48, depth=2, heads=3, mlp=96, patch=8)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("ckpt")
  return (uf.save(d / "vit.npz", uf.vt_vit(0, **VIT)),
          uf.save(d / "bit.npz", uf.bt_bit(0, depth=(1, 1, 1, 1))))


def _cka(files, **fields):
  from configs import cka_vit_resnet
  config = cka_vit_resnet.get_config("b16_r50,examples=16,batch=8,repeats=1")
  config.models.vit.checkpoint, config.models.resnet.checkpoint = files
  config.models.resnet.overrides.resolution = 32
  config.data = zoo.data_spec("synthetic", num_examples=16)
  for k, v in fields.items():
    node = config
    *parents, leaf = k.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = v
  return config


@pytest.mark.parametrize("field,value,message", [
    ("num_examples", -8, r"config.num_examples=-8 must be >= 1"),
    ("stop_after", -1, r"config.stop_after=-1 must be >= 0"),
    ("seed", -1, r"config.seed=-1 must be >= 0"),
    ("save_every_seconds", -5, r"config.save_every_seconds=-5 must be >= 0"),
    ("data.size", 0, r"config.data \(source='synthetic'.*size=0: a synthetic source needs"),
    ("models.vit.capture", ("block*/ln1", "block*/atn/out"),
     r"config.models.vit.capture: \['block\*/atn/out'\] of .* match no representation point"),
])
def test_bad_values_are_named_before_any_work(files, tmp_path, field, value, message):
  with pytest.raises(ValueError, match=message):
    jobs.run(_cka(files, **{field: value}), str(tmp_path / "wd"))
  assert not (tmp_path / "wd" / "cka.npz").exists()


@pytest.mark.parametrize("overrides,message", [
    (dict(no_skip=(5,)), r"no_skip=\(5,\) names blocks \[5\], but the model has blocks 0..1"),
    (dict(resolution=-32), r"resolution=-32 must be a positive integer"),
    (dict(resolution="abc"), r"resolution='abc' must be a positive integer"),
    (dict(resolution=0), r"resolution=0 must be a positive integer"),
])
def test_vit_overrides_out_of_range(files, overrides, message):
  with pytest.raises(ValueError, match=message):
    checkpoints.load_model(files[0], **overrides)


def test_bit_needs_at_least_32_pixels(files):
  with pytest.raises(ValueError, match=r"resolution=16; a BiT ResNet downsamples by 32"):
    checkpoints.load_model(files[1], resolution=16)
  checkpoints.load_model(files[1], resolution=32)
