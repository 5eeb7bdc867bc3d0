"""Checkpoint files that would load into a wrong model: refused, naming the file and key."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from support import upstream_files as uf
from vitcnn_jax import checkpoints
from vitcnn_jax.models.formats import arrays
from vitcnn_jax.models.formats.base import CheckpointError

VIT = dict(width=48, depth=2, heads=3, mlp=96, patch=8)


def _refused(path, w: dict, match: str) -> None:
  """Loading `w` written as `path` is refused with a message matching `match`."""
  with pytest.raises(CheckpointError, match=match):
    checkpoints.load_model(uf.save(path, w))


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
  _refused(tmp_path / "two.npz", w, r"two\.npz: holds two different parameter trees, "
                                    r"under 'opt/target/' and 'params/'")
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
  first = arrays.digest(path)
  uf.save(path, uf.vt_vit(1, **VIT))
  checkpoints.load_model(path)
  assert arrays.digest(path) != first and arrays.digest(path + ":img") == arrays.digest(path)


def test_a_member_that_is_not_an_array_is_named(tmp_path):
  import zipfile
  path = uf.save(tmp_path / "m.npz", uf.vt_vit(0, **VIT))
  with zipfile.ZipFile(path, "a") as z:
    z.writestr("README.txt", "hello")
  with pytest.raises(CheckpointError, match=r"m\.npz: member 'README.txt' of the archive is not"):
    checkpoints.load_model(path)


def test_a_corrupt_cached_demo_model_says_delete_to_retrain(tmp_path, monkeypatch):
  from configs import cka_vit_resnet
  from vitcnn_jax import demos, train
  from vitcnn_jax.run import loading
  config = cka_vit_resnet.get_config("demo")
  config.cache_dir = str(tmp_path)
  for spec in config.models.values():  # both demo models' files are there (the BiT's is not read)
    with open(train.cache_path(spec.train, str(tmp_path)), "wb") as f:
      f.write(b"PK\x03\x04 half a file")
  cached = train.cache_path(config.models.vit.train, str(tmp_path))
  monkeypatch.setattr(train, "train", lambda *a: pytest.fail(f"trained {a[1]}: the cache has it"))
  resolved = demos.resolve(config)  # the files are there: nothing is trained
  assert resolved.models.vit.checkpoint == cached and not config.models.vit.checkpoint
  with pytest.raises(CheckpointError, match=r"config.models.vit: the cached trained model .* "
                                            r"Delete it to train it again"):
    loading.load_model(resolved, "vit")


def test_shape_errors_name_the_files_key_and_where_the_architecture_came_from(tmp_path):
  w = uf.vt_vit(0, **VIT)
  q = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
  w[q] = w[q].reshape(48, -1)  # heads read from here: (48, 48) says 48 heads of 1
  _refused(tmp_path / "q.npz", w, r"MultiHeadDotProductAttention_1/key/bias has shape "
                                  r"\(3, 16\), but .* needs \(48, 1\).*num_heads=48 "
                                  r"\(from .*query/kernel")
  b = uf.bt_bit(0, depth=(1, 1, 1, 1))
  k = "resnet/block1/unit01/a/standardized_conv2d/kernel"
  b[k] = b[k][..., :5]
  _refused(tmp_path / "b.npz", b, rf"{k} has shape \(1, 1, 32, 5\)")


def test_an_impossible_architecture_names_the_file(tmp_path):
  w = uf.vt_vit(0, **VIT)
  for k in ("embedding/kernel", "Transformer/posembed_input/pos_embedding", "cls"):
    w[k] = w[k][..., :40]
  _refused(tmp_path / "e.npz", w, r"e\.npz: the architecture read from the file is not "
                                  r"a valid vit model \(width 40 is not divisible")


def test_a_missing_class_token_row_is_named(tmp_path):
  w = uf.vt_vit(0, **VIT)
  pe = "Transformer/posembed_input/pos_embedding"
  w[pe] = w[pe][:, 1:]
  _refused(tmp_path / "p.npz", w, r"has 16 rows, a whole 4x4 grid.*class-token row "
                                  r"is missing")


@pytest.mark.parametrize("key", ["embedding/kernel", "cls",
                                 "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"])
def test_a_tensor_of_the_wrong_rank_is_named(tmp_path, key):
  w = uf.vt_vit(0, **VIT)
  w[key] = w[key].ravel()[:7]
  _refused(tmp_path / "r.npz", w, rf"r\.npz: a malformed vit file.*unexpected rank: "
                                  rf"{key} \(7,\)")


def test_a_classifier_kernel_of_the_wrong_rank_is_named(tmp_path):
  w = uf.vt_vit(0, **VIT)
  w["head/kernel"] = w["head/kernel"][None]
  _refused(tmp_path / "h.npz", w, r"h\.npz: head/kernel \(1, 48, 7\) should be a 2-D")


def test_a_position_embedding_of_another_width_is_named(tmp_path):
  w = uf.vt_vit(0, **VIT)
  pe = "Transformer/posembed_input/pos_embedding"
  w[pe] = w[pe][..., :32]
  _refused(tmp_path / "w.npz", w, rf"{pe} \(1, 17, 32\) should be \(1, tokens, 48\), "
                                  r"the width read from embedding/kernel")


def test_a_missing_class_token_is_named(tmp_path):
  w = uf.vt_vit(0, **VIT)
  del w["cls"]
  _refused(tmp_path / "c.npz", w, r"key 'cls' is missing: .* class-token row before "
                                  r"its 4x4 grid")


def test_a_stray_key_is_named_with_its_prefix(tmp_path):
  w = uf.vt_vit(0, **VIT)
  beside = {**w, "params/foo": np.zeros(3, np.float32)}
  _refused(tmp_path / "s.npz", beside, r"model's keys sit at the top level .* 1 key\(s\) sit "
                                       r"under 'params/' \(params/foo\)")
  inside = {f"params/{k}": v for k, v in beside.items()}
  _refused(tmp_path / "t.npz", inside, r"1 tensor\(s\) not used .*: params/params/foo \(3,\)")


def test_a_scan_stacked_shape_error_names_the_stacked_key(tmp_path):
  w = uf.bv_vit(0, scan=True)
  k = "params/Transformer/encoderblock/MlpBlock_0/Dense_0/bias"
  w[k] = w[k][:, :50]
  with pytest.raises(CheckpointError, match=rf"{k} \(entry 0 of its leading, per-block axis\) has "
                                            r"shape \(50,\), but .* needs \(96,\)") as e:
    checkpoints.load_model(uf.save(tmp_path / "k.npz", w))
  assert "encoderblock_0" not in str(e.value).split("The architecture")[0]


@pytest.mark.parametrize("suffix", [".pth", ".bin", ".pt"])
def test_pickles_are_refused_unread_naming_safetensors(tmp_path, suffix):
  path = tmp_path / f"model{suffix}"
  path.write_bytes(b"\x80\x04 not read")
  with pytest.raises(CheckpointError, match=r"a PyTorch pickle.* never read.*\.safetensors"):
    checkpoints.load_model(str(path))


def test_a_torch_zip_archive_is_refused_unread(tmp_path):
  import zipfile
  path = tmp_path / "model.npz"  # torch.save's zip format under a misleading name
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("archive/data.pkl", b"\x80\x04 not read")
  with pytest.raises(CheckpointError, match=r"PyTorch archive \(member 'archive/data.pkl'\).*"
                                            r"\.safetensors"):
    checkpoints.load_model(str(path))


def test_a_truncated_or_empty_safetensors_file_is_named(tmp_path):
  import safetensors.numpy
  data = safetensors.numpy.save({"patch_embed.proj.weight": np.ones((8, 3, 4, 4), np.float32)})
  cut = tmp_path / "cut.safetensors"
  cut.write_bytes(data[:-20])
  with pytest.raises(CheckpointError, match=r"cut\.safetensors: not a readable safetensors file"
                                            r".*truncated or corrupt"):
    checkpoints.load_model(str(cut))
  empty = tmp_path / "empty.safetensors"
  empty.write_bytes(safetensors.numpy.save({}))
  with pytest.raises(CheckpointError, match=r"empty\.safetensors: the safetensors file holds no"):
    checkpoints.load_model(str(empty))
  named = tmp_path / "renamed.npz"  # told apart by its bytes, not its name
  named.write_bytes(data)
  with pytest.raises(CheckpointError, match=r"renamed\.npz: .*unknown checkpoint format.*"
                                            r"patch_embed"):
    checkpoints.load_model(str(named))
