"""Checkpoint files that would load into a wrong model: refused, naming the file and key."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import upstream_files as uf
from vitcnn_jax import checkpoints
from vitcnn_jax.models import io
from vitcnn_jax.models.io import CheckpointError

VIT = dict(width=48, depth=2, heads=3, mlp=96, patch=8)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.complex64, np.dtype("U3")])
def test_non_floating_tensors_are_refused(tmp_path, dtype):
  w = uf.mixer(0)
  w["MixerBlock_1/token_mixing/Dense_0/kernel"] = w["MixerBlock_1/token_mixing/Dense_0/kernel"].astype(dtype)
  path = uf.save(tmp_path / "m.npz", w)
  with pytest.raises(CheckpointError, match=rf"m\.npz: key 'MixerBlock_1/token_mixing/Dense_0/"
                                            rf"kernel' has dtype {np.dtype(dtype)}"):
    checkpoints.load_model(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused_with_their_count(tmp_path, bad):
  w = uf.vt_vit(0, **VIT)
  w["Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias"][[3, 5, 7]] = bad
  path = uf.save(tmp_path / "v.npz", w)
  with pytest.raises(CheckpointError, match=r"v\.npz: key 'Transformer/encoderblock_1/MlpBlock_3/"
                                            r"Dense_0/bias' .* holds 3 non-finite values"):
    checkpoints.load_model(path)


def test_bfloat16_stays_loadable(tmp_path):
  import ml_dtypes
  w = uf.vt_vit(0, **VIT)
  w["head/bias"] = w["head/bias"].astype(ml_dtypes.bfloat16).view(np.void)  # how npz stores it
  _, params = checkpoints.load_model(uf.save(tmp_path / "b.npz", w))
  assert params["head"]["bias"].dtype == np.float32


def _big_vision(prefix):
  return {f"{prefix}{k}": v for k, v in uf.bv_vit(0, prefix="", **VIT).items()}


def test_two_different_parameter_trees_are_refused(tmp_path):
  w = {**_big_vision("params/"), **{k: v + 1 for k, v in _big_vision("opt/target/").items()}}
  with pytest.raises(CheckpointError, match=r"two\.npz: holds two different parameter trees, "
                                            r"under 'opt/target/' and 'params/'"):
    checkpoints.load_model(uf.save(tmp_path / "two.npz", w))
  same = {**_big_vision("params/"), **_big_vision("opt/target/")}
  checkpoints.load_model(uf.save(tmp_path / "same.npz", same))  # one tree, twice: fine


def test_keys_beside_the_parameters_are_named_in_a_warning(tmp_path, caplog):
  w = {**_big_vision("params/"), "opt/state/count": np.zeros((), np.float32),
       "opt/state/mu/head/bias": np.zeros((7,), np.float32)}
  with caplog.at_level(logging.WARNING, logger="vitcnn_jax"):
    checkpoints.load_model(uf.save(tmp_path / "o.npz", w))
  assert "left out 2 other keys (opt/state/count, opt/state/mu/head/bias)" in caplog.text


def test_the_digest_follows_the_contents_not_the_path(tmp_path):
  path = uf.save(tmp_path / "v.npz", uf.vt_vit(0, **VIT))
  checkpoints.load_model(path)
  first = io.digest(path)
  uf.save(path, uf.vt_vit(1, **VIT))
  checkpoints.load_model(path)
  assert io.digest(path) != first and io.digest(path + ":img") == io.digest(path)


def test_a_member_that_is_not_an_array_is_named(tmp_path):
  import zipfile
  path = uf.save(tmp_path / "m.npz", uf.vt_vit(0, **VIT))
  with zipfile.ZipFile(path, "a") as z:
    z.writestr("README.txt", "hello")
  with pytest.raises(CheckpointError, match=r"m\.npz: member 'README.txt' of the archive is not"):
    checkpoints.load_model(path)


def test_a_corrupt_cached_demo_model_says_delete_to_retrain(tmp_path):
  from configs import cka_vit_resnet
  from vitcnn_jax import demos, loading, train
  config = cka_vit_resnet.get_config("demo")
  config.cache_dir = str(tmp_path)
  spec = config.models.vit
  cached = train.cache_path(spec.train, str(tmp_path))
  with open(cached, "wb") as f:
    f.write(b"PK\x03\x04 half a file")
  resolved = demos.resolve(config)  # the file is there: nothing is trained
  assert resolved.models.vit.checkpoint == cached and not config.models.vit.checkpoint
  with pytest.raises(CheckpointError, match=r"config.models.vit: the cached trained model .* "
                                            r"Delete it to train it again"):
    loading.load_model(resolved, "vit")


def test_shape_errors_name_the_files_key_and_where_the_architecture_came_from(tmp_path):
  w = uf.vt_vit(0, **VIT)
  q = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
  w[q] = w[q].reshape(48, -1)  # heads read from here: (48, 48) says 48 heads of 1
  with pytest.raises(CheckpointError, match=r"MultiHeadDotProductAttention_1/key/bias has shape "
                                            r"\(3, 16\), but .* needs \(48, 1\).*num_heads=48 "
                                            r"\(from .*query/kernel"):
    checkpoints.load_model(uf.save(tmp_path / "q.npz", w))
  b = uf.bt_bit(0, depth=(1, 1, 1, 1))
  k = "resnet/block1/unit01/a/standardized_conv2d/kernel"
  b[k] = b[k][..., :5]
  with pytest.raises(CheckpointError, match=rf"{k} has shape \(1, 1, 32, 5\)"):
    checkpoints.load_model(uf.save(tmp_path / "b.npz", b))


def test_an_impossible_architecture_names_the_file(tmp_path):
  w = uf.vt_vit(0, **VIT)
  w["embedding/kernel"] = w["embedding/kernel"][..., :40]
  with pytest.raises(CheckpointError, match=r"e\.npz: the architecture read from the file is not "
                                            r"a valid vit model \(width 40 is not divisible"):
    checkpoints.load_model(uf.save(tmp_path / "e.npz", w))


def test_a_missing_class_token_row_is_named(tmp_path):
  w = uf.vt_vit(0, **VIT)
  pe = "Transformer/posembed_input/pos_embedding"
  w[pe] = w[pe][:, 1:]
  with pytest.raises(CheckpointError, match=r"has 16 rows, a whole 4x4 grid.*class-token row "
                                            r"is missing"):
    checkpoints.load_model(uf.save(tmp_path / "p.npz", w))


@pytest.mark.parametrize("key", ["embedding/kernel", "cls",
                                 "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"])
def test_a_tensor_of_the_wrong_rank_is_named(tmp_path, key):
  w = uf.vt_vit(0, **VIT)
  w[key] = w[key].ravel()[:7]
  with pytest.raises(CheckpointError, match=rf"r\.npz: a malformed vit file.*unexpected rank: "
                                            rf"{key} \(7,\)"):
    checkpoints.load_model(uf.save(tmp_path / "r.npz", w))
