"""Closed-form linear probes (big_vision's few-shot least squares) and the features they read.

A probe is ridge regression to targets 2 * onehot - 1 on features whitened with
the training mean and standard deviation (+1e-5), with a constant bias column of
100 (so the bias is hardly regularised); its prediction is the argmax. Written
as lhs diag(1 / (eigs + l2)) rhs, one eigendecomposition serves every l2:
  N >= D+1: eigh(X^T X) = q diag(eigs) q^T, lhs = q,       rhs = q^T X^T Y
  N <  D+1: eigh(X X^T) = q diag(eigs) q^T, lhs = X^T q,   rhs = q^T Y
The first needs only sums over examples (`Moments`); the second the few
training rows themselves, which is never more than the first would hold.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

BIAS = 100.0
STD_EPS = 1e-5
L2_SWEEP = tuple(2.0 ** i for i in range(-10, 20))  # Google's usual list
HIGHEST = jax.lax.Precision.HIGHEST


def few_shot(labels: np.ndarray, num_classes: int, shots: int, seed: int) -> np.ndarray:
  """`shots` indices of each class, drawn as big_vision does: one generator per
  seed permutes the positions of class 0, then class 1, ...; the first `shots`
  of each permutation are kept (class-major order)."""
  labels = np.asarray(labels)
  rng = np.random.default_rng(seed)
  out = []
  for c in range(num_classes):
    where = np.flatnonzero(labels == c)
    if len(where) < shots:
      raise ValueError(f"class {c} has {len(where)} examples to draw {shots} shots from.")
    out.append(rng.permutation(where)[:shots])
  return np.concatenate(out)


@dataclasses.dataclass
class Moments:
  """Sums over the training rows of x - shift (float64): enough to fit when N >= D+1."""
  count: float
  total: np.ndarray  # (D,) sum of x - shift
  gram: np.ndarray  # (D, D) sum of (x - shift)(x - shift)^T
  class_totals: np.ndarray  # (C, D) sum of x - shift over each class's rows
  class_counts: np.ndarray  # (C,)


@dataclasses.dataclass
class Solution:
  """A fitted probe for every l2 at once."""
  mean: np.ndarray  # (D,) whitening, in the features' own coordinates
  std: np.ndarray  # (D,)
  lhs: np.ndarray  # (D+1, R)
  eigs: np.ndarray  # (R,)
  rhs: np.ndarray  # (R, C)


def _targets(labels: np.ndarray, num_classes: int) -> np.ndarray:
  return 2.0 * np.eye(num_classes)[np.asarray(labels, int)] - 1.0


def fit_rows(x: np.ndarray, labels: np.ndarray, num_classes: int) -> Solution:
  """From the training rows (N, D), in float64; either branch by N vs D+1."""
  x = np.asarray(x, np.float64)
  mean, std = x.mean(0), x.std(0) + STD_EPS
  xw = np.concatenate([(x - mean) / std, np.full((len(x), 1), BIAS)], axis=1)
  y = _targets(labels, num_classes)
  if len(xw) >= xw.shape[1]:
    eigs, q = np.linalg.eigh(xw.T @ xw)
    return Solution(mean, std, q, eigs, q.T @ (xw.T @ y))
  eigs, q = np.linalg.eigh(xw @ xw.T)
  return Solution(mean, std, xw.T @ q, eigs, q.T @ y)


def fit_moments(m: Moments, shift: np.ndarray) -> Solution:
  """The N >= D+1 branch from sums (the whitened, bias-augmented X^T X and X^T Y
  follow from them exactly; `shift` keeps their float32 sums free of cancellation)."""
  n = m.count
  mu = m.total / n  # mean of x - shift
  scatter = m.gram - n * np.outer(mu, mu)
  std = np.sqrt(np.maximum(np.diag(scatter) / n, 0.0)) + STD_EPS
  d = len(mu)
  xtx = np.empty((d + 1, d + 1))
  xtx[:d, :d] = scatter / np.outer(std, std)
  xtx[:d, d] = xtx[d, :d] = 0.0  # whitened columns sum to zero
  xtx[d, d] = BIAS ** 2 * n
  ysum = 2.0 * m.class_counts - n  # column sums of 2 onehot - 1
  xty = np.empty((d + 1, len(ysum)))
  # sum_i (x_i - mean) y_ic = 2 * (class total - count * mu) - (total - n * mu), whitened.
  xty[:d] = (2.0 * (m.class_totals - np.outer(m.class_counts, mu)).T) / std[:, None]
  xty[d] = BIAS * ysum
  eigs, q = np.linalg.eigh(xtx)
  return Solution(mu + shift, std, q, eigs, q.T @ xty)


def predict(sol, x: jax.Array, l2s: Sequence[float]) -> jax.Array:
  """(K, n) predicted classes of rows x (n, D) for each of the K l2 values;
  `sol` holds float32 arrays (a `Solution`'s fields, any pytree with them)."""
  xw = (x.astype(jnp.float32) - sol["mean"]) / sol["std"]
  z = jnp.matmul(xw, sol["lhs"][:-1], precision=HIGHEST) + BIAS * sol["lhs"][-1]
  scale = 1.0 / (sol["eigs"][None, :] + jnp.asarray(l2s, jnp.float32)[:, None])  # (K, R)
  scores = jnp.einsum("nr,kr,rc->knc", z, scale, sol["rhs"], precision=HIGHEST)
  return jnp.argmax(scores, axis=-1)



# How one representation becomes probe features (rows x features); tokens are
# ViT/Mixer tokens or a ResNet map's positions (row-major), the first `prefix`
# of them class tokens.
FEATURES = {
    "cls": "the class token",
    "first": "the first spatial token",
    "spatial_mean": "the mean over spatial tokens (class token excluded)",
    "mean": "the mean over all tokens",
    "final_grid": "a map average-pooled to the model's last grid, flattened",
    "each": "every token alone: one probe per token",
}


def features(act: jax.Array, how: str, prefix: int, final_grid: tuple[int, int] | None = None
             ) -> jax.Array:
  """(B, T, F): T = 1 except for `each` (T tokens)."""
  if how == "final_grid":
    b, h, w, c = act.shape
    gh, gw = final_grid
    pooled = act.reshape(b, gh, h // gh, gw, w // gw, c).mean(axis=(2, 4))
    return pooled.reshape(b, 1, -1)
  tokens = act.reshape(act.shape[0], -1, act.shape[-1]) if act.ndim == 4 else act
  if how == "each":
    return tokens
  pick = {"cls": lambda t: t[:, 0], "first": lambda t: t[:, prefix],
          "spatial_mean": lambda t: t[:, prefix:].mean(axis=1), "mean": lambda t: t.mean(axis=1)}
  return pick[how](tokens)[:, None]


def check_features(how: str, shape: Sequence[int], prefix: int,
                   final_grid: tuple[int, int] | None) -> str | None:
  """Why `how` cannot read a representation of `shape` (batch first), or None."""
  if how not in FEATURES:
    return f"{how!r} is not one of {sorted(FEATURES)}"
  if how == "cls" and not prefix:
    return "'cls' needs a class token, and this model has none ('first' or 'mean' instead)"
  if how == "final_grid":
    if len(shape) != 4:
      return "'final_grid' pools (B,H,W,C) maps; this point is tokens"
    if shape[1] % final_grid[0] or shape[2] % final_grid[1]:
      return f"its {shape[1]}x{shape[2]} map does not pool evenly to the last grid {final_grid}"
  return None
