"""Skip-connection norm ratios: analytic cases, identity blocks, end to end."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np

from conftest import ROOT, forward, run_main
from support import upstream_files as uf
from support.numerics import BIT_ROUNDINGS, VIT_ROUNDINGS, assert_close, likely, network
from support.skip_ref import sublayer_ratios
from vitcnn_jax import checkpoints
from vitcnn_jax.analyses import skip_ratio as sr
from vitcnn_jax.inputs import data
VIT = dict(width=48, depth=2, heads=3, mlp=96, patch=8)


def test_ratio_and_cosine_analytic():
  z = jnp.asarray([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0], [2.0, 0.0]])
  f = jnp.asarray([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [-1.0, 0.0]])
  r, c = map(np.asarray, sr.ratio_and_cosine(z, f))
  np.testing.assert_allclose(r[[0, 3]], [5.0, 2.0])
  assert np.isinf(r[1]) and np.isinf(r[2])  # zero branch: infinite ratio, not NaN
  np.testing.assert_allclose(c, [5 / (1 * np.sqrt(9 + 25)), 0.0, 0.0, -1.0], atol=1e-6)
  assert not np.isnan(c).any()


def _main(tmp_path, vit_path, bit_path, name):
  wd = tmp_path / name
  run_main(f"--config={ROOT}/configs/skip_ratio.py:examples=16,batch=8", f"--workdir={wd}",
           f"--config.models.vit.checkpoint={vit_path}", f"--config.models.resnet.checkpoint={bit_path}",
           "--config.models.resnet.overrides.resolution=32", "--config.data.source=synthetic",
           "--config.data.num_examples=20")
  return wd


def test_identity_blocks_give_infinite_ratios_without_nan(tmp_path):
  w = uf.vt_vit(0, **VIT)
  for b in range(2):
    for k in ("MultiHeadDotProductAttention_1/out", "MlpBlock_3/Dense_1"):
      for leaf in ("kernel", "bias"):
        w[f"Transformer/encoderblock_{b}/{k}/{leaf}"][...] = 0
  vit = uf.save(tmp_path / "vit_id.npz", w)
  bit = uf.save(tmp_path / "bit.npz", uf.bt_bit(0, depth=(1, 1, 1, 1)))
  wd = _main(tmp_path, vit, bit, "identity")
  z = np.load(wd / "skip_ratio.npz")
  assert np.isinf(z["vit_ratio"]).all()
  assert not np.isnan(z["vit_cosine"]).any() and (z["vit_cosine"] == 0).all()
  summary = json.loads((wd / "skip_ratio.json").read_text())
  assert summary["models"]["vit"]["cls_ratio"][0] == [float("inf")] * 2
  assert (wd / "skip_ratio_vit.png").read_bytes()[:4] == b"\x89PNG"


def test_matches_direct_computation(tmp_path):
  vit = uf.save(tmp_path / "vit.npz", uf.vt_vit(1, **VIT))
  bit = uf.save(tmp_path / "bit.npz", uf.bt_bit(1, depth=(1, 1, 1, 1)))
  wd = _main(tmp_path, vit, bit, "direct")
  z = np.load(wd / "skip_ratio.npz")
  idx = data.sample(20, 16, 0, 0)
  imgs = (np.stack(data.SyntheticSource(20, 32, 0).images(idx)).astype(np.float32) - 127.5) / 127.5
  model, params = checkpoints.load_model(vit)
  out = forward(model, params, imgs)
  # Activations from two float32 forwards (compiled separately), then two 48-term norms: a
  # ratio or cosine moves by twice the relative difference of its operands.
  vit_bound = 2 * (network(VIT_ROUNDINGS) + likely(48))
  for b in range(2):
    for s, (zn, fn) in enumerate([("in", "attn/out"), ("attn/residual", "mlp/out")]):
      zz, ff, ref = sublayer_ratios(out, b, zn, fn)
      assert_close(z["vit_ratio"][b, s], ref, vit_bound * float(np.abs(ref).max()), f"ratio {b} {s}")
      oo = zz + ff
      cos = (ff * oo).sum(-1) / (np.linalg.norm(ff, axis=-1) * np.linalg.norm(oo, axis=-1))
      assert_close(z["vit_cosine"][b, s], cos.mean(0), vit_bound, f"cosine {b} {s}")
  model, params = checkpoints.load_model(bit, resolution=32)
  out = forward(model, params, imgs)
  assert list(z["resnet_units"]) == [f"block{i}/unit01" for i in range(1, 5)]
  for i, u in enumerate(z["resnet_units"]):
    s, c = np.asarray(out[f"{u}/shortcut"], np.float64), np.asarray(out[f"{u}/conv3"], np.float64)
    ref = (np.linalg.norm(s, axis=-1) / np.linalg.norm(c, axis=-1)).mean(axis=(1, 2)).mean(0)
    bound = 2 * (network(BIT_ROUNDINGS) + likely(s.shape[-1])) * float(np.abs(ref).max())
    assert_close(z["resnet_ratio"][i], ref, bound, f"{u} ratio")
