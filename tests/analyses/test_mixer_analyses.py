"""MLP-Mixer in the analyses (paper App. H): its layer set through the CKA job."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np

from conftest import ROOT, forward, run_main
from support import upstream_files as uf
from support.cka_ref import np_minibatch_cka
from support.numerics import MIXER_ROUNDINGS, VIT_ROUNDINGS, assert_close, cka_bound, likely, network
from support.skip_ref import sublayer_ratios
from vitcnn_jax import checkpoints
from vitcnn_jax.inputs import data


def test_cka_of_a_mixer_against_a_vit_equals_float64_numpy(tmp_path):
  vit = uf.save(tmp_path / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8))
  bit = uf.save(tmp_path / "bit.npz", uf.bt_bit(0, depth=(1, 1)))
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


def _mixer_run(tmp_path, config: str, *flags: str, models=("vit", "resnet", "mixer")):
  """A demo_mixer config on files: its demo models swapped for small ones."""
  paths = dict(vit=uf.save(tmp_path / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8)),
               resnet=uf.save(tmp_path / "bit.npz", uf.bt_bit(0, depth=(1, 1))),
               mixer=uf.save(tmp_path / "mixer.npz", uf.mixer(3)))
  wd = tmp_path / config.split(".")[0]
  run_main(f"--config={ROOT}/configs/{config}", f"--workdir={wd}",
           *[f"--config.models.{k}.checkpoint={paths[k]}" for k in models],
           *(["--config.models.resnet.overrides.resolution=32"] if "resnet" in models else []),
           "--config.data.source=synthetic", "--config.data.num_examples=20", *flags)
  return wd, paths


def _images(n_avail: int, n: int) -> np.ndarray:
  idx = data.sample(n_avail, n, 0, 0)
  return (np.stack(data.SyntheticSource(n_avail, 32, 0).images(idx)).astype(np.float32) - 127.5) / 127.5


def test_mixer_skip_ratios_are_its_residual_norms(tmp_path):
  wd, paths = _mixer_run(tmp_path, "skip_ratio.py:demo_mixer,examples=16,batch=8")
  z = np.load(wd / "skip_ratio.npz")
  assert z["mixer_ratio"].shape == (2, 2, 16) and (wd / "skip_ratio_mixer.png").exists()
  model, params = checkpoints.load_model(paths["mixer"])
  out = forward(model, params, _images(20, 16))
  bound = 2 * (network(MIXER_ROUNDINGS) + likely(32))  # two forwards, then 32-term norms
  for b in range(2):
    for s, (zn, fn) in enumerate([("in", "token_mlp/out"), ("token_mlp/residual", "channel_mlp/out")]):
      ref = sublayer_ratios(out, b, zn, fn)[2]
      assert_close(z["mixer_ratio"][b, s], ref, bound * float(np.abs(ref).max()), f"ratio {b} {s}")
  summary = json.loads((wd / "skip_ratio.json").read_text())
  mixer = summary["models"]["mixer"]
  assert mixer["sublayers"] == ["token", "channel"] and mixer["cls_ratio"] is None


def test_mixer_receptive_field_matches_direct_gradient(tmp_path):
  wd, paths = _mixer_run(tmp_path, "receptive_field.py:demo_mixer,examples=6,batch=4",
                         "--config.models.vit.overrides.resolution=32")
  z = np.load(wd / "receptive_field.npz")
  assert list(z["mixer_names"]) == ["block00/token_mlp/residual", "block00/out",
                                    "block01/token_mlp/residual", "block01/out"]
  model, params = checkpoints.load_model(paths["mixer"])
  centre = 2 * 4 + 2  # row 2 of 4, column 2; no class token

  def f(img):
    return model.apply({"params": params}, img[None], capture="block01/out")[1]["block01/out"][0, centre].mean()

  grad = jax.jit(jax.grad(f))
  ref = np.mean([np.abs(np.asarray(grad(jnp.asarray(im)))).sum(-1) for im in _images(20, 6)], axis=0)
  # Token mixing reaches every patch in one step: the map covers the whole image.
  assert (ref > 0).all()
  assert_close(z["mixer_maps"][3], ref, 2 * network(MIXER_ROUNDINGS) * float(np.abs(ref).max()),
               "Mixer map")


def test_mixer_localization_equals_float64_numpy(tmp_path):
  wd, paths = _mixer_run(tmp_path, "localization.py:demo_mixer,examples=16,batch=8",
                         "--config.layer=block01/out", models=("mixer",))
  z = np.load(wd / "localization.npz")
  assert z["cka"].shape == (16, 16) and list(z["grid"]) == [4, 4]
  imgs = _images(20, 16)
  model, params = checkpoints.load_model(paths["mixer"])
  tokens = np.asarray(forward(model, params, imgs, ["block01/out"])["block01/out"])
  patch = imgs.reshape(16, 4, 8, 4, 8, 3).transpose(0, 1, 3, 2, 4, 5).reshape(16, 16, -1)[:, 5]
  ref = np_minibatch_cka(np.split(tokens[:, 6], 2), np.split(patch, 2))
  bound = 2 * cka_bound(8, 192) + 4 * network(MIXER_ROUNDINGS)
  assert_close(z["cka"][6, 5], ref, bound, "token 6 vs patch 5")


def test_mixer_probes_run_on_token_means(tmp_path):
  wd, _ = _mixer_run(tmp_path, "linear_probe.py:demo_mixer,shots=2,seeds=1,test=20,batch=8",
                     "--config.holdout=50", "--config.data.num_examples=300", models=("vit", "mixer"))
  summary = json.loads((wd / "linear_probe.json").read_text())
  assert list(summary["models"]["mixer"]) == ["mean"]
  assert summary["models"]["mixer"]["mean"]["points"] == ["block00/out", "block01/out"]
  z = np.load(wd / "linear_probe.npz")
  acc = z["accuracy/mixer/block01/out/mean"]
  assert acc.shape == (1, 1) and 0 <= acc[0, 0] <= 1
