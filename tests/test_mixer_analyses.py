"""MLP-Mixer in the analyses (paper App. H): its layer set through the CKA job."""

from __future__ import annotations

import numpy as np

import upstream_files as uf
from conftest import ROOT, forward, run_main
from numerics import MIXER_ROUNDINGS, VIT_ROUNDINGS, assert_close, cka_bound, network
from test_cka import np_minibatch_cka
from vitcnn_jax import checkpoints, data


def test_cka_of_a_mixer_against_a_vit_equals_float64_numpy(tmp_path):
  vit = uf.save(tmp_path / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8))
  bit = uf.save(tmp_path / "bit.npz", uf.bt_bit(0, depth=(1, 1, 1, 1)))
  mixer = uf.save(tmp_path / "mixer.npz", uf.mixer(3))
  wd = tmp_path / "wd"
  run_main(f"--config={ROOT}/configs/cka_vit_resnet.py:demo_mixer,examples=16,batch=8,repeats=1",
           f"--workdir={wd}", f"--config.models.vit.checkpoint={vit}",
           f"--config.models.resnet.checkpoint={bit}", f"--config.models.mixer.checkpoint={mixer}",
           "--config.models.resnet.overrides.resolution=32", "--config.data.source=synthetic",
           "--config.data.num_examples=20")
  z = np.load(wd / "cka.npz")
  names = list(z["names_mixer"])
  assert names[:6] == ["block00/ln1", "block00/token_mlp/out", "block00/ln2",
                       "block00/channel_mlp/hidden", "block00/channel_mlp/out", "block00/out"]
  assert z["cka_mixer_vit"].shape == (12, 12) and (wd / "cka_mixer_vit.png").exists()
  idx = data.sample(20, 16, 0, 0)
  imgs = (np.stack(data.SyntheticSource(20, 32, 0).images(idx)).astype(np.float32) - 127.5) / 127.5
  feats = []
  for path, point in ((mixer, "block01/out"), (vit, "block01/mlp/hidden")):
    model, params = checkpoints.load_model(path)
    feats.append(np.asarray(forward(model, params, imgs, [point])[point]))
  ref = np_minibatch_cka(np.split(feats[0], 2), np.split(feats[1], 2))
  got = z["cka_mixer_vit"][names.index("block01/out"), list(z["names_vit"]).index("block01/mlp/hidden")]
  bound = 2 * cka_bound(8, 16 * 192) + 4 * (network(MIXER_ROUNDINGS) + network(VIT_ROUNDINGS))
  assert_close(got, ref, bound, "mixer block01/out vs vit block01/mlp/hidden")
