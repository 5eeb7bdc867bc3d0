"""Closed-form linear probes: against an independent float64 ridge, analytic cases, end to end."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT, forward, run_main
from support import upstream_files as uf
from support.numerics import assert_close, worst
from vitcnn_jax import checkpoints
from vitcnn_jax.analyses import linear_probe
from vitcnn_jax.inputs import data
from vitcnn_jax.similarity import probe

L2S = (2.0 ** -10, 1.0, 2.0 ** 10)


def ridge_reference(x, labels, num_classes, l2):
  """float64 ridge on big_vision's inputs, solved directly (no eigendecomposition):
  (X^T X + l2 I)^-1 X^T Y for N >= D+1, X^T (X X^T + l2 I)^-1 Y otherwise."""
  x = np.asarray(x, np.float64)
  mean, std = x.mean(0), x.std(0) + 1e-5
  xa = np.hstack([(x - mean) / std, np.full((len(x), 1), 100.0)])
  y = 2.0 * (np.asarray(labels)[:, None] == np.arange(num_classes)) - 1.0
  n, d = xa.shape
  if n >= d:
    w = np.linalg.solve(xa.T @ xa + l2 * np.eye(d), xa.T @ y)
  else:
    w = xa.T @ np.linalg.solve(xa @ xa.T + l2 * np.eye(n), y)
  return mean, std, w


def _scores(mean, std, w, x):
  return np.hstack([(x - mean) / std, np.full((len(x), 1), 100.0)]) @ w


def _data(n, d, classes, seed, separation=0.6, centres=0):
  """Gaussian classes around centres drawn from `centres` (shared by train and
  test), noise from `seed`, on an offset of 3 for the whitening to remove."""
  centre = np.random.default_rng(centres).standard_normal((classes, d)) * separation
  labels = np.arange(n) % classes
  x = centre[labels] + np.random.default_rng(1000 + seed).standard_normal((n, d)) + 3.0
  return x.astype(np.float32), labels


def _moments(x, labels, classes, shift):
  s = x.astype(np.float64) - shift
  onehot = (labels[:, None] == np.arange(classes)).astype(np.float64)
  return probe.Moments(float(len(x)), s.sum(0), s.T @ s, onehot.T @ s, onehot.sum(0))


@pytest.mark.parametrize("n,d", [(60, 8), (20, 40)], ids=["N>=D", "N<D"])
def test_the_fit_equals_an_independent_float64_ridge(n, d):
  x, labels = _data(n, d, 4, 0)
  test, _ = _data(200, d, 4, 1)
  fits = [probe.fit_rows(x, labels, 4)]
  if n >= d + 1:  # the sums branch holds exactly what the rows branch does here
    fits.append(probe.fit_moments(_moments(x, labels, 4, x[:8].mean(0)), x[:8].mean(0)))
  for l2 in L2S:
    mean, std, w = ridge_reference(x, labels, 4, l2)
    want = _scores(mean, std, w, test)
    for sol in fits:
      got = _scores(sol.mean, sol.std, (sol.lhs / (sol.eigs + l2)) @ sol.rhs, test)
      # float64 eigh and solve: errors of order cond * eps64, far below 1e-6.
      assert_close(got / np.abs(want).max(), want / np.abs(want).max(), 1e-6, f"l2={l2}")


def test_float32_predictions_agree_wherever_the_margin_exceeds_rounding():
  """`predict` runs in float32 on the device: it must pick the float64 class
  wherever the top two scores differ by more than its rounding error can."""
  x, labels = _data(60, 8, 4, 2)
  test, _ = _data(400, 8, 4, 3)
  sol = probe.fit_rows(x, labels, 4)
  got = np.asarray(probe.predict(_f32(sol), jnp.asarray(test), L2S))
  for k, l2 in enumerate(L2S):
    mean, std, w = ridge_reference(x, labels, 4, l2)
    scores = _scores(mean, std, w, test)
    # Every score is sums of |terms| <= these magnitudes over D+1 features, R
    # eigen-directions and the input/whitening roundings; each term errs by <= (D+R+3) u.
    mag = _scores(0.0, std, np.abs((sol.lhs / (sol.eigs + l2)) @ sol.rhs), np.abs(test) + np.abs(mean))
    bound = 2 * worst(9 + 9 + 3) * np.abs(mag).max(axis=1)
    top2 = np.sort(scores, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > bound
    assert clear.mean() > 0.9  # the comparison covers nearly every example
    np.testing.assert_array_equal(got[k][clear], scores.argmax(1)[clear])


def _f32(sol):
  return {k: jnp.asarray(getattr(sol, k), jnp.float32) for k in ("mean", "std", "lhs", "eigs", "rhs")}


def test_separable_classes_are_learned_and_labels_without_signal_give_chance():
  x, labels = _data(400, 16, 5, 5, separation=8.0)
  x_test, y_test = _data(2000, 16, 5, 6, separation=8.0)  # same centres, new noise
  acc = lambda sol, x, y: (np.asarray(probe.predict(_f32(sol), jnp.asarray(x), [1.0]))[0] == y).mean()
  assert acc(probe.fit_rows(x, labels, 5), x_test, y_test) == 1.0
  # Features of pure noise and independent random labels: the predictions are
  # independent of the test labels, so the accuracy is binomial(2000, 1/5) / 2000,
  # within 6 sd (0.054) of 0.2 except with probability 2e-9.
  rng = np.random.default_rng(9)
  noise = lambda n: rng.standard_normal((n, 16)).astype(np.float32)
  sol = probe.fit_rows(noise(400), rng.integers(0, 5, 400), 5)
  assert abs(acc(sol, noise(2000), rng.integers(0, 5, 2000)) - 0.2) < 6 * np.sqrt(0.2 * 0.8 / 2000)


def test_few_shot_draws_are_balanced_and_repeatable():
  labels = np.random.default_rng(7).integers(0, 6, 500)
  a, b = probe.few_shot(labels, 6, 5, seed=1), probe.few_shot(labels, 6, 5, seed=1)
  np.testing.assert_array_equal(a, b)
  assert (np.bincount(labels[a], minlength=6) == 5).all() and len(set(a)) == 30
  assert set(probe.few_shot(labels, 6, 5, seed=2)) != set(a)
  # big_vision's draw: one generator per seed, class after class.
  rng = np.random.default_rng(1)
  want = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:5] for c in range(6)])
  np.testing.assert_array_equal(a, want)
  with pytest.raises(ValueError, match="class 2 has 0 examples to draw 5 shots from"):
    probe.few_shot(np.where(labels == 2, 0, labels), 6, 5, seed=0)


def _run(tmp_path, shots: int, name: str, extra=()):
  vit = uf.save(tmp_path / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8))
  bit = uf.save(tmp_path / "bit.npz", uf.bt_bit(0, depth=(1, 1, 1, 1)))
  wd = tmp_path / name
  run_main(f"--config={ROOT}/configs/linear_probe.py:demo,shots={shots},seeds=2,test=40,batch=8",
           f"--workdir={wd}", f"--config.models.vit.checkpoint={vit}",
           f"--config.models.vit_gap.checkpoint={vit}", f"--config.models.resnet.checkpoint={bit}",
           "--config.models.resnet.overrides.resolution=32", "--config.data.source=synthetic",
           "--config.data.num_examples=300", "--config.holdout=50", *extra)
  return wd, vit


@pytest.mark.parametrize("shots", [2, 6], ids=["rows", "sums"])
def test_the_job_equals_a_float64_probe_on_the_same_features(tmp_path, shots):
  """10 classes x 2 shots = 20 rows < 49 features (the rows branch); x 6 = 60 (sums)."""
  wd, vit = _run(tmp_path, shots, f"probe{shots}")
  z = np.load(wd / "linear_probe.npz")
  summary = json.loads((wd / "linear_probe.json").read_text())
  assert summary["models"]["vit"]["cls"]["points"] == ["block00/out", "block01/out"]
  assert (wd / "linear_probe.png").read_bytes()[:4] == b"\x89PNG"
  model, params = checkpoints.load_model(vit)
  src = data.SyntheticSource(300, 32, 0)
  labels = src.labels(np.arange(250))
  imgs = lambda idx: (np.stack(src.images(idx)).astype(np.float32) - 127.5) / 127.5
  held, test = np.arange(250, 300), np.arange(40)
  every = forward(model, params, imgs(np.arange(300)), ["block01/out"])["block01/out"][:, 0]
  for seed in range(2):
    shot = probe.few_shot(labels, 10, shots, seed)
    feats = [every[i] for i in (shot, held, test)]
    accs = []
    for l2 in probe.L2_SWEEP:
      mean, std, w = ridge_reference(feats[0], labels[shot], 10, l2)
      accs.append([(_scores(mean, std, w, f).argmax(1) == src.labels(i)).mean()
                   for f, i in ((feats[1], held), (feats[2], test))])
    accs = np.asarray(accs)  # (l2, [held-out, test])
    # Two float32 forwards (two compilations): a near-tie may flip one prediction per set.
    got_held = z["holdout/vit/block01/out/cls"][seed, 0]
    assert np.abs(got_held - accs[:, 0]).max() <= 1 / 50 + 1e-12
    k = probe.L2_SWEEP.index(z["l2/vit/block01/out/cls"][seed, 0])
    assert got_held[k] == got_held.max() and k == len(got_held) - 1 - np.argmax(got_held[::-1])
    assert abs(z["accuracy/vit/block01/out/cls"][seed, 0] - accs[k, 1]) <= 1 / 40 + 1e-12


def test_features_read_tokens_and_maps_as_documented():
  rng = np.random.default_rng(8)
  tokens = rng.standard_normal((3, 5, 4)).astype(np.float32)  # a class token, then 2x2
  want = {"cls": tokens[:, 0], "first": tokens[:, 1], "spatial_mean": tokens[:, 1:].mean(1),
          "mean": tokens.mean(1)}
  for how, w in want.items():
    assert_close(np.asarray(probe.features(jnp.asarray(tokens), how, 1))[:, 0], w,
                 worst(5) * np.abs(tokens).max(), how)
  np.testing.assert_array_equal(probe.features(jnp.asarray(tokens), "each", 1), tokens)
  maps = rng.standard_normal((2, 4, 6, 3)).astype(np.float32)
  pooled = maps.reshape(2, 2, 2, 2, 3, 3).mean(axis=(2, 4)).reshape(2, -1)  # to a 2x2 grid
  assert_close(np.asarray(probe.features(jnp.asarray(maps), "final_grid", 0, (2, 2)))[:, 0],
               pooled, worst(6) * np.abs(maps).max(), "final_grid")
  assert probe.check_features("cls", (1, 4, 6, 3), 0, (2, 2)).startswith("'cls' needs a class token")
  assert "does not pool evenly" in probe.check_features("final_grid", (1, 5, 6, 3), 0, (2, 2))


def test_the_figures_call_one_seed_one_draw_not_a_mean():
  assert linear_probe._over(3, 10) == "mean over 3 seeds"
  assert linear_probe._over(1, 10) == "one draw of the shots"
  assert linear_probe._over(1, 0) == "one fit on every training example"
