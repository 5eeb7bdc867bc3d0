"""Linear CKA from summed HSIC: the notebook's accumulator over minibatches
(`MinibatchCKA`), the normalisation with its checks of each layer
(`cka_from_hsic`), and CKA of two whole arrays (`linear_cka`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import layer_checks
from vitcnn_jax.similarity import MIN_BATCH
from vitcnn_jax.similarity import scales

def _double_centred(gram: jax.Array) -> jax.Array:
  """H K H with H = I - 11^T / n (every row valid: no mask, unlike `kernels.center_biased`)."""
  means = gram.mean(axis=0)
  means = means - means.mean() / 2
  return gram - means[:, None] - means[None, :]


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.vdot(a.ravel(), b.ravel(), precision=grams.HIGHEST)


def linear_cka(x, y, *, debiased: bool = False) -> float:
  """Full-batch linear CKA between two representations of the same examples."""
  x, y = np.asarray(x), np.asarray(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError(f"linear_cka: x has {x.shape[0]} examples, y has {y.shape[0]}.")
  need = MIN_BATCH if debiased else 2
  if x.shape[0] < need:
    raise ValueError(f"linear_cka{' (debiased)' if debiased else ''} needs at least {need} "
                     f"examples, got {x.shape[0]}.")
  for name, a in (("x", x), ("y", y)):
    if not np.isfinite(a).all():
      raise ValueError(f"linear_cka: {name} holds {a.size - np.isfinite(a).sum()} NaN or inf values.")
  kk, ll, kl, m4 = map(np.asarray, _full_batch_dots(x.astype(np.float32), y.astype(np.float32), debiased))
  for name, v, moment in (("x", kk, m4[0]), ("y", ll, m4[1])):
    # Unnormalised dots: n^2 times the floor for a normalised self-HSIC.
    if v <= layer_checks.noise_floor(x.shape[0] ** 2 * float(moment)):
      raise FloatingPointError(f"linear_cka: {name} is constant over the examples, so its CKA "
                               "with anything is meaningless.")
  return float(kl) / float(np.sqrt(float(kk) * float(ll)))


@functools.partial(jax.jit, static_argnames="debiased")
def _full_batch_dots(x: jax.Array, y: jax.Array, debiased: bool) -> tuple[jax.Array, ...]:
  """<K, K>, <L, L>, <K, L> of the two centred Grams and each mean's fourth
  moment, in one program (run op by op, a first call compiled each operation
  as a program of its own). Each array is scaled by a power of two first: CKA is
  scale-free, and float32 stays in range, exactly."""
  e = grams.log2_scales([x, y])
  center = grams.center_unbiased if debiased else _double_centred
  centred, moments = [], []
  for i, a in enumerate((x, y)):
    gram, mean = grams.gram_and_mean(a * grams.pow2(-e[i]), None)
    centred.append(center(gram))
    moments.append(grams.fourth_moment(mean))
  k, l = centred
  return _dot(k, k), _dot(l, l), _dot(k, l), jnp.stack(moments)


@dataclasses.dataclass
class CKAResult:
  """CKA between every pair of layers; `xy` rows are model x, columns model y."""
  names_x: list[str]
  names_y: list[str]
  xx: np.ndarray
  yy: np.ndarray | None
  xy: np.ndarray | None


def cka_from_hsic(hsic: np.ndarray, names: Sequence[str],
                  mean_m4: np.ndarray | None = None) -> np.ndarray:
  """Normalise an accumulated HSIC matrix. A self-HSIC that is not finite, not
  positive, or (given each layer's mean `fourth_moment`) at float32's rounding
  level is an error naming the layer and the likely cause."""
  hsic = np.asarray(hsic, np.float64)
  diag = np.diag(hsic)
  if not np.any(hsic) and (mean_m4 is None or not np.any(mean_m4)):
    raise FloatingPointError("CKA: every HSIC is zero: no minibatch of at least "
                             f"{MIN_BATCH} examples was processed (or every activation is zero).")
  layer_checks.check_layers(diag, mean_m4, names)
  return hsic / np.sqrt(np.outer(diag, diag))


class MinibatchCKA:
  """Accumulates HSIC1 over minibatches for all layer pairs, within and across models.

  State is one (L, L) float64 matrix over the layers of x followed by those of
  y (plus a batch count), independent of the number of examples.
  """

  def __init__(self, names_x: Sequence[str], names_y: Sequence[str] | None = None):
    self.names_x = list(names_x)
    self.names_y = list(names_y) if names_y is not None else None
    size = len(self.names) if self.names_y is None else len(self.names_x) + len(self.names_y)
    self.hsic = np.zeros((size, size), np.float64)
    self.moments = np.zeros((size,), np.float64)  # summed n * fourth_moment(mean)
    self.examples = 0
    self._update = jax.jit(hsic.activation_sums)

  @property
  def names(self) -> list[str]:
    return self.names_x + (self.names_y or [])

  def _ordered(self, acts: Mapping[str, jax.Array], names: Sequence[str], which: str) -> list:
    missing = [n for n in names if n not in acts]
    if missing:
      raise KeyError(f"MinibatchCKA.update: {which} lacks layer(s) {missing}; got {sorted(acts)}.")
    return [acts[n] for n in names]

  def update(self, acts_x: Mapping[str, jax.Array],
             acts_y: Mapping[str, jax.Array] | None = None) -> None:
    acts = self._ordered(acts_x, self.names_x, "acts_x")
    if self.names_y is not None:
      if acts_y is None:
        raise ValueError("MinibatchCKA across two models: update(acts_x, acts_y) needs acts_y.")
      acts += self._ordered(acts_y, self.names_y, "acts_y")
    sizes = {a.shape[0] for a in acts}
    if len(sizes) != 1:
      raise ValueError(f"MinibatchCKA.update: layers disagree on the batch size: {sorted(sizes)}.")
    n = sizes.pop()
    if n < MIN_BATCH:
      raise ValueError(f"MinibatchCKA.update: batch of {n} examples; the unbiased HSIC "
                       f"needs at least {MIN_BATCH}.")
    got = scales.unscale(jax.device_get(self._update(acts)), hsic.SCALES)
    self.hsic += got["hsic"]
    self.moments += got["moments"]
    self.examples += n

  def result(self) -> CKAResult:
    if not self.examples:
      raise ValueError("MinibatchCKA.result() before any update().")
    cka = cka_from_hsic(self.hsic, self.names, self.moments / self.examples)
    lx = len(self.names_x)
    if self.names_y is None:
      return CKAResult(self.names_x, [], cka, None, None)
    return CKAResult(self.names_x, self.names_y, cka[:lx, :lx], cka[lx:, lx:], cka[:lx, lx:])
