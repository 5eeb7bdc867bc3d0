"""Logit parity with timm on synthetic files in every upstream format."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import compiled
from support import timm_ref
from support import upstream_files as uf
from support.numerics import BIT_ROUNDINGS, MIXER_ROUNDINGS, VIT_ROUNDINGS, assert_close, network, worst
from vitcnn_jax import checkpoints
from vitcnn_jax.models import param_trees

# Logit tolerances relative to the largest logit: ours and timm's float32 forwards
# differ by rounding alone (numerics.network).
VIT_TOL = network(VIT_ROUNDINGS)      # 2.2e-5
MIXER_TOL = network(MIXER_ROUNDINGS)  # 1.8e-5
BIT_TOL = network(BIT_ROUNDINGS)      # 9.5e-5
VIT = dict(width=48, depth=2, heads=3, mlp=96, patch=8)


def _images(n: int = 4, size: int = 32, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def _ours(path: str, images: np.ndarray, **overrides) -> tuple[np.ndarray, dict]:
  model, params = checkpoints.load_model(path, **overrides)
  logits, out = compiled(model, params, images)
  return np.asarray(logits), out


def _check(ours: np.ndarray, ref: np.ndarray, what: str, tol: float = VIT_TOL) -> float:
  assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
  scale = float(np.abs(ref).max())
  assert scale > 1e-2  # guard against trivially equal outputs (e.g. all zeros)
  diff = assert_close(ours, ref, tol * scale, what)
  print(f"{what}: max |logit diff| = {diff:.2e} ({diff / scale:.1e} of the largest logit)")
  return diff


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_vision_transformer_format(tmp_path, pool):
  path = uf.save(tmp_path / "vit.npz", uf.vt_vit(1, pool=pool, **VIT))
  x = _images()
  ours, _ = _ours(path, x)
  ref = timm_ref.vit(path, x, pool=pool, num_classes=7, **VIT)
  _check(ours, ref, f"vision_transformer {pool}")


def test_parity_tolerance_detects_the_gelu_form(tmp_path):
  """The ViT tolerance is tight enough to tell tanh from exact GELU."""
  path = uf.save(tmp_path / "vit.npz", uf.vt_vit(1, **VIT))
  x = _images()
  ref = timm_ref.vit(path, x, pool="token", num_classes=7, **VIT)
  exact, _ = _ours(path, x, gelu="exact")
  assert float(np.abs(exact - ref).max()) > 5 * VIT_TOL * float(np.abs(ref).max())


def test_augreg_file_name_and_layout(tmp_path):
  # AugReg files are vision_transformer token files without pre_logits.
  name = "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_224.npz"
  path = uf.save(tmp_path / name, uf.vt_vit(2, **VIT))
  x = _images(seed=1)
  ours, _ = _ours(path, x)
  _check(ours, timm_ref.vit(path, x, pool="token", num_classes=7, **VIT), "AugReg")


def test_vision_transformer_pre_logits(tmp_path):
  """timm never loads pre_logits: compare its pooled features, then the head by hand."""
  w = uf.vt_vit(3, pre_logits=24, **VIT)
  path = uf.save(tmp_path / "vit_i21k.npz", w)
  x = _images(seed=2)
  model, params = checkpoints.load_model(path)
  assert model.representation_size == 24
  logits, out = model.apply({"params": params}, x)
  feats = timm_ref.vit(path, x, pool="token", num_classes=0, features=True, **VIT)
  _check(np.asarray(out["head_input"]), feats, "pre_logits file, pooled features")
  pre = np.tanh(feats.astype(np.float64) @ w["pre_logits/kernel"] + w["pre_logits/bias"])
  ref = pre @ w["head/kernel"] + w["head/bias"]
  assert_close(out["pre_logits"], pre, VIT_TOL, "pre_logits")  # tanh: |values| < 1
  _check(np.asarray(logits), ref, "pre_logits file, logits")


@pytest.mark.parametrize("pool", ["tok", "gap", "map"])
@pytest.mark.parametrize("scan", [False, True])
def test_big_vision_format(tmp_path, pool, scan):
  path = uf.save(tmp_path / "bv.npz", uf.bv_vit(4, pool=pool, scan=scan, **VIT))
  x = _images(seed=3)
  ours, _ = _ours(path, x)
  ref = timm_ref.vit(path, x, pool=pool, num_classes=7, **VIT)
  _check(ours, ref, f"big_vision {pool} scan={scan}")


def test_big_vision_opt_target_prefix(tmp_path):
  w = uf.bv_vit(5, pool="gap", prefix="opt/target/", **VIT)
  w["opt/state/step"] = np.array(1000)  # optimiser state next to the params is not the model's
  path = uf.save(tmp_path / "bv_opt.npz", w)
  x = _images(seed=4)
  ours, _ = _ours(path, x)
  _check(ours, timm_ref.vit(path, x, pool="gap", num_classes=7, **VIT), "big_vision opt/target")


def test_big_vision_bfloat16_arrays(tmp_path):
  import ml_dtypes
  w = {k: v.astype(ml_dtypes.bfloat16) for k, v in uf.bv_vit(6, pool="tok", **VIT).items()}
  path = uf.save(tmp_path / "bv_bf16.npz", w)
  with np.load(path) as z:  # numpy stores bfloat16 as 2-byte void, like big_vision files
    assert z["params/embedding/kernel"].dtype.kind == "V"
  rounded = {k: v.astype(np.float32) for k, v in w.items()}
  ref_path = uf.save(tmp_path / "bv_f32.npz", rounded)
  x = _images(seed=5)
  ours, _ = _ours(path, x)
  _check(ours, timm_ref.vit(ref_path, x, pool="tok", num_classes=7, **VIT), "big_vision bfloat16")


@pytest.mark.parametrize("depth", [(1, 2, 1, 1), (2, 1, 1, 2)])
def test_big_transfer_format(tmp_path, depth):
  path = uf.save(tmp_path / "bit.npz", uf.bt_bit(7, width=0.5, depth=depth))
  x = _images(2, 64, seed=6)
  ours, _ = _ours(path, x)
  _check(ours, timm_ref.bit(path, x, width=0.5, depth=depth, num_classes=7), f"BiT {depth}", BIT_TOL)


def test_big_transfer_numbered_convs_and_4d_groupnorm(tmp_path):
  """Quirky files must give the same logits as the clean file timm can read."""
  clean = uf.save(tmp_path / "bit.npz", uf.bt_bit(8))
  quirky = uf.save(tmp_path / "bit_q.npz", uf.bt_bit(8, numbered_convs=True, gn_4d=True))
  assert any("standardized_conv2d_3/" in k for k in np.load(quirky).files)
  x = _images(2, 48, seed=7)
  ours, _ = _ours(quirky, x)
  _check(ours, timm_ref.bit(clean, x, width=0.5, depth=(1, 2, 1, 1), num_classes=7),
         "BiT numbered convs + (1,1,1,C) GroupNorm", BIT_TOL)


def test_big_transfer_resolution_free(tmp_path):
  path = uf.save(tmp_path / "bit.npz", uf.bt_bit(9))
  x = _images(2, 40, seed=8)  # not the default 224; BiT is fully convolutional
  ours, _ = _ours(path, x)
  _check(ours, timm_ref.bit(path, x, width=0.5, depth=(1, 2, 1, 1), num_classes=7), "BiT 40px", BIT_TOL)


def test_mixer_format(tmp_path):
  cfg = dict(width=32, blocks=2, tokens_mlp=8, channels_mlp=64, patch=8)
  path = uf.save(tmp_path / "mixer.npz", uf.mixer(10, **cfg))
  x = _images(seed=9)
  ours, _ = _ours(path, x)
  _check(ours, timm_ref.mixer(path, x, num_classes=7, **cfg), "Mixer", MIXER_TOL)


def test_resolution_change_matches_upstream_resampling(tmp_path):
  """load_model(resolution=) resamples like scipy zoom(order=1), i.e. bilinear with
  align_corners=True; timm then runs the file resampled that way beforehand."""
  torch = timm_ref.torch
  w = uf.vt_vit(11, **VIT)
  path = uf.save(tmp_path / "vit.npz", w)
  model, params = checkpoints.load_model(path, resolution=48)
  assert model.image_size == 48
  pe = w["Transformer/posembed_input/pos_embedding"]
  grid = torch.from_numpy(pe[0, 1:].reshape(1, 4, 4, -1).transpose(0, 3, 1, 2))
  new = torch.nn.functional.interpolate(grid, size=(6, 6), mode="bilinear", align_corners=True)
  new = new.numpy().transpose(0, 2, 3, 1).reshape(1, 36, -1)
  # Bilinear: three lerps of two products each, in torch's float32, plus our rounding.
  assert_close(params["pos_embedding"], new, worst(10) * float(np.abs(pe).max()), "posemb")

  w2 = dict(w)
  w2["Transformer/posembed_input/pos_embedding"] = np.concatenate([pe[:, :1], new], axis=1)
  path2 = uf.save(tmp_path / "vit48.npz", w2)
  x = _images(seed=10, size=48)
  ours = np.asarray(model.apply({"params": params}, x)[0])
  _check(ours, timm_ref.vit(path2, x, pool="token", num_classes=7, **VIT), "ViT resampled to 48px")


def test_full_size_trees_by_shape(tmp_path):
  """ViT-B/16 and BiT-R50x1 key sets: our loader and timm's both accept them (not run)."""
  w = uf.vt_vit(0, width=768, depth=12, heads=12, mlp=3072, patch=16, grid=14, num_classes=1000)
  path = uf.save(tmp_path / "ViT-B_16.npz", {k: v.astype(np.float16) for k, v in w.items()})
  model, params = checkpoints.load_model(path)
  assert (model.width, model.depth, model.num_heads, model.mlp_dim, model.patch_size,
          model.image_size, model.pool) == (768, 12, 12, 3072, 16, 224, "token")
  assert params["pos_embedding"].shape == (1, 196, 768)
  assert sum(np.size(v) for v in param_trees.flatten(params).values()) == 86_567_656 - 768
  timm_vit._load_weights(timm_ref.timm.create_model("vit_base_patch16_224"), path)
  del w, params

  w = uf.bt_bit(0, width=1, depth=(3, 4, 6, 3), num_classes=1000)
  path = uf.save(tmp_path / "BiT-M-R50x1.npz", {k: v.astype(np.float16) for k, v in w.items()})
  model, params = checkpoints.load_model(path)
  assert (model.width, model.depth, model.num_classes) == (1, 50, 1000)
  assert params["block4"]["unit03"]["conv3"]["kernel"].shape == (1, 1, 512, 2048)
  timm_resnetv2._load_weights(timm_ref.timm.create_model("resnetv2_50x1_bit"), path)


timm_vit = timm_ref.timm_vit
timm_resnetv2 = timm_ref.timm_resnetv2
