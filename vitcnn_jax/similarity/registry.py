"""What a similarity measure declares, and the minibatch every measure reads.

A measure family is one `Family`: the measures the step computes together (each
a `Measure`: its name, label, estimator text, parameters, value from the summed
sums, and whether it is a distance or has a null), the sums they take of each
`Minibatch`, and the checks of their parameters. `measures.FAMILIES` registers
them; everything keyed by a measure's name (the config's check, the step,
`measures.values`, the json, the figures' scales) reads them from there, so a
new measure is an entry in its family's module, or a new module, and one line
there.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import layerpairs
from vitcnn_jax.similarity.scales import Scale


@dataclasses.dataclass(frozen=True)
class Spec:
  """Which measures, and their parameters (`config` fields of the same names)."""
  names: tuple[str, ...] = ("linear_cka",)
  estimator: str = "unbiased"  # of linear_cka, rbf_cka and distance_correlation
  rbf_sigma: float = 1.0
  knn_k: int = 10
  rsa_method: str = "pearson"
  null: bool = False
  cca_dims: int = 1  # principal components of each layer the CCA family and regression read
  subspace_dims: int = 0  # the most that procrustes and shape_metric read (0: all)
  shape_alpha: float = 1.0  # the shape metric's partial whitening (1: Procrustes)
  gulp_lambda: float = 0.01  # GULP's ridge penalty, on layers scaled to trace 1
  svcca_variance: float = 0.99  # the share of each layer's variance SVCCA keeps
  uniformity_t: float = 2.0  # the uniformity's temperature


class Stack(NamedTuple):
  """The layers of one minibatch (`grams.Layer`s, each at its own scale) stacked:
  what every measure reads, as (L, ...) arrays."""
  gram: jax.Array  # (L, n, n) Grams of the centred rows
  proj: jax.Array  # (L, n) each centred row's projection on the mean
  rowmean: jax.Array  # (L, n) each row's mean over its features
  mean_sq: jax.Array  # (L,) the squared norm of the mean
  mean_4th: jax.Array  # (L,) the sum of the mean's fourth powers (`grams.fourth_moment`)
  features: jax.Array  # (L,)
  e: jax.Array  # (L,) int32: each layer's arrays are at the scale 2^-e

  @classmethod
  def of(cls, parts: grams.Parts) -> "Stack":
    """The layers of `parts`, stacked on their leading axis (each made where its
    point is), brought to their scales together (`grams.finish`): one batched
    piece of code, not one per layer."""
    gram, mean_sq, mean_4th, proj, rowmean, e = grams.finish(parts)
    return cls(gram, proj, rowmean, mean_sq, mean_4th, parts.features.astype(jnp.float32), e)

  @classmethod
  def of_activations(cls, acts: Sequence[jax.Array], mask: jax.Array | None,
                     precision: grams.Precision = grams.HIGHEST, prescale: bool = True) -> "Stack":
    """The layers of activations held whole (`grams.layer_parts` of each, then `of`)."""
    parts = [grams.layer_parts(a, mask, precision, prescale) for a in acts]
    return cls.of(jax.tree.map(lambda *a: jnp.stack(a), *parts))

  @classmethod
  def join(cls, stacks: Sequence["Stack"]) -> "Stack":
    """The layers of `stacks` in one, in order (e.g. one model's after another's)."""
    return cls(*(jnp.concatenate(parts) for parts in zip(*stacks)))

  def reindexed(self, order: jax.Array) -> "Stack":
    """Every layer with its examples re-indexed by `order` (row i becomes row
    order[i]): the same representations of the examples in another order."""
    return self._replace(gram=layerpairs.permuted(self.gram, order), proj=self.proj[:, order],
                         rowmean=self.rowmean[:, order])

  def raw(self, mask: jax.Array) -> jax.Array:
    """(L, n, n) Grams of the rows as they are (uncentred), padding rows and
    columns zero (the centred Gram's are; the mean's term is not)."""
    m = mask.astype(jnp.float32)
    return (self.gram + self.proj[:, :, None] + self.proj[:, None, :]
            + self.mean_sq[:, None, None]) * (m[:, None] * m[None, :])


@dataclasses.dataclass
class Minibatch:
  """One minibatch as a family's `sums` reads it. `shared` computes what several
  families read (the cosines, the neighbour lists) once, for whichever asks first."""
  stack: Stack
  mask: jax.Array
  spec: Spec
  order: jax.Array | None  # the null's re-indexing of the examples (None: no null)
  precision: grams.Precision
  _once: dict = dataclasses.field(default_factory=dict, repr=False)

  def shared(self, fn: Callable[["Minibatch"], Any]) -> Any:
    """fn(self), computed on the first call and reused after."""
    if fn not in self._once:
      self._once[fn] = fn(self)
    return self._once[fn]


def normalise_rows(k: jax.Array, mask: jax.Array) -> jax.Array:
  """K_ij / sqrt(K_ii K_jj): a Gram of rows to that of the l2-normalised rows
  (a zero row stays zero), padding zero."""
  d = jnp.diagonal(k)
  inv = jnp.where(d > 0, jax.lax.rsqrt(jnp.where(d > 0, d, 1.0)), 0.0) * mask
  return k * inv[:, None] * inv[None, :]


def cosines(mb: Minibatch) -> jax.Array:
  """(L, n, n) cosine similarities of the examples' features (l2-normalised Grams);
  read through `mb.shared`."""
  return jax.vmap(normalise_rows, (0, None))(mb.stack.raw(mb.mask), mb.mask)


@dataclasses.dataclass(frozen=True)
class Totals:
  """One repeat's float64 sums (summed over minibatches, at the layers' own
  scale) as a measure's `value` reads them: `of` its own sums, or its null's."""
  sums: dict[str, np.ndarray]
  null: bool
  spec: Spec
  names: Sequence[str]  # the layers
  num_examples: int

  def of(self, key: str) -> np.ndarray:
    return self.sums[("null/" if self.null else "") + key]

  def mean(self, key: str, count: str) -> np.ndarray:
    """The sum `key` over the count `count` (at least 1)."""
    return self.of(key) / np.maximum(self.sums[count], 1.0)

  def normalised(self, key: str, measure: str) -> np.ndarray:
    """hs / sqrt(own_aa own_bb) of the sum `key` by the layers' own self-terms
    (the null's too), naming a layer whose own term is not positive."""
    diag = np.diag(self.sums[key])
    bad = [n for n, v in zip(self.names, diag) if not v > 0]
    if bad:
      raise FloatingPointError(f"{measure}: the self-similarity of layers {bad[:5]} is not positive: "
                               "constant over the examples, or (cknna) without mutual neighbours.")
    return self.of(key) / np.sqrt(np.outer(diag, diag))


class Clip(NamedTuple):
  """A measure that clips a negative estimate to 0: what it counts (the json's
  "clipped"), and how many cells (or layers) it clipped in one repeat."""
  what: str
  count: Callable[[Totals], int]


@dataclasses.dataclass(frozen=True)
class Measure:
  """One similarity measure: all that the json, the figures and `values` know of it."""
  name: str  # in config.measures, the arrays and the json
  label: str  # in the figures and the key numbers
  estimator: str  # how its minibatches combine (the json's "estimator", before `params`)
  params: Callable[[Spec], str]  # its parameters, as the json names them
  value: Callable[[Totals], np.ndarray]  # its (L, L) matrix
  distance: bool = False  # 0 for equal layers, larger apart: its own colour scale, reversed
  null: bool = True  # False: the examples' order does not enter (one statistic per layer)
  clip: Clip | None = None


def _no_check(spec: Spec, smallest: int, chosen: tuple[str, ...]) -> None:
  del spec, smallest, chosen


@dataclasses.dataclass(frozen=True)
class Family:
  """Measures the step computes together, from what they share.

  `sums(mb, chosen)`: one minibatch's sums (arrays, summed over minibatches and
  devices) of the `chosen` of its measures, and with `mb.order` their nulls'
  (keys "null/..."). `check(spec, smallest, chosen)` raises a ValueError for
  a parameter out of its range (chosen or not: a mistake in the config is one)
  and for what a chosen measure needs of the smallest minibatch. `scales`: the
  sums that carry the layers' power-of-two scales, by key (see `scales`)."""
  measures: tuple[Measure, ...]
  sums: Callable[[Minibatch, tuple[str, ...]], dict[str, jax.Array]]
  check: Callable[[Spec, int, tuple[str, ...]], None] = _no_check
  scales: Mapping[str, Scale] = dataclasses.field(default_factory=dict)

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(m.name for m in self.measures)
