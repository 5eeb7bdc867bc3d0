"""A layer's Gram over one minibatch, at a power-of-two scale, and the precision
of the products that make it.

Every similarity measure reads a layer through its Gram (`Layer`): the Gram of
the rows centred on their mean, the mean, and two per-row vectors from which the
uncentred Gram and the Gram of rows centred on their own mean follow. Each
layer is scaled by a power of two (exact in float32) so that its Gram, and the
HSIC products and fourth moments made from it, stay in float32's range whatever
the features' scale; `scales.unscale` restores the sums on the host.

A pass's captured points make their Gram parts from the features as they are
(`Parts`), and one batched piece of code over the stacked layers finds their
scales (`finish`). A layer out of float32's range that way (features of 1e20)
says so by its exponent (`UNFIT`), and its minibatch is run again with every
layer scaled by its largest |x| first: the same bits where both are in range.

The products run at `config.gram_precision`: float32-accurate choices only
(`GRAM_PRECISIONS`); "auto" is XLA's HIGHEST on CPU and TPU and 6-pass bf16 on
a GPU (the default matmul precision there loses digits in centred Grams).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

HIGHEST = jax.lax.Precision.HIGHEST
Precision = jax.lax.Precision | jax.lax.DotAlgorithmPreset

# Gram and HSIC products (`config.gram_precision`): float32-accurate choices only.
# "highest" is full float32 on CPU and GPU (no tensor cores) and 6-pass bf16 on TPU;
# the others split each float32 into bf16 or tf32 pieces and run the tensor cores
# 3, 6 or 9 times (XLA's dot algorithms), where the backend has them.
GRAM_PRECISIONS = {
    "highest": HIGHEST,
    "bf16_3x": jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X3,
    "bf16_6x": jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X6,
    "bf16_9x": jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X9,
    "tf32_3x": jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
}
AUTO_PRECISION = {"gpu": "bf16_6x"}  # other backends: "highest"


def gram_precision(name: str = "auto", backend: str | None = None) -> Precision:
  """The dot precision named `name` ("auto": the backend's fast float32-accurate one)."""
  if name == "auto":
    name = AUTO_PRECISION.get(backend or jax.default_backend(), "highest")
  if name not in GRAM_PRECISIONS:
    raise ValueError(f"gram precision {name!r} is not one of {['auto', *GRAM_PRECISIONS]}.")
  return GRAM_PRECISIONS[name]


def gram_and_mean(x: jax.Array, mask: jax.Array | None, precision: Precision = HIGHEST
                  ) -> tuple[jax.Array, jax.Array]:
  """(Gram of the rows centred on their mean over the valid rows, padding rows
  zeroed; that mean)."""
  gram, mean, _, _ = _gram_parts(x, mask, precision)
  return gram, mean


# A slice of every row's features that stays in (a last-level) cache. At a minibatch of
# 1,000 a slice of 1 MiB is 262 features, too few to pay for reading and writing the
# (n, n) sum each slice adds to: on a 2-core Xeon, Grams of 2,048 to 16,384 features
# took 19 to 29% longer than in slices of 4 MiB, and at 32 or 256 rows no less.
CACHE_SLICE_BYTES = 2 ** 22
SLICED_BACKENDS = ("cpu",)  # where a layer's Gram is made by such slices (`_gram_parts`)


def _gram_parts(x: jax.Array, mask: jax.Array | None, precision: Precision = HIGHEST,
                scale: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """`gram_and_mean` and, per row, its centred features' projection on the mean
  and the mean over its features: with them the uncentred Gram and the Gram of
  rows centred on their own mean follow from the centred one (`Layer`). With
  `scale` (a power of two), those of `x * scale`, with no scaled copy of `x`.

  On CPU, the layer's mean is one product over it, and its centred Gram is
  summed a slice of features at a time, each slice centred in cache. A centred
  copy of a large layer and XLA:CPU's packing for a (n, D) x (D, n) dot cost 3x
  the time there (ResNet stage-1 layers, n=32: 176 -> 60 ms). Elsewhere one dot
  over the centred copy keeps the matmul units busy."""
  m = jnp.ones((x.shape[0],), jnp.float32) if mask is None else mask.astype(jnp.float32)
  scale = jnp.ones((), jnp.float32) if scale is None else scale
  valid = jnp.maximum(m.sum(), 1.0)
  features = int(np.prod(x.shape[1:]))
  x = jnp.reshape(x, (x.shape[0], features)).astype(jnp.float32)
  sliced = jax.default_backend() in SLICED_BACKENDS
  if sliced:  # one copy of the layer, as the forward made it, for both readers (`_sliced_parts`)
    x = jax.lax.optimization_barrier(x)
  mean = _mean(x, m, valid, scale)
  if sliced:
    gram, proj, rowsum = _sliced_parts(x, mean, m, precision, scale)
  else:
    c = (x * scale - mean) * m[:, None] if mask is not None else x * scale - mean
    gram, proj, rowsum = jnp.matmul(c, c.T, precision=precision), jnp.matmul(c, mean, precision=HIGHEST), c.sum(1)
  rowmean = (rowsum / features + mean.mean()) * m
  return gram, mean, proj, rowmean


def _mean(x: jax.Array, m: jax.Array, valid: jax.Array, scale: jax.Array) -> jax.Array:
  """The mean of the valid rows of `x * scale` as a (1, n) x (n, D) product:
  XLA's CPU column reduction is ~40x slower."""
  return jnp.matmul((m * scale)[None, :], x, precision=HIGHEST)[0] / valid


def slice_width(columns: int, rows: int) -> int:
  """Columns of a (rows, columns) operand a slice of `CACHE_SLICE_BYTES` takes;
  where some divisor of `columns` needs at most twice as many slices, that
  divisor: no tail slice, whose second copy of the slice code was 6% of workload
  W's compiled program."""
  most = min(columns, max(1, CACHE_SLICE_BYTES // (4 * rows)))
  least = -(-columns // most)
  return next((columns // k for k in range(least, 2 * least + 1) if columns % k == 0), most)


# A Gram of at least this many rows, over more than one slice, is summed as the
# triangle of its two row halves' blocks (three dots of a quarter each, 3/4 of the
# work; the upper right block the lower left's transpose). On a 2-core Xeon, 1,000
# rows of 4,096 features in four slices: 37 -> 31 ms; of 16,384: 144 -> 118 ms.
# In one slice, assembling the blocks cost more than they saved (512 features: 3.9
# -> 4.7 ms), and at 256 or 512 rows they gained nothing.
TRIANGLE_ROWS = 768


def _sliced_parts(x: jax.Array, mean: jax.Array, m: jax.Array, precision: Precision,
                  scale: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(Gram, projection on the mean, feature sum) of the rows of `x * scale`, (n,
  D), centred on their `mean` over the rows `m` marks, accumulated over slices
  of `CACHE_SLICE_BYTES`. Where each slice's mean was made from the slice
  inside the loop, the loop's small products and the mean's piecewise update
  took 12% (a BiT stage-1 layer) to 28% (a ViT-B/16 layer) of the whole, at
  W's minibatch. `x` comes through a barrier (`_gram_parts`): a second reader
  of the layer without one (an earlier version's mean) made XLA compute the
  activation again for it (workload W's step: 6% longer)."""
  rows, features = x.shape
  width = slice_width(features, rows)
  cut = rows // 2 if rows >= TRIANGLE_ROWS and width < features else rows
  top, low = slice(0, cut), slice(cut, rows)
  pairs = ((top, top),) if cut == rows else ((top, top), (low, top), (low, low))  # (row, column) blocks
  blocks = lambda c: tuple(jnp.matmul(c[i], c[j].T, precision=precision) for i, j in pairs)

  def add(sums, start, size):
    part = jax.lax.dynamic_slice_in_dim(x, start, size, 1)
    mu = jax.lax.dynamic_slice_in_dim(mean, start, size, 0)
    c = (part * scale - mu) * m[:, None]
    gram, proj, rowsum = sums
    return (tuple(g + b for g, b in zip(gram, blocks(c))), proj + jnp.matmul(c, mu, precision=HIGHEST),
            rowsum + c.sum(1))

  zeros = lambda *shape: jnp.zeros_like(m, shape=shape)  # varying as the rows are, in shard_map
  start = tuple(zeros(i.stop - i.start, j.stop - j.start) for i, j in pairs)
  gram, proj, rowsum = _over_slices(add, features, width, (start, zeros(rows), zeros(rows)))
  if len(gram) == 3:
    first, lower, last = gram
    gram = (jnp.block([[first, lower.T], [lower, last]]),)
  return gram[0], proj, rowsum


def _over_slices(add: Callable[[Any, int, int], Any], columns: int, width: int, sums: Any) -> Any:
  """`sums` after `add(sums, start, size)` of every slice of `width` of `columns`:
  one loop over the whole slices (straight code where there is one: no loop for
  XLA to compile), then the tail slice, if any."""
  slices, tail = divmod(columns, width)
  if slices > 1:
    sums = jax.lax.fori_loop(0, slices, lambda i, sums: add(sums, i * width, width), sums)
  else:
    sums = add(sums, 0, width)
  return add(sums, slices * width, tail) if tail else sums


# Flattened (n, n) Grams whose two operands together pass this many cache slices
# are multiplied a slice of their columns at a time (`flat_products`). A layer's
# Gram times itself, on a 2-core Xeon: 36 layers of 1,000 rows took 88 ms as one
# dot, 42 ms in slices of `CACHE_SLICE_BYTES`; 10 of 1,024 rows (80 MiB together)
# 32 -> 12 ms; 55 of 512, 58 -> 31 ms. At 256 rows slices gained nothing, and at
# 110 layers (55 MiB together, one dot here) they were 20% slower.
SLICED_PRODUCT_SLICES = 16


def flat_products(a: jax.Array, b: jax.Array, precision: Precision = HIGHEST) -> jax.Array:
  """a @ b.T for (L, K) and (M, K) operands with a long K (flattened Grams, n^2
  columns): on CPU, once both exceed `SLICED_PRODUCT_SLICES` cache slices, summed
  over slices of their columns that stay in cache."""
  rows, columns = a.shape[0] + b.shape[0], a.shape[1]
  if (jax.default_backend() not in SLICED_BACKENDS
      or 4 * rows * columns <= SLICED_PRODUCT_SLICES * CACHE_SLICE_BYTES):
    return jnp.matmul(a, b.T, precision=precision)

  def add(total, start, size):
    part = lambda v: jax.lax.dynamic_slice_in_dim(v, start, size, 1)
    return total + jnp.matmul(part(a), part(b).T, precision=precision)

  return _over_slices(add, columns, slice_width(columns, rows),
                      jnp.zeros_like(a, shape=(a.shape[0], b.shape[0])))


def center_unbiased(gram: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """U-centred Gram; `mask` marks valid rows (padding rows come out zero)."""
  n_all = gram.shape[0]
  keep = jnp.ones((n_all,), gram.dtype) if mask is None else mask.astype(gram.dtype)
  n = keep.sum()
  off_diag = (1 - jnp.eye(n_all, dtype=gram.dtype)) * keep[:, None] * keep[None, :]
  g = gram * off_diag
  means = g.sum(axis=0) / (n - 2)
  means = means - means.sum() / (2 * (n - 1))
  return (g - means[:, None] - means[None, :]) * off_diag


def fourth_moment(mean: jax.Array) -> jax.Array:
  """sum_d mean_d^4: the scale a self-HSIC is judged against (`layer_checks`).
  For a constant layer it equals each example's sum_d x_d^4, whose rounding noise
  the floor bounds; any real spread only raises the self-HSIC above it."""
  return jnp.sum(jnp.square(jnp.square(mean)))


def log2_scales(acts: Sequence[jax.Array], mask: jax.Array | None = None) -> jax.Array:
  """(L,) int32 exponents e with each layer's max |x| * 2^-e in [0.5, 1) over the
  valid rows; 0 for an all-zero layer; read from the float32 bits (jnp.frexp and
  ldexp compile to long subnormal-safe code)."""
  peaks = []
  for a in acts:
    x = jnp.abs(jnp.reshape(a, (a.shape[0], -1)).astype(jnp.float32)).max(axis=1)
    peaks.append(x.max() if mask is None else jnp.where(mask > 0, x, 0.0).max())
  peak = jnp.stack(peaks)
  biased = (jax.lax.bitcast_convert_type(peak, jnp.int32) >> 23) & 0xFF
  return jnp.where(peak > 0, jnp.clip(biased - 126, -125, 126), 0).astype(jnp.int32)


def pow2(e: jax.Array) -> jax.Array:
  """2.0 ** e in float32, exactly, for integer e in [-126, 127]."""
  return jax.lax.bitcast_convert_type((e.astype(jnp.int32) + 127) << 23, jnp.float32)


# A Gram whose largest diagonal entry lies in this range was made without overflow
# or significant underflow (entries are bounded by the diagonal), so scaling it
# by a power of two afterwards is exact and equals scaling the features first.
GRAM_RANGE = (2.0 ** -60, 2.0 ** 60)
MEAN_BITS = 20  # the mean's largest |entry| below 2^MEAN_BITS at the Gram's scale: its 4th power sums in float32
# The exponent of a layer whose Gram, made from its features as they are, left
# `GRAM_RANGE` (e.g. features of 1e20, or the mean beyond `MEAN_BITS`): its
# minibatch is run again with every layer scaled first (`Parts`, `needs_prescaling`).
UNFIT = 2 ** 20


def _exponent(v: jax.Array) -> jax.Array:
  """floor(log2 v) + 1 for a positive normal float32 v (v * 2^-result in [0.5, 1))."""
  return ((jax.lax.bitcast_convert_type(v, jnp.int32) >> 23) & 0xFF) - 126


def _times_pow2(v: jax.Array, e: jax.Array) -> jax.Array:
  """v * 2^e for any integer e, in two exact steps where v * 2^e is a normal float32."""
  half = e // 2
  return v * pow2(jnp.clip(half, -126, 127)) * pow2(jnp.clip(e - half, -126, 127))


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["gram", "mean_sq", "mean_4th", "proj", "rowmean", "e"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class Layer:
  """One layer's minibatch at a power-of-two scale 2^-e (`Parts.layer`): the Gram
  of its centred rows, the two sums of its mean that readers take (not the (D,)
  mean itself: no (D,) vector is carried, stacked, sliced and summed per layer),
  each centred row's projection on the mean, each row's mean over its
  features (padding rows zero)."""
  gram: jax.Array  # (n, n) K_c 2^-2e
  mean_sq: jax.Array  # () the mean's squared norm, 2^-2e
  mean_4th: jax.Array  # () the sum of the mean's fourth powers (`fourth_moment`), 2^-4e
  proj: jax.Array  # (n,) 2^-2e
  rowmean: jax.Array  # (n,) 2^-e
  e: jax.Array


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["gram", "proj", "rowmean", "mean_sq", "mean_4th", "k", "f", "features"],
                   meta_fields=["prescaled"])
@dataclasses.dataclass(frozen=True)
class Parts:
  """One layer's Gram parts as its features were read (times 2^-f), before the
  exponent that brings the Gram below 1 (`finish`): what each captured point's
  code makes, the exponent and range check left to one batched piece of code
  over the stacked layers (`registry.Stack.of`). Per point, those checks and
  their loop took a third of workload W's compile (10.6 -> 7.1 s, 2,315 -> 1,737
  fusions). The mean's sums are at the mean's own scale
  2^-k, so that they are finite whatever the Gram's. A pytree whose `prescaled`
  alone is static: a scan over identical blocks stacks the arrays, and the
  points of a pass, whatever their widths, stack into one (`registry.Stack.of`)."""
  gram: jax.Array  # (n, n) K_c 2^-2f
  proj: jax.Array  # (n,) 2^-2f
  rowmean: jax.Array  # (n,) 2^-f
  mean_sq: jax.Array  # () 2^-2k
  mean_4th: jax.Array  # () 2^-4k
  k: jax.Array  # () the mean's exponent: its largest |entry| times 2^-k in [0.5, 1); 0 for a zero mean
  f: jax.Array  # () the features' scale: 0, or their largest |x|'s exponent (`prescaled`)
  features: jax.Array  # () int32: how many features the layer has
  prescaled: bool

  def layer(self) -> Layer:
    """The `Layer` of one layer's parts (`finish`)."""
    return Layer(*finish(self))


# Its own jit: inside a pass's trace, the layers of one shape are traced and
# lowered once, not once per captured point (workload W: 79 points, 0.37 s less
# of its 5.6 s compile); XLA still places the code at each point.
@functools.partial(jax.jit, static_argnames=("precision", "prescale"))
def layer_parts(a: jax.Array, mask: jax.Array | None = None, precision: Precision = HIGHEST,
                prescale: bool = False) -> Parts:
  """The `Parts` of one layer: made from its features as they are, or with
  `prescale` from them scaled by their largest |x| first (which reads a large
  layer once more, but fits float32 whatever their scale)."""
  f = log2_scales([a], mask)[0] if prescale else jnp.zeros((), jnp.int32)
  gram, mean, proj, rowmean = _gram_parts(a, mask, precision, pow2(-f) if prescale else None)
  peak = jnp.max(jnp.abs(mean))
  k = jnp.where(peak > 0, jnp.clip(_exponent(peak), -125, 126), 0)
  unit = mean * pow2(-k)
  return Parts(gram, proj, rowmean, jnp.sum(jnp.square(unit)), fourth_moment(unit), f + k, f,
               jnp.asarray(np.prod(a.shape[1:]), jnp.int32), prescale)


def finish(parts: Parts) -> tuple[jax.Array, ...]:
  """(gram, mean_sq, mean_4th, proj, rowmean, e) of `Layer` from `parts`, any
  leading axes (stacked layers): e brings the Gram's largest diagonal entry
  below 1 where that entry and the mean are in range (`GRAM_RANGE`,
  `MEAN_BITS`). A Gram of exact zeros (every valid row the same) takes the
  mean's exponent. Out of range, parts made as the features were get e =
  `UNFIT`; prescaled ones keep their scale. Every step a power of two: the same
  bits either way."""
  gram, f, k = parts.gram, parts.f, parts.k
  top = jnp.max(jnp.diagonal(gram, axis1=-2, axis2=-1), axis=-1)
  e = f + (_exponent(top) + 1) // 2
  fits = (top >= GRAM_RANGE[0]) & (top <= GRAM_RANGE[1]) & (k - e <= MEAN_BITS)
  flat = top == 0
  e = jnp.where(fits, e, jnp.where(flat, k, f))
  shift = e - f
  out = (_times_pow2(gram, -2 * shift[..., None, None]), _times_pow2(parts.mean_sq, 2 * (k - e)),
         _times_pow2(parts.mean_4th, 4 * (k - e)), _times_pow2(parts.proj, -2 * shift[..., None]),
         _times_pow2(parts.rowmean, -shift[..., None]))
  if not parts.prescaled:
    e = jnp.where(fits | flat, e, UNFIT)
  return *out, e


def needs_prescaling(e: np.ndarray) -> bool:
  """Whether exponents fetched from a step (its `log2_scale`) say that a layer
  left float32's range as its features were (`UNFIT`): run the minibatch again
  with its layers prescaled."""
  return bool(np.any(np.asarray(e) >= UNFIT))


def scaled_layer(a: jax.Array, mask: jax.Array | None = None, precision: Precision = HIGHEST
                 ) -> Layer:
  """One layer's `Layer`, e an int32 exponent with the largest diagonal entry of
  the centred Gram below 1, so that HSIC products and fourth moments stay in
  float32's range whatever the features' scale: its features scaled by their
  largest |x| first (straight code, in range whatever their scale; a pass over
  many layers makes them as they are and checks them together instead)."""
  return layer_parts(a, mask, precision, prescale=True).layer()


def scaled_gram(a: jax.Array, mask: jax.Array | None = None, precision: Precision = HIGHEST
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(K 2^-2e, the mean's squared norm 2^-2e, e) of `scaled_layer`."""
  layer = scaled_layer(a, mask, precision)
  return layer.gram, layer.mean_sq, layer.e

