"""Head subsets: window construction and the config end to end against a direct computation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import ROOT, forward, run_main
from support import upstream_files as uf
from support.cka_ref import np_minibatch_cka
from support.numerics import BIT_ROUNDINGS, VIT_ROUNDINGS, assert_close, cka_bound, likely, network
from support.token_grids import grid_distances
from vitcnn_jax import checkpoints
from vitcnn_jax.analyses import head_subsets as hs
from vitcnn_jax.inputs import data


def test_sliding_windows_over_sorted_heads():
  assert hs.subsets(np.array([2, 0, 3, 1]), 2, 1) == [[2, 0], [0, 3], [3, 1]]
  assert hs.subsets(np.array([2, 0, 3, 1]), 2, 2) == [[2, 0], [3, 1]]
  with pytest.raises(ValueError, match="subset_size=5"):
    hs.subsets(np.arange(4), 5, 1)


@pytest.mark.parametrize("tap", ["heads", "projected"])
def test_config_end_to_end_matches_direct_computation(tmp_path, tap):
  vit = uf.save(tmp_path / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=4, mlp=96, patch=8))
  bit = uf.save(tmp_path / "bit.npz", uf.bt_bit(0, depth=(2, 1, 1, 1)))
  wd = tmp_path / "wd"
  run_main(f"--config={ROOT}/configs/head_subsets.py:examples=32,batch=16", f"--workdir={wd}",
           f"--config.models.vit.checkpoint={vit}", f"--config.models.resnet.checkpoint={bit}",
           "--config.models.resnet.overrides.resolution=32",
           "--config.models.resnet.capture=block1/unit0[12]/out", "--config.subset_size=2",
           "--config.data.source=synthetic", "--config.data.num_examples=40", f"--config.tap={tap}")
  s = json.loads((wd / "head_subsets.json").read_text())
  assert s["resnet_layers"] == ["block1/unit01/out", "block1/unit02/out"]
  assert len(s["subsets"]) == 3 and all(len(g) == 2 for g in s["subsets"])
  assert np.all(np.diff(s["subset_distance_px"]) >= -1e-9)  # local -> global
  assert (wd / "head_subsets.png").read_bytes()[:4] == b"\x89PNG"
  # Direct computation in NumPy from separately captured activations.
  mv, pv = checkpoints.load_model(vit)
  mr, pr = checkpoints.load_model(bit, resolution=32)
  idx = data.sample(40, 32, 0, 0)
  imgs = (np.stack(data.SyntheticSource(40, 32, 0).images(idx)).astype(np.float32) - 127.5) / 127.5
  ov = forward(mv, pv, imgs, "block00/attn/*")
  orr = forward(mr, pr, imgs, "block1/unit0[12]/out")
  d = grid_distances((4, 4), 8)
  w = np.asarray(ov["block00/attn/weights"], np.float64)[:, :, 1:, 1:]
  assert_close(s["head_distance_px"], (w * d).sum(-1).mean(-1).mean(0),
               d.max() * (network(VIT_ROUNDINGS) + likely(32 * 16 * 16)), "head distances")
  heads = np.asarray(ov["block00/attn/heads"])[:, 1:]
  # Activations of two float32 forwards (compiled separately) perturb each side's Gram
  # by twice their relative difference: 4x per CKA, on top of the CKA's own bound.
  bound = cka_bound(16, 8 * 8 * 128) + 4 * (network(VIT_ROUNDINGS) + network(BIT_ROUNDINGS))
  for i, g in enumerate(s["subsets"]):
    for j, name in enumerate(s["resnet_layers"]):
      x = heads[:, :, g]
      if tap == "projected":
        kernel = pv["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_0"]["out"]["kernel"]
        x = np.einsum("bnhd,hdo->bno", x, np.asarray(kernel)[g])
      y = np.asarray(orr[name])
      ref = np_minibatch_cka([x[:16], x[16:]], [y[:16], y[16:]])
      assert_close(s["cka"][i][j], ref, bound, f"subset {i} x {name}")
