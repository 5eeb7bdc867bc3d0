"""Each layer's share of variance in its first principal component: the per-minibatch
share against float64 NumPy, analytic cases, and the analysis end to end."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import vitcnn_jax as vj
from conftest import forward
from numerics import VIT_ROUNDINGS, assert_close, likely, network, worst
from vitcnn_jax import checkpoints, data
from vitcnn_jax.analyses import pc_share

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
  got, counted = jax.jit(pc_share.share)(padded, mask)
  assert_close(got, np_share(x.astype(np.float32)), share_bound(24, 30), "share")
  assert float(counted) == 1.0
  one, _ = jax.jit(pc_share.share)(np.outer(rng.standard_normal(16), rng.standard_normal(9)).astype(np.float32),
                                   np.ones(16, np.float32))
  assert_close(one, 1.0, share_bound(16, 9), "rank one")  # one direction holds everything
  flat, counted = jax.jit(pc_share.share)(np.full((16, 9), 3.0, np.float32), np.ones(16, np.float32))
  assert float(flat) == 0.0 and float(counted) == 0.0  # a constant layer counts no minibatch


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
  assert r.summary["num_examples"] == N and len(r.plot().axes) == 1


def test_a_constant_layer_is_named(tiny_vit_bit):
  vit, _ = tiny_vit_bit
  same = np.repeat(np.random.default_rng(2).integers(0, 256, (1, 32, 32, 3), dtype=np.uint8), 16, 0)
  with pytest.raises(FloatingPointError, match=r"models.vit layers \['block00/out', 'block01/out'\] "
                                               r"are constant over every minibatch"):
    vj.pc_share({"vit": vit}, same, batch_size=8, layers="blocks")
