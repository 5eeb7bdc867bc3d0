"""Localization CKA: analytic token/patch cases and the config end to end."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np

from conftest import ROOT, forward, run_main
from support import upstream_files as uf
from support.cka_ref import np_minibatch_cka
from support.numerics import VIT_ROUNDINGS, assert_close, cka_bound, likely, network
from vitcnn_jax import checkpoints
from vitcnn_jax.analyses import localization as loc
from vitcnn_jax.inputs import data
from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import linear_cka
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import scales


def test_patches_are_row_major_tiles():
  img = jnp.arange(2 * 4 * 6 * 3, dtype=jnp.float32).reshape(2, 4, 6, 3)
  p = np.asarray(loc.to_patches(img, (2, 3)))
  assert p.shape == (2, 6, 2 * 2 * 3)
  np.testing.assert_array_equal(p[1, 4].reshape(2, 2, 3), np.asarray(img)[1, 2:4, 2:4])


def test_token_equal_to_transformed_own_patch_gives_one_and_independent_near_zero():
  rng = np.random.default_rng(0)
  n, grid = 64, (2, 2)
  q, _ = np.linalg.qr(rng.standard_normal((12, 12)))
  hs = 0
  for _ in range(8):
    images = rng.standard_normal((n, 4, 4, 3)).astype(np.float32)
    patches = np.asarray(loc.to_patches(jnp.asarray(images), grid))  # (n, 4, 12)
    tokens = np.stack([patches[:, 0] @ q, 2.5 * patches[:, 1],
                       rng.standard_normal((n, 12)), patches[:, 3] @ q], axis=1).astype(np.float32)
    sums = hsic.stacked_sums(loc.to_stacks(jnp.asarray(tokens), jnp.asarray(patches)))
    hs = hs + scales.unscale(jax.device_get(sums), measures.SCALES)["hsic"]
  c = linear_cka.cka_from_hsic(hs, [str(i) for i in range(8)])[:4, 4:]
  # patches @ q in float64 then float32: one rounding of the token; then the CKA's own.
  assert_close([c[0, 0], c[1, 1], c[3, 3]], 1.0, cka_bound(n, 12) + likely(1), "own patch")
  assert abs(c[0, 1]) < 0.05 and abs(c[2, 2]) < 0.05  # other patch / independent token


def test_config_end_to_end(tmp_path):
  vit = uf.save(tmp_path / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8))
  wd = tmp_path / "wd"
  run_main(f"--config={ROOT}/configs/localization.py:b32,examples=32,batch=16", f"--workdir={wd}",
           f"--config.models.vit.checkpoint={vit}", "--config.layer=block01/out",
           "--config.data.source=synthetic", "--config.data.num_examples=40")
  z = np.load(wd / "localization.npz")
  assert z["cka"].shape == (16, 16) and list(z["grid"]) == [4, 4]
  # CKA <= 1 exactly (Cauchy-Schwarz); float32 may overshoot by its bound.
  assert np.isfinite(z["cka"]).all() and (z["cka"] <= 1 + cka_bound(16, 8 * 8 * 3)).all()
  summary = json.loads((wd / "localization.json").read_text())
  assert summary["tokens"] == [5, 10]
  assert (wd / "localization.png").read_bytes()[:4] == b"\x89PNG"
  r = run_main(f"--config={ROOT}/configs/localization.py:b32,examples=32,batch=16", f"--workdir={wd}",
               f"--config.models.vit.checkpoint={vit}", "--config.layer=block09/out",
               "--config.data.source=synthetic", "--config.data.num_examples=40", check=False)
  assert r.returncode != 0 and "config.layer='block09/out'" in r.stderr


def test_gap_variant_reads_every_token_of_a_model_without_cls(tmp_path):
  """`demo_gap` (Fig 10): a GAP ViT has no class token, so token t is row t."""
  vit = uf.save(tmp_path / "gap.npz", uf.vt_vit(2, width=48, depth=2, heads=3, mlp=96, patch=8,
                                                 pool="gap"))
  wd = tmp_path / "wd"
  run_main(f"--config={ROOT}/configs/localization.py:demo_gap,examples=16,batch=8",
           f"--workdir={wd}", f"--config.models.vit_gap.checkpoint={vit}",
           "--config.layer=block01/out", "--config.data.source=synthetic",
           "--config.data.num_examples=20")
  z = np.load(wd / "localization.npz")
  assert z["cka"].shape == (16, 16)
  idx = data.sample(20, 16, 0, 0)
  imgs = (np.stack(data.SyntheticSource(20, 32, 0).images(idx)).astype(np.float32) - 127.5) / 127.5
  model, params = checkpoints.load_model(vit)
  assert model.num_prefix_tokens == 0
  tokens = np.asarray(forward(model, params, imgs, ["block01/out"])["block01/out"])
  patch = imgs.reshape(16, 4, 8, 4, 8, 3).transpose(0, 1, 3, 2, 4, 5).reshape(16, 16, -1)[:, 9]
  ref = np_minibatch_cka(np.split(tokens[:, 0], 2), np.split(patch, 2))
  assert_close(z["cka"][0, 9], ref, 2 * cka_bound(8, 192) + 4 * network(VIT_ROUNDINGS), "token 0")
