"""Each layer's share of variance in its first principal component: the per-minibatch
share against float64 NumPy, analytic cases, and the analysis end to end."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from conftest import forward
from support.numerics import VIT_ROUNDINGS, assert_close, likely, network, worst
import vitcnn_jax as vj
from vitcnn_jax import checkpoints
from vitcnn_jax.analyses import pc_share
from vitcnn_jax.inputs import data

N, BATCH = 44, 8  # 5 full minibatches and one of 4


def np_share(x: np.ndarray) -> float:
  """Largest squared singular value of the centred rows over their sum, float64."""
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  s = np.linalg.svd(x - x.mean(0), compute_uv=False) ** 2
  return float(s[0] / s.sum())


def share_bound(n: int, d: int) -> float:
  """Absolute float32 error of a share of n rows of d features: the centring (n) and
  the Gram's dots (d) move every entry by likely(n, d) of the trace at most, the
  eigensolver by worst(n) of it (backward stable), the trace's sum by likely(n);
  top and trace each."""
  return 2 * (likely(n, d) + worst(n)) + likely(n)


def test_share_matches_numpy_on_known_spectra_with_padding():
  rng = np.random.default_rng(0)
  q, _ = np.linalg.qr(rng.standard_normal((30, 30)))
  x = (rng.standard_normal((24, 30)) * np.geomspace(5, 0.1, 30)) @ q.T + 7.0  # an offset to centre away
  padded = np.concatenate([x, rng.standard_normal((8, 30)) * 100]).astype(np.float32)
  mask = np.r_[np.ones(24), np.zeros(8)].astype(np.float32)
  got, counted, weights = jax.jit(pc_share.share)(padded, mask)
  assert_close(got, np_share(x.astype(np.float32)), share_bound(24, 30), "share")
  assert float(counted) == 1.0 and not np.asarray(weights)[24:].any()
  assert_close(np.asarray(weights)[:24], np_dominance(x.astype(np.float32)), share_bound(24, 30),
               "each example's share of the component")
  assert_close(np.asarray(weights).sum(), got, share_bound(24, 30), "the shares sum to the layer's")
  one, _, _ = jax.jit(pc_share.share)(np.outer(rng.standard_normal(16), rng.standard_normal(9)).astype(np.float32),
                                      np.ones(16, np.float32))
  assert_close(one, 1.0, share_bound(16, 9), "rank one")  # one direction holds everything
  flat, counted, _ = jax.jit(pc_share.share)(np.full((16, 9), 3.0, np.float32), np.ones(16, np.float32))
  assert float(flat) == 0.0 and float(counted) == 0.0  # a constant layer counts no minibatch


def np_dominance(x: np.ndarray) -> np.ndarray:
  """Each row's share of the layer's variance on the first principal component,
  float64: lambda_1 u_i^2 / trace."""
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  u, s, _ = np.linalg.svd(x - x.mean(0), full_matrices=False)
  return s[0] ** 2 * u[:, 0] ** 2 / (s ** 2).sum()


def test_the_most_dominant_rows_are_left_out():
  score = np.asarray([0.1, 0.9, 0.3, 0.8, 0.2, 5.0, 0.0, 0.0], np.float32)
  mask = np.asarray([1, 1, 1, 1, 1, 0, 0, 0], np.float32)  # the padding row's 5.0 does not count
  keep = np.asarray(jax.jit(pc_share.without_dominant, static_argnums=2)(score, mask, 0.3))
  np.testing.assert_array_equal(keep, [1, 0, 1, 0, 1, 0, 0, 0])  # ceil(0.3 x 5) = 2 left out


def test_the_analysis_is_the_mean_over_its_minibatches(tiny_vit_bit):
  vit, _ = tiny_vit_bit
  images = np.random.default_rng(1).integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
  r = vj.pc_share({"ViT": vit}, images, num_examples=N, batch_size=BATCH, layers="blocks")
  assert r.names == {"vit": ["block00/out", "block01/out"]}
  model, params = checkpoints.load_model(vit)
  idx = data.sample(64, N, 0, 0)  # the analysis's sample: minibatches of consecutive rows
  x = (images[idx].astype(np.float32) - 127.5) / 127.5
  out = forward(model, params, x, ["block00/out", "block01/out"])
  per = np.asarray([[np_share(out[n][i:i + BATCH]) for n in r.names["vit"]] for i in range(0, N, BATCH)])
  # Another compile's activations: the Gram moves by twice their relative difference,
  # the ratio of two of its functions by twice that again.
  bound = share_bound(BATCH, 17 * 48) + 4 * network(VIT_ROUNDINGS)
  assert_close(r["share_vit"], per.mean(0), bound, "mean share")
  assert_close(r["std_vit"], per.std(0), 2 * bound, "spread over minibatches")
  assert r.summary["models"]["vit"]["minibatches"] == 6
  assert r.summary["models"]["vit"]["block_outputs"] == [0, 1]  # the findings' other layer set: all here
  assert r.summary["num_examples"] == N and len(r.plot().axes) == 1


def test_a_constant_layer_is_named(tiny_vit_bit):
  vit, _ = tiny_vit_bit
  same = np.repeat(np.random.default_rng(2).integers(0, 256, (1, 32, 32, 3), dtype=np.uint8), 16, 0)
  with pytest.raises(FloatingPointError, match=r"models.vit layers \['block00/out', 'block01/out'\] "
                                               r"are constant over every minibatch"):
    vj.pc_share({"vit": vit}, same, batch_size=8, layers="blocks")


def test_cka_without_the_dominant_examples_of_each_minibatch(tiny_vit_bit):
  """The analysis's two maps against float64 NumPy: each minibatch's dominance from
  the same activations, its most dominant example left out, minibatch CKA of the rest."""
  from support.cka_ref import np_minibatch_cka
  vit, _ = tiny_vit_bit
  images = np.random.default_rng(3).integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
  with pytest.raises(ValueError, match=r"leaves the smallest minibatch \(4 examples\) fewer than 4"):
    vj.pc_share({"ViT": vit}, images, num_examples=N, batch_size=BATCH, drop_fraction=0.1)
  n = N - 4  # minibatches of 8 only: each keeps 7
  r = vj.pc_share({"ViT": vit}, images, num_examples=n, batch_size=BATCH, layers="blocks",
                  drop_fraction=0.1)
  model, params = checkpoints.load_model(vit)
  idx = data.sample(64, n, 0, 0)
  np.testing.assert_array_equal(r["sample"], idx)
  x = (images[idx].astype(np.float32) - 127.5) / 127.5
  out = forward(model, params, x, ["block00/out", "block01/out"])
  names = r.names["vit"]
  kept, scores, gaps = {n: [] for n in names}, [], []
  for i in range(0, n, BATCH):
    score = sum(np_dominance(out[p][i:i + BATCH]) for p in names)
    drop = int(np.ceil(0.1 * len(score)))
    order = np.argsort(-score)
    gaps.append(score[order[drop - 1]] - score[order[drop]])
    scores.append(score)
    for p in names:
      kept[p].append(np.delete(out[p][i:i + BATCH], order[:drop], axis=0))
  bound = share_bound(BATCH, 17 * 48) + 4 * network(VIT_ROUNDINGS)
  assert min(gaps) > 2 * len(names) * bound  # the same examples are left out in float32
  assert_close(r["scores"], np.concatenate(scores), len(names) * bound, "dominance")
  want = np_minibatch_cka(kept[names[0]], kept[names[1]])
  assert_close(r["without_cka_vit_vit"][0, 1], want, 2 * bound, "CKA without the dominant")
  for figure in ("pc_share.png", "without_dominant_vit_vit.png"):  # the analysis's figures
    with open(f"{r.workdir}/{figure}", "rb") as f:
      assert f.read(4) == b"\x89PNG", figure
  assert r.summary["kept_examples"] == n - 5  # one of each minibatch
  assert r.summary["dominant_examples"][0]["index"] == int(idx[np.argmax(np.concatenate(scores))])
  assert len(r.plot()) == 2  # the share per layer, and the maps with and without
