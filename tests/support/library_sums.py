"""The library's sums of small layers, as several measure tests take them: one
minibatch's HSIC matrix, and sums over padded minibatches of unequal sizes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import scales


def hsic_matrix(acts, mask=None) -> np.ndarray:
  """The library's HSIC matrix of one minibatch (`hsic.activation_sums`), float64
  at the features' own scale."""
  got = jax.jit(hsic.activation_sums)([jnp.asarray(a) for a in acts],
                                     None if mask is None else jnp.asarray(mask))  # one program, not op by op
  return scales.unscale(jax.device_get(got), measures.SCALES)["hsic"]


def related_layers(seed=0, n=44, d=(24, 12)):
  """Two related layers (a noisy projection of the first), and an offset one."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n, d[0]))
  y = x[:, :d[1]] @ rng.standard_normal((d[1], d[1])) + 0.7 * rng.standard_normal((n, d[1]))
  return [x, y, 1.0 + 0.8 * x[:, ::2]]


def batch_slices(total: int, sizes: list[int]):
  """The rows of consecutive minibatches of `sizes` rows, `total` in all."""
  starts = np.cumsum([0, *sizes])
  assert starts[-1] == total
  return [slice(a, b) for a, b in zip(starts[:-1], starts[1:])]


def padded_sums(acts, sizes, spec, pad: int = 16, key=None):
  """Sums over minibatches of `sizes` rows, each padded to `pad` rows and masked."""
  fn = jax.jit(functools.partial(measures.minibatch_sums, spec=spec))
  total = {}
  for i, rows in enumerate(batch_slices(len(acts[0]), sizes)):
    n = rows.stop - rows.start
    padded = [np.concatenate([a[rows], np.full((pad - n, a.shape[1]), 5.0)]).astype(np.float32) for a in acts]
    mask = np.r_[np.ones(n), np.zeros(pad - n)].astype(np.float32)
    got = jax.device_get(fn(padded, mask, key=jax.random.PRNGKey(i) if key is None else key))
    got = scales.unscale(got, measures.SCALES)
    total = {k: total.get(k, 0.0) + np.asarray(v, np.float64) for k, v in got.items()}
  return total


SIZES = [16, 16, 12]  # the measure tests' minibatches: the last one shorter


def values_of_one(acts, spec) -> dict[str, np.ndarray]:
  """Every measure of `spec` from the library on one unpadded minibatch of `acts`."""
  n = len(acts[0])
  got = scales.unscale(jax.device_get(jax.jit(functools.partial(measures.minibatch_sums, spec=spec))(
      [a.astype(np.float32) for a in acts], np.ones(n, np.float32))), measures.SCALES)
  return measures.values(got, [str(i) for i in range(len(acts))], spec, n)
