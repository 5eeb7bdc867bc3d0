"""Files timm cannot load, against float64 NumPy forwards written from the upstream
arithmetic: big_vision sincos2d / pool '0' / two-tower ViTs and bit_paper ResNets."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from conftest import compiled, ROOT, run_main
from support import numpy_ref
from support import upstream_files as uf
from support.numerics import BIT_ROUNDINGS, VIT_ROUNDINGS, assert_close, network, worst
from vitcnn_jax import checkpoints
from vitcnn_jax.models import loader
from vitcnn_jax.models import param_trees
from vitcnn_jax.models.formats.base import CheckpointError
from vitcnn_jax.run import loading

VIT = dict(width=48, depth=2, heads=3, mlp=96, patch=8)
# Ours (float32) against float64: one side's roundings only, relative to the largest output.
VIT_TOL, BIT_TOL = network(VIT_ROUNDINGS), network(BIT_ROUNDINGS)


def _images(size: int = 32, n: int = 3, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def _unprefixed(w: dict, prefix: str = "params/") -> dict:
  return {k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)}


def _check(ours, ref, tol: float, what: str) -> None:
  scale = float(np.abs(ref).max())
  assert scale > 1e-2, what
  assert_close(ours, ref, tol * scale, what)


def test_sincos2d_gap_rep_size(tmp_path, caplog):
  """big_vision's ImageNet-1k recipe: posemb sincos2d, pool gap, rep_size=True."""
  w = uf.bv_vit(1, pool="gap", posemb="sincos2d", rep_size=48, **VIT)
  path = uf.save(tmp_path / "s16.npz", w)
  with caplog.at_level(logging.WARNING, logger="vitcnn_jax"):
    model, params = checkpoints.load_model(path, resolution=32)
  assert (model.posemb, model.pool, model.representation_size) == ("sincos2d", "gap", 48)
  assert "pos_embedding" not in params
  assert "assumed pool='gap'" in caplog.text and "pool=..." in caplog.text
  _, reading = loader.load_params(path)
  assert "sin-cos" in reading.evidence["posemb"]
  for size in (32, 48):  # the embedding is computed for the grid in use, never resampled
    model, params = checkpoints.load_model(path, resolution=size)
    x = _images(size)
    _, ref = numpy_ref.bv_vit(_unprefixed(w), x, pool="gap")
    _check(compiled(model, params, x)[0], ref, VIT_TOL, f"sincos2d at {size} px")


def test_sincos2d_needs_an_otherwise_complete_file(tmp_path):
  w = uf.bv_vit(1, pool="gap", posemb="sincos2d", **VIT)
  del w["params/Transformer/encoder_norm/bias"]
  with pytest.raises(CheckpointError, match="encoder_norm/bias' is missing"):
    checkpoints.load_model(uf.save(tmp_path / "t.npz", w))
  w = uf.bv_vit(1, pool="gap", width=50, heads=2, depth=1, mlp=8, patch=8)
  del w["params/pos_embedding"]  # width 50 cannot be sincos2d: the file is incomplete
  with pytest.raises(CheckpointError, match=r"key 'params/pos_embedding' is missing"):
    checkpoints.load_model(uf.save(tmp_path / "u.npz", w))


def test_pool_0_is_an_override_and_gap_is_said_to_be_assumed(tmp_path, caplog):
  w = uf.bv_vit(2, pool="0", **VIT)
  path = uf.save(tmp_path / "p0.npz", w)
  x = _images()
  _, ref = numpy_ref.bv_vit(_unprefixed(w), x, pool="0")
  model, params = checkpoints.load_model(path, pool="0")
  assert model.pool == "0" and model.num_prefix_tokens == 0
  _check(compiled(model, params, x)[0], ref, VIT_TOL, "pool 0")
  with caplog.at_level(logging.WARNING, logger="vitcnn_jax"):
    model, params = checkpoints.load_model(path)
  assert model.pool == "gap" and "pool" in caplog.text
  gap = np.asarray(compiled(model, params, x)[0])
  assert np.abs(gap - ref).max() > 100 * VIT_TOL * np.abs(ref).max()  # the assumption matters
  with pytest.raises(CheckpointError, match="pool='0' contradicts.*cls"):
    checkpoints.load_model(uf.save(tmp_path / "tok.npz", uf.bv_vit(2, pool="tok", **VIT)), pool="0")


def test_bit_paper_pads_the_root_pool_with_minus_infinity(tmp_path):
  w = uf.bv_bit(3)
  path = uf.save(tmp_path / "bp.npz", w)
  x = _images(32)
  model, params = checkpoints.load_model(path)
  assert model.root_pool_pad == "-inf"
  ref = numpy_ref.bit_paper(_unprefixed(w), x, pool_pad=-np.inf)
  _check(compiled(model, params, x)[0], ref, BIT_TOL, "bit_paper")
  zero = numpy_ref.bit_paper(_unprefixed(w), x, pool_pad=0.0)
  assert np.abs(zero - ref).max() > 100 * BIT_TOL * np.abs(ref).max()  # the padding matters
  model, params = checkpoints.load_model(path, root_pool_pad="zero")  # overridable
  _check(compiled(model, params, x)[0], zero, BIT_TOL, "bit_paper run with zero padding")


def test_bit_inference_form_standardises_once_and_computes_the_same(tmp_path):
  """What the driver runs (`loading.loaded` -> `for_inference`): kernels standardised
  once, the model told so; every point still within the float64 forward's bound."""
  w = uf.bv_bit(3)
  x = _images(32)
  model, params = checkpoints.load_model(uf.save(tmp_path / "bp.npz", w))
  m = loading.loaded("resnet", "bp.npz", "R", model, params, "paper")
  assert m.model.standardized and not model.standardized
  k = np.asarray(m.params["block2"]["unit01"]["conv2"]["kernel"], np.float64)
  assert_close(k.mean(axis=(0, 1, 2)), 0.0, worst(k[..., 0].size) * float(np.abs(k).max()), "mean")
  assert_close(k.var(axis=(0, 1, 2)), 1.0, 4 * worst(k[..., 0].size), "variance")
  np.testing.assert_array_equal(m.params["head"]["kernel"], params["head"]["kernel"])  # not a conv
  ref = numpy_ref.bit_paper(_unprefixed(w), x, pool_pad=-np.inf)
  _check(compiled(m.model, m.params, x)[0], ref, BIT_TOL, "bit_paper, inference form")
  again, same = m.model.for_inference(m.params)  # idempotent
  assert again is m.model and same is m.params


def test_big_transfer_pads_the_root_pool_with_zeros(tmp_path):
  """The same weights in the big_transfer format run as big_transfer does."""
  bp = _unprefixed(uf.bv_bit(3))
  model, params = checkpoints.load_model(uf.save(tmp_path / "bp.npz", uf.bv_bit(3)))
  bt = checkpoints.to_upstream(model.clone(root_pool_pad="zero"), params, "bit")
  model, params = checkpoints.load_model(uf.save(tmp_path / "bt.npz", bt))
  assert model.root_pool_pad == "zero"
  x = _images(32)
  ref = numpy_ref.bit_paper(bp, x, pool_pad=0.0)
  _check(compiled(model, params, x)[0], ref, BIT_TOL, "big_transfer")
  with pytest.raises(ValueError, match="padded by -inf.*Save as 'bit'"):
    checkpoints.to_upstream(model, params, "big_vision_bit")


@pytest.mark.parametrize("num_classes", [None, 16])
def test_two_tower_image_tower(tmp_path, num_classes):
  tower = uf.bv_vit(4, pool="map", num_classes=num_classes, prefix="", **VIT)
  path = uf.save(tmp_path / "siglip.npz", uf.two_tower(tower))
  model, params = checkpoints.load_model(f"{path}:img")
  assert model.pool == "map" and model.num_classes == num_classes
  x = _images()
  feats, ref = numpy_ref.bv_vit(tower, x, pool="map")
  out, named = compiled(model, params, x)
  _check(named["head_input"], feats, VIT_TOL, "image tower features")
  _check(out, ref, VIT_TOL, "image tower output")
  assert ("logits" in named) == bool(num_classes)


def test_two_tower_errors_list_the_towers(tmp_path):
  path = uf.save(tmp_path / "lit.npz", uf.two_tower(uf.bv_vit(4, pool="map", prefix="", **VIT)))
  with pytest.raises(CheckpointError, match=r"two-tower checkpoint \(towers \['img', 'txt'\]\).*lit\.npz:img"):
    checkpoints.load_model(path)
  with pytest.raises(CheckpointError, match=r"no tower 'image'.*\['img', 'txt'\]"):
    checkpoints.load_model(f"{path}:image")


def test_inspect_shows_numerics_and_assumptions(tmp_path):
  vit = uf.save(tmp_path / "lit.npz", uf.two_tower(uf.bv_vit(5, pool="gap", posemb="sincos2d",
                                                             num_classes=None, prefix="", **VIT)))
  wd = tmp_path / "wd"
  r = run_main(f"--config={ROOT}/configs/inspect.py:{vit}:img", f"--workdir={wd}",
               "--config.overrides.resolution=32")
  s = json.loads((wd / "inspect.json").read_text())
  assert s["format"] == "big_vision" and s["architecture"]["posemb"] == "sincos2d"
  assert s["assumed"] == ["pool"] and "gap" in s["evidence"]["pool"]
  assert "sin-cos" in s["evidence"]["posemb"] and "assumed" in r.stdout
  bit = uf.save(tmp_path / "bp.npz", uf.bv_bit(3))
  run_main(f"--config={ROOT}/configs/inspect.py:{bit}", f"--workdir={tmp_path / 'wd2'}")
  s = json.loads((tmp_path / "wd2" / "inspect.json").read_text())
  assert s["architecture"]["root_pool_pad"] == "-inf" and "bit_paper" in s["evidence"]["root_pool_pad"]


@pytest.mark.parametrize("fmt,kw", [("big_vision", dict(pool="gap", posemb="sincos2d")),
                                    ("big_vision", dict(pool="0"))])
def test_round_trip_of_the_new_options(tmp_path, fmt, kw):
  path = uf.save(tmp_path / "a.npz", uf.bv_vit(6, **kw, **VIT))
  model, params = checkpoints.load_model(path, resolution=32, pool=kw["pool"])
  with pytest.raises(ValueError, match="save with format='big_vision'"):
    checkpoints.to_upstream(model, params, "vit")
  checkpoints.save(str(tmp_path / "b.npz"), model, params)
  model2, params2 = checkpoints.load_model(str(tmp_path / "b.npz"), resolution=32, pool=kw["pool"])
  assert model2 == model
  for k, v in param_trees.flatten(params).items():
    np.testing.assert_array_equal(np.asarray(v), np.asarray(param_trees.flatten(params2)[k]))


def test_a_headless_image_tower_runs_through_the_cka_job(tmp_path):
  tower = uf.save(tmp_path / "lit.npz", uf.two_tower(uf.bv_vit(7, pool="map", num_classes=None,
                                                               prefix="", **VIT)))
  bit = uf.save(tmp_path / "bit.npz", uf.bt_bit(0, depth=(1, 1, 1, 1)))
  wd = tmp_path / "wd"
  run_main(f"--config={ROOT}/configs/cka_vit_resnet.py:examples=16,batch=8,repeats=1",
           f"--workdir={wd}", f"--config.models.vit.checkpoint={tower}:img",
           "--config.models.vit.overrides.resolution=32", f"--config.models.resnet.checkpoint={bit}",
           "--config.models.resnet.overrides.resolution=32", "--config.data.source=synthetic",
           "--config.data.num_examples=20", "--config.models.resnet.capture=('blocks',)")
  z = np.load(wd / "cka.npz")  # the tower's points, against the partner's unit outputs
  assert z["cka_resnet_vit"].shape == (4, 12) and np.isfinite(z["cka_resnet_vit"]).all()
