"""load_model: architecture inference, round trips, and clear errors on bad input."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from support import upstream_files as uf
from vitcnn_jax import checkpoints
from vitcnn_jax import fileio
from vitcnn_jax.models import BiT, Mixer, ViT
from vitcnn_jax.models import param_trees
from vitcnn_jax.models.formats.base import CheckpointError

VIT = dict(width=48, depth=2, heads=3, mlp=96, patch=8)


@pytest.fixture
def vit_file(tmp_path):
  return uf.save(tmp_path / "vit.npz", uf.vt_vit(0, **VIT))


# --- inference ---------------------------------------------------------------


def test_infers_vit_architecture(vit_file):
  model, _ = checkpoints.load_model(vit_file)
  assert isinstance(model, ViT)
  assert (model.width, model.depth, model.num_heads, model.mlp_dim, model.patch_size,
          model.image_size, model.pool, model.representation_size, model.num_classes,
          model.gelu) == (48, 2, 3, 96, 8, 32, "token", None, 7, "tanh")


def test_infers_map_and_gap_and_bit_and_mixer(tmp_path):
  m, _ = checkpoints.load_model(uf.save(tmp_path / "a.npz", uf.bv_vit(0, pool="map", scan=True, **VIT)))
  assert (m.pool, m.depth) == ("map", 2)
  m, _ = checkpoints.load_model(uf.save(tmp_path / "b.npz", uf.vt_vit(0, pool="gap", **VIT)))
  assert m.pool == "gap"
  m, _ = checkpoints.load_model(uf.save(tmp_path / "c.npz", uf.bt_bit(0, depth=(1, 1, 2, 1))))
  assert isinstance(m, BiT) and (m.width, m.depth, m.num_classes) == (0.5, (1, 1, 2, 1), 7)
  m, _ = checkpoints.load_model(uf.save(tmp_path / "d.npz", uf.mixer(0)))
  assert isinstance(m, Mixer) and (m.hidden_dim, m.num_blocks, m.tokens_mlp_dim,
                                   m.channels_mlp_dim, m.image_size) == (32, 2, 8, 64, 32)


def test_vt_cls_row_is_folded_into_cls(tmp_path):
  w = uf.vt_vit(0, **VIT)
  _, params = checkpoints.load_model(uf.save(tmp_path / "v.npz", w))
  pe = w["Transformer/posembed_input/pos_embedding"]
  np.testing.assert_array_equal(params["cls"], w["cls"] + pe[:, :1])
  np.testing.assert_array_equal(params["pos_embedding"], pe[:, 1:])


# --- the readers' registry -----------------------------------------------------


def _toy_reader():
  """What a contributor writes for another upstream's files: one declaration. Its
  files are vision_transformer ViTs whose keys carry a `toy::` prefix."""
  import dataclasses
  from vitcnn_jax.models.formats.base import Keys, Reader
  from vitcnn_jax.models.vit import google

  def read(keys: Keys):
    inner = Keys({k.removeprefix("toy::"): keys.take(k) for k in list(keys.flat)}, keys.path, "vit")
    r = google.READER.read(inner)
    inner.finish()
    return dataclasses.replace(r, fmt="toy_vit")

  return Reader(formats={"toy_vit": "a ViT npz with toy:: keys"}, policy="resize", read=read,
                detect=lambda flat: "toy_vit" if all(k.startswith("toy::") for k in flat) else None,
                adapt=google.READER.adapt)


def test_a_new_reader_is_one_declaration_in_its_family(tmp_path, monkeypatch):
  """Registered in its family, a reader is asked of every file (no order to choose),
  named in the unknown-format error, and loads like the upstream it wraps."""
  import dataclasses
  from vitcnn_jax import models
  w = uf.vt_vit(0, **VIT)
  toy = uf.save(tmp_path / "toy.npz", {f"toy::{k}": v for k, v in w.items()})
  with pytest.raises(CheckpointError, match="unknown checkpoint format") as e:
    checkpoints.load(toy)
  assert "toy_vit" not in str(e.value) and "timm_eva" in str(e.value)
  vit = models.FAMILIES["vit"]
  monkeypatch.setitem(models.FAMILIES, "vit", dataclasses.replace(vit, readers=(*vit.readers, _toy_reader())))
  c = checkpoints.load(toy)
  _, want = checkpoints.load_model(uf.save(tmp_path / "vit.npz", w))
  assert c.fmt == "toy_vit" and c.policy_from == "the evaluation of a toy_vit file's upstream"
  for k, v in param_trees.flatten(want).items():
    np.testing.assert_array_equal(param_trees.flatten(c.params)[k], v)
  with pytest.raises(CheckpointError, match="unknown checkpoint format.*toy_vit"):
    checkpoints.load(uf.save(tmp_path / "other.npz", {"nothing/here": np.zeros(3, np.float32)}))


def test_two_readers_claiming_one_file_are_refused_unless_one_narrows_the_other(tmp_path, monkeypatch):
  """timm's Eva files carry timm ViT's keys: Eva's reader declares that it narrows
  `timm`. Without that declaration, an Eva file fits two formats and is refused."""
  import dataclasses
  from vitcnn_jax import models
  from vitcnn_jax.models import loader
  flat = {"patch_embed.proj.weight": np.zeros((4, 3, 2, 2), np.float32),
          "blocks.0.attn.qkv.weight": np.zeros((12, 4), np.float32)}  # no pos_embed: DINOv3's
  assert loader.detect(flat)[0] == "timm_eva"
  vit = models.FAMILIES["vit"]
  blunt = tuple(dataclasses.replace(r, narrows=()) for r in vit.readers)
  monkeypatch.setitem(models.FAMILIES, "vit", dataclasses.replace(vit, readers=blunt))
  with pytest.raises(CheckpointError, match=r"fit 2 formats, \['timm', 'timm_eva'\].*narrows"):
    loader.detect(flat, "eva.safetensors")


# --- round trips ---------------------------------------------------------------


def _random_params(model, size):
  return param_trees.random_params(model, np.zeros((1, size, size, 3), np.float32), seed=1)


ROUND_TRIP = [
    (ViT(num_classes=5, patch_size=8, image_size=32, width=32, depth=2, mlp_dim=64, num_heads=4), "vit"),
    (ViT(num_classes=5, patch_size=8, image_size=32, width=32, depth=2, mlp_dim=64, num_heads=4,
         pool="gap", representation_size=16), "vit"),
    (ViT(num_classes=5, patch_size=8, image_size=32, width=32, depth=2, mlp_dim=64, num_heads=4), "big_vision"),
    (ViT(num_classes=5, patch_size=8, image_size=32, width=32, depth=2, mlp_dim=64, num_heads=4,
         pool="map"), "big_vision"),
    (BiT(num_classes=5, width=0.5, depth=(1, 2, 1, 1)), "bit"),
    (BiT(num_classes=5, width=0.5, depth=(1, 2, 1, 1), root_pool_pad="-inf"), "big_vision_bit"),
    (Mixer(num_classes=5, patch_size=8, image_size=32, hidden_dim=32, num_blocks=2,
           tokens_mlp_dim=8, channels_mlp_dim=64), "mixer"),
]


@pytest.mark.parametrize("model,fmt", ROUND_TRIP, ids=lambda v: v if isinstance(v, str) else type(v).__name__)
def test_round_trip_identical_params(tmp_path, model, fmt):
  params = _random_params(model, 32)
  path = str(tmp_path / "out.npz")
  checkpoints.save(path, model, params, fmt)
  model2, params2 = checkpoints.load_model(path)
  assert model2 == model
  flat, flat2 = param_trees.flatten(params), param_trees.flatten(params2)
  assert flat.keys() == flat2.keys()
  for k in flat:
    np.testing.assert_array_equal(np.asarray(flat[k]), np.asarray(flat2[k]), err_msg=k)


def test_export_uses_upstream_key_names(tmp_path):
  """Our vision_transformer export has exactly the key set of an official file."""
  w = uf.vt_vit(0, **VIT)
  model, params = checkpoints.load_model(uf.save(tmp_path / "v.npz", w))
  arrays = checkpoints.to_upstream(model, params, "vit")
  assert {k: v.shape for k, v in arrays.items()} == {k: v.shape for k, v in w.items()}
  w = uf.bt_bit(0)
  model, params = checkpoints.load_model(uf.save(tmp_path / "b.npz", w))
  arrays = checkpoints.to_upstream(model, params)
  assert {k: v.shape for k, v in arrays.items()} == {k: v.shape for k, v in w.items()}


def test_map_model_refuses_vision_transformer_format(tmp_path):
  model = ViT(num_classes=5, patch_size=8, image_size=32, width=32, depth=1, mlp_dim=64,
              num_heads=4, pool="map")
  with pytest.raises(ValueError, match="big_vision"):
    checkpoints.save(str(tmp_path / "x.npz"), model, _random_params(model, 32), "vit")


# --- bad input ---------------------------------------------------------------


def test_missing_file(tmp_path):
  path = str(tmp_path / "nope.npz")
  with pytest.raises(FileNotFoundError, match="nope.npz"):
    checkpoints.load_model(path)


def test_truncated_file(tmp_path, vit_file):
  data = open(vit_file, "rb").read()
  path = tmp_path / "trunc.npz"
  path.write_bytes(data[: len(data) // 2])
  with pytest.raises(CheckpointError, match=r"trunc\.npz.*truncated or corrupt"):
    checkpoints.load_model(str(path))


def test_corrupt_file(tmp_path, vit_file):
  data = bytearray(open(vit_file, "rb").read())
  data[2000:2400] = b"\x00" * 400  # damage the first member's bytes
  path = tmp_path / "corrupt.npz"
  path.write_bytes(bytes(data))
  with pytest.raises(CheckpointError, match=r"corrupt\.npz"):
    checkpoints.load_model(str(path))


def test_not_an_npz(tmp_path):
  path = tmp_path / "junk.npz"
  path.write_bytes(b"this is not a checkpoint")
  with pytest.raises(CheckpointError, match=r"junk\.npz.*not a readable npz"):
    checkpoints.load_model(str(path))
  path = tmp_path / "single.npy"
  np.save(path, np.zeros(3))
  with pytest.raises(CheckpointError, match="single array"):
    checkpoints.load_model(str(path))


def test_unknown_format(tmp_path):
  path = uf.save(tmp_path / "other.npz", {"conv1/weight": np.zeros((3, 3))})
  with pytest.raises(CheckpointError, match=r"other\.npz.*unknown checkpoint format.*conv1/weight"):
    checkpoints.load_model(path)


def test_missing_key(tmp_path):
  w = uf.vt_vit(0, **VIT)
  del w["Transformer/encoderblock_1/MultiHeadDotProductAttention_1/value/bias"]
  path = uf.save(tmp_path / "missing.npz", w)
  with pytest.raises(CheckpointError,
                     match=r"missing\.npz.*encoderblock_1/MultiHeadDotProductAttention_1/value/bias.*missing"):
    checkpoints.load_model(path)


def test_missing_bit_unit_key(tmp_path):
  w = uf.bt_bit(0)
  del w["resnet/block2/unit02/b/group_norm/beta"]
  with pytest.raises(CheckpointError, match="resnet/block2/unit02/b/group_norm/beta"):
    checkpoints.load_model(uf.save(tmp_path / "b.npz", w))


def test_extra_key_is_not_ignored(tmp_path):
  w = uf.vt_vit(0, **VIT)
  w["Transformer/encoderblock_0/Adapter_0/kernel"] = np.zeros((48, 8), np.float32)
  path = uf.save(tmp_path / "extra.npz", w)
  with pytest.raises(CheckpointError, match=r"extra\.npz.*Adapter_0/kernel \(48, 8\)"):
    checkpoints.load_model(path)


def test_extra_mixer_key_is_not_ignored(tmp_path):
  w = uf.mixer(0)
  w["pre_logits/kernel"] = np.zeros((32, 32), np.float32)
  with pytest.raises(CheckpointError, match="pre_logits/kernel"):
    checkpoints.load_model(uf.save(tmp_path / "m.npz", w))


def test_block_numbering_gap(tmp_path):
  w = uf.vt_vit(0, depth=3, **{k: v for k, v in VIT.items() if k != "depth"})
  for k in [k for k in w if k.startswith("Transformer/encoderblock_1/")]:
    del w[k]
  with pytest.raises(CheckpointError, match="gaps"):
    checkpoints.load_model(uf.save(tmp_path / "gap.npz", w))


def test_shape_mismatch(tmp_path):
  w = uf.vt_vit(0, **VIT)
  w["Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"] = np.zeros((48, 80), np.float32)
  w["Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias"] = np.zeros((80,), np.float32)
  path = uf.save(tmp_path / "shape.npz", w)
  with pytest.raises(CheckpointError,
                     match=r"shape\.npz.*encoderblock_1/MlpBlock_3/Dense_0/bias has shape \(80,\).*\(96,\)"):
    checkpoints.load_model(path)


def test_override_contradicting_file(vit_file):
  with pytest.raises(CheckpointError, match=r"num_classes=10 contradicts.*num_classes=7.*head/kernel \(48, 7\)"):
    checkpoints.load_model(vit_file, num_classes=10)
  with pytest.raises(CheckpointError, match=r"pool='gap' contradicts.*cls"):
    checkpoints.load_model(vit_file, pool="gap")
  model, _ = checkpoints.load_model(vit_file, width=48, patch_size=(8, 8))  # agreeing is fine
  assert model.width == 48


def test_unknown_override_and_bad_values(vit_file, tmp_path):
  with pytest.raises(ValueError, match="unknown override widht"):
    checkpoints.load_model(vit_file, widht=48)
  with pytest.raises(ValueError, match="not a multiple of the patch size"):
    checkpoints.load_model(vit_file, resolution=36)
  mixer_path = uf.save(tmp_path / "m.npz", uf.mixer(0))
  with pytest.raises(CheckpointError, match="token-mixing MLP fixes its input to 32x32"):
    checkpoints.load_model(mixer_path, resolution=64)
  with pytest.raises(ValueError, match=r"gelu='bogus' is not one of \['exact', 'quick', 'tanh'\]"):
    checkpoints.load_model(vit_file, gelu="bogus")


def test_wrong_image_size_names_both_shapes(vit_file):
  model, params = checkpoints.load_model(vit_file)
  with pytest.raises(ValueError, match=r"built for 32x32 images but got 48x48.*resolution="):
    model.apply({"params": params}, np.zeros((1, 48, 48, 3), np.float32))


def test_gs_path_without_backend_says_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "gcsfs", None)  # make `import gcsfs` fail
  monkeypatch.setitem(sys.modules, "tensorflow", None)
  with pytest.raises(ImportError, match=r"gs://vit_models/x\.npz.*pip install gcsfs"):
    fileio.read_bytes("gs://vit_models/x.npz")


def test_gs_path_without_network_fails_at_once(monkeypatch):
  """gcsfs would retry for about a minute; an unresolvable host is reported at once."""
  import socket
  import time

  def no_dns(*args, **kwargs):
    raise socket.gaierror(-2, "Name or service not known")

  monkeypatch.setattr(socket, "getaddrinfo", no_dns)
  start = time.time()
  with pytest.raises(FileNotFoundError, match=r"gs://vit_models/x\.npz: cannot reach storage\.googleapis\.com"):
    fileio.read_bytes("gs://vit_models/x.npz")
  assert time.time() - start < 5
