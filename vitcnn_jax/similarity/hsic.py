"""Linear CKA: Gram matrices, centring, HSIC, and the minibatch estimator.

Minibatch CKA (Nguyen et al. 2021; Raghu et al. 2021) sums the unbiased HSIC
estimator of Song et al. (2012) over minibatches,

  CKA(X, Y) = sum_i HSIC1(K_i, L_i) / sqrt(sum_i HSIC1(K_i, K_i) * sum_i HSIC1(L_i, L_i)),

with HSIC1(K, L) = <U(K), U(L)> / (n (n - 3)) and U the unbiased (Szekely-Rizzo)
centring. Vectorised centred Grams of all layers are stacked and multiplied
once per batch, so every layer pair costs one entry of one matmul. Minibatches
of different sizes are weighted correctly because each term carries its own
1 / (n (n - 3)).

Numerics: float32 with precision=HIGHEST for every Gram and HSIC product
(the default TPU/GPU matmul precision loses digits in the centred Grams).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import layerpairs
from vitcnn_jax.similarity import MIN_BATCH  # n (n - 3) and (n - 1)(n - 2) must be positive

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


def _gram_and_mean(x: jax.Array, mask: jax.Array | None, precision: Precision = HIGHEST
                   ) -> tuple[jax.Array, jax.Array]:
  """(Gram of the rows centred on their mean over the valid rows, padding rows
  zeroed; that mean)."""
  gram, mean, _, _ = _gram_parts(x, mask, precision)
  return gram, mean


CACHE_SLICE_BYTES = 2 ** 20  # a slice of every row's features that stays in cache
SLICED_BACKENDS = ("cpu",)  # where a layer's Gram is made by such slices (`_gram_parts`)


def _gram_parts(x: jax.Array, mask: jax.Array | None, precision: Precision = HIGHEST,
                scale: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """`_gram_and_mean` and, per row, its centred features' projection on the mean
  and the mean over its features: with them the uncentred Gram and the Gram of
  rows centred on their own mean follow from the centred one (`Layer`). With
  `scale` (a power of two), those of `x * scale`, with no scaled copy of `x`.

  On CPU, a layer is read from memory twice (its mean, then everything else a
  slice of features at a time, centred in cache): a centred copy of a large
  layer and XLA:CPU's packing for a (n, D) x (D, n) dot cost 3x the time there
  (ResNet stage-1 layers, n=32: 176 -> 60 ms). Elsewhere one dot over the
  centred copy keeps the matmul units busy."""
  x = jnp.reshape(x, (x.shape[0], -1)).astype(jnp.float32)
  m = jnp.ones((x.shape[0],), jnp.float32) if mask is None else mask.astype(jnp.float32)
  scale = jnp.ones((), jnp.float32) if scale is None else scale
  # The mean as a (1, n) x (n, D) product: XLA's CPU column reduction is ~40x slower.
  mean = jnp.matmul((m * scale)[None, :], x, precision=HIGHEST)[0] / jnp.maximum(m.sum(), 1.0)
  if jax.default_backend() in SLICED_BACKENDS:
    gram, proj, rowsum = _sliced_parts(x, m, mean, precision, scale)
  else:
    c = (x * scale - mean) * m[:, None] if mask is not None else x * scale - mean
    gram, proj, rowsum = jnp.matmul(c, c.T, precision=precision), jnp.matmul(c, mean, precision=HIGHEST), c.sum(1)
  rowmean = (rowsum / x.shape[1] + mean.mean()) * m
  return gram, mean, proj, rowmean


def _sliced_parts(x: jax.Array, m: jax.Array, mean: jax.Array, precision: Precision,
                  scale: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(Gram, projection on the mean, feature sum) of the rows of `x * scale`
  centred on `mean` and masked by `m`, accumulated over slices of `CACHE_SLICE_BYTES`."""
  rows, features = x.shape
  width = min(features, max(1, CACHE_SLICE_BYTES // (4 * rows)))

  def add(sums, start, size):
    mu = jax.lax.dynamic_slice_in_dim(mean, start, size)
    c = (jax.lax.dynamic_slice_in_dim(x, start, size, 1) * scale - mu) * m[:, None]
    gram, proj, rowsum = sums
    return (gram + jnp.matmul(c, c.T, precision=precision),
            proj + jnp.matmul(c, mu, precision=HIGHEST), rowsum + c.sum(1))

  slices, tail = divmod(features, width)
  zeros = lambda *shape: jnp.zeros_like(x, shape=shape)  # varying as `x` is, in shard_map
  sums = (zeros(rows, rows), zeros(rows), zeros(rows))
  if slices > 1:
    sums = jax.lax.fori_loop(0, slices, lambda i, sums: add(sums, i * width, width), sums)
  else:  # a layer in one slice: no loop for XLA to compile
    sums = add(sums, 0, width)
  return add(sums, slices * width, tail) if tail else sums


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


def center_biased(gram: jax.Array) -> jax.Array:
  """H K H with H = I - 11^T / n."""
  means = gram.mean(axis=0)
  means = means - means.mean() / 2
  return gram - means[:, None] - means[None, :]


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.vdot(a.ravel(), b.ravel(), precision=HIGHEST)


def linear_cka(x, y, *, debiased: bool = False) -> float:
  """Full-batch linear CKA between two representations of the same examples."""
  x, y = np.asarray(x), np.asarray(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError(f"linear_cka: x has {x.shape[0]} examples, y has {y.shape[0]}.")
  need = MIN_BATCH if debiased else 2
  if x.shape[0] < need:
    raise ValueError(f"linear_cka{' (debiased)' if debiased else ''} needs at least {need} "
                     f"examples, got {x.shape[0]}.")
  scaled = []
  for name, a in (("x", x), ("y", y)):
    if not np.isfinite(a).all():
      raise ValueError(f"linear_cka: {name} holds {a.size - np.isfinite(a).sum()} NaN or inf values.")
    scaled.append(jnp.asarray(a, jnp.float32))
  e = log2_scales(scaled)  # CKA is scale-free: a power of two keeps float32 in range, exactly
  center = center_unbiased if debiased else center_biased
  grams, floors = [], []
  for i, a in enumerate(scaled):
    gram, mean = _gram_and_mean(a * pow2(-e[i]), None)
    grams.append(center(gram))
    # Unnormalised dots: n^2 times the floor for a normalised self-HSIC.
    floors.append(noise_floor(x.shape[0] ** 2 * float(fourth_moment(mean))))
  k, l = grams
  kk, ll = float(_dot(k, k)), float(_dot(l, l))
  for name, v, floor in (("x", kk, floors[0]), ("y", ll, floors[1])):
    if v <= floor:
      raise FloatingPointError(f"linear_cka: {name} is constant over the examples, so its CKA "
                               "with anything is meaningless.")
  return float(_dot(k, l)) / float(np.sqrt(kk * ll))


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
MEAN_RANGE = 2.0 ** 20  # |mean| / sqrt(max diagonal): its 4th power sums in float32


def _exponent(v: jax.Array) -> jax.Array:
  """floor(log2 v) + 1 for a positive normal float32 v (v * 2^-result in [0.5, 1))."""
  return ((jax.lax.bitcast_convert_type(v, jnp.int32) >> 23) & 0xFF) - 126


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["gram", "mean", "proj", "rowmean", "e"], meta_fields=["features"])
@dataclasses.dataclass(frozen=True)
class Layer:
  """One layer's minibatch at a power-of-two scale 2^-e (`scaled_layer`): the Gram
  of its centred rows, the mean, each centred row's projection on the mean, each
  row's mean over its `features` (padding rows zero). A pytree whose `features`
  is static, so that a scan over identical blocks stacks the arrays alone."""
  gram: jax.Array  # (n, n) K_c 2^-2e
  mean: jax.Array  # (D,) 2^-e
  proj: jax.Array  # (n,) 2^-2e
  rowmean: jax.Array  # (n,) 2^-e
  e: jax.Array
  features: int

  def arrays(self) -> tuple[jax.Array, ...]:
    return self.gram, self.mean, self.proj, self.rowmean, self.e


def _parts_at(a: jax.Array, mask: jax.Array | None, precision: Precision, f: jax.Array
              ) -> tuple[Layer, jax.Array]:
  """(`Layer` of the features times 2^-f, brought below 1 by the Gram's largest
  diagonal entry where that entry and the mean are in range; whether they were)."""
  gram, mean, proj, rowmean = _gram_parts(a, mask, precision, pow2(-f))
  top = jnp.max(jnp.diagonal(gram))
  e = (_exponent(top) + 1) // 2
  fits = ((top >= GRAM_RANGE[0]) & (top <= GRAM_RANGE[1])
          & (jnp.max(jnp.abs(mean)) <= MEAN_RANGE * pow2(e)))
  e = jnp.where(fits, e, 0)
  g, h = pow2(-2 * e), pow2(-e)
  layer = Layer(gram * g, mean * h, proj * g, rowmean * h, f + e, int(np.prod(a.shape[1:])))
  return layer, fits


def scaled_layer(a: jax.Array, mask: jax.Array | None = None, precision: Precision = HIGHEST
                 ) -> Layer:
  """One layer's `Layer`, e an int32 exponent with the largest diagonal entry of
  the centred Gram below 1, so that HSIC products and fourth moments stay in
  float32's range whatever the features' scale.

  A layer larger than a cache slice is read once: its Gram made from the
  features as they are, and only where it (or the mean) is out of range, e.g.
  features of 1e20, made again from the features scaled by their largest |x|
  (a loop of one or two turns over one copy of the code). A smaller layer,
  read again from cache at no cost, is scaled by its largest |x| first:
  straight-line code, a third less to compile than the loop. Power-of-two
  scaling is exact, so both give the same bits.
  """
  if a.size * 4 <= CACHE_SLICE_BYTES:
    return _parts_at(a, mask, precision, log2_scales([a], mask)[0])[0]
  # Every value in the loop varies as `a` does (in shard_map, over the devices).
  zeros = lambda dtype, *shape: jnp.zeros_like(a, dtype, shape=shape)

  def turn(state):
    first = state[0]
    f = jax.lax.cond(first, lambda: zeros(jnp.int32), lambda: log2_scales([a], mask)[0])
    layer, fits = _parts_at(a, mask, precision, f)
    return first & False, fits | ~first, *layer.arrays()

  rows, features = a.shape[0], int(np.prod(a.shape[1:]))
  no = zeros(jnp.bool_)
  start = (~no, no, zeros(jnp.float32, rows, rows), zeros(jnp.float32, features),
           zeros(jnp.float32, rows), zeros(jnp.float32, rows), zeros(jnp.int32))
  out = jax.lax.while_loop(lambda state: ~state[1], turn, start)
  return Layer(*out[2:], features=features)


def scaled_gram(a: jax.Array, mask: jax.Array | None = None, precision: Precision = HIGHEST
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(K 2^-2e, mean 2^-e, e) of `scaled_layer`."""
  layer = scaled_layer(a, mask, precision)
  return layer.gram, layer.mean, layer.e


def minibatch_sums(acts: Sequence[jax.Array], mask: jax.Array | None = None,
                   axis_name: str | tuple[str, ...] | None = None, group: str | None = None,
                   precision: Precision = HIGHEST) -> dict[str, jax.Array]:
  """One minibatch's HSIC matrix and fourth moments of the layers' means, each
  layer scaled by a power of two (exact, see `scaled_gram`); `unscale` restores
  them in float64 on the host.

  Each device scales by its own exponents; only the small results are brought to
  the exponents shared along `axis_name` (their max), after every Gram is made. A
  collective on the exponents before the Grams would keep every layer's
  activations alive until it ran (measured: 2.3 -> 15 GiB on workload W).

  With `group`, the minibatch's rows are spread over the devices of that mesh
  axis (see `group_gram`): each returns its share of the sums, and their sum over
  the group is the single-device result.
  """
  if group is not None:
    return _group_sums(acts, mask, axis_name, group, precision)
  return shared_scale(linear_sums([scaled_layer(a, mask, precision) for a in acts], mask, precision),
                      axis_name)


def _valid_rows(n_all: int, mask: jax.Array | None) -> jax.Array:
  """The minibatch's valid rows in float32: all `n_all`, or those `mask` marks."""
  return jnp.asarray(n_all, jnp.float32) if mask is None else mask.astype(jnp.float32).sum()


def stacked_sums(stacks: Sequence[jax.Array], mask: jax.Array | None = None,
                 axis_name: str | tuple[str, ...] | None = None, group: str | None = None,
                 precision: Precision = HIGHEST) -> dict[str, jax.Array]:
  """`minibatch_sums` of the layers stacked on the leading axis of each of `stacks`
  ((k, rows, ...): k layers of one shape, e.g. a layer's tokens or an image's
  patches), in that order. Each stack's layers are made by one batched copy of
  the code (`jax.vmap`), so the program does not grow with k: localization on a
  16x16 grid has 512 such layers, unrolled over a minute of compile on CPU.
  Spread over a `group` of devices (collectives per layer), the layers are taken
  one by one."""
  if group is not None:
    return minibatch_sums([a for s in stacks for a in s], mask, axis_name, group, precision)
  n_all = stacks[0].shape[1]
  n = _valid_rows(n_all, mask)

  def parts(a: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    layer = scaled_layer(a, mask, precision)
    return center_unbiased(layer.gram, mask).ravel(), n * fourth_moment(layer.mean), layer.e

  grams, moments, exps = (jnp.concatenate(p) for p in zip(*(jax.vmap(parts)(s) for s in stacks)))
  return shared_scale(_linear_out(grams, moments, exps, n_all, mask, precision), axis_name)


def linear_sums(layers: Sequence[Layer], mask: jax.Array | None, precision: Precision = HIGHEST,
                order: jax.Array | None = None) -> dict[str, jax.Array]:
  """One minibatch's HSIC_1 matrix of `layers` (each at its own scale), their
  fourth moments and exponents; with `order`, also `null/hsic`: one layer's
  examples re-indexed by `order` (see `layerpairs`; U-centring commutes with it)."""
  n_all = layers[0].gram.shape[0]
  n = _valid_rows(n_all, mask)
  # One batched centring for every layer: its code does not grow with the layers.
  grams = jax.vmap(center_unbiased, (0, None))(jnp.stack([lay.gram for lay in layers]), mask)
  grams = grams.reshape(len(layers), -1)
  return _linear_out(grams, jnp.stack([n * fourth_moment(lay.mean) for lay in layers]),
                     jnp.stack([lay.e for lay in layers]), n_all, mask, precision, order)


def _linear_out(grams: jax.Array, moments: jax.Array, exps: jax.Array, n_all: int,
                mask: jax.Array | None, precision: Precision, order: jax.Array | None = None
                ) -> dict[str, jax.Array]:
  """`linear_sums` from the layers' stacked, flattened U-centred Grams (of `n_all`
  rows), fourth moments and exponents."""
  out = {"hsic": _hsic_of_grams(grams, n_all, mask, precision), "moments": moments,
         "log2_scale": exps}
  if order is not None:  # the barrier keeps XLA from fusing the centring into both uses (compile memory)
    grams = jax.lax.optimization_barrier(grams)
    moved = layerpairs.permuted(grams.reshape(-1, n_all, n_all), order).reshape(grams.shape)
    out["null/hsic"] = layerpairs.mirror(_hsic_of_grams(grams, n_all, mask, precision, moved))
  return out


def pair_mask(mask: jax.Array) -> jax.Array:
  """(n, n) float32: 1 where both rows are valid and not the same row."""
  m = mask.astype(jnp.float32)
  return m[:, None] * m[None, :] * (1 - jnp.eye(m.shape[0], dtype=jnp.float32))


# The sums that carry the layers' scales, key -> (c, per pair): a pair's sum by
# 2^(c (e_a + e_b)), a layer's by 2^(c e). The module that makes a sum declares it
# beside it (`declare_scale`); `shared_scale` and `unscale` read them.
_SCALED: dict[str, tuple[int, bool]] = {}


def declare_scale(key: str, power: int, per_pair: bool) -> None:
  """Sums named `key` (or "prefix/key") carry the layers' scales to `power`."""
  _SCALED[key] = (power, per_pair)


declare_scale("hsic", 2, per_pair=True)
declare_scale("moments", 4, per_pair=False)


def _power(key: str) -> tuple[int, bool]:
  """(c, whether per pair) of a sum's scale 2^(c e), (0, False) for a scale-free one."""
  return _SCALED.get(key.rsplit("/", 1)[-1], (0, False))


def shared_scale(sums: dict[str, jax.Array], axis_name: str | tuple[str, ...] | None
                 ) -> dict[str, jax.Array]:
  """`sums` at the exponents shared along `axis_name` (`log2_scale` there), ready
  to be summed over it."""
  if axis_name is None:
    return sums
  e = sums["log2_scale"]
  shared = jax.lax.pmax(e, axis_name)
  shift = e - shared  # <= 0; below 2^-126 a device's share is negligible anyway
  down = lambda c: pow2(jnp.maximum(c * shift, -126))
  out = {}
  for k, v in sums.items():
    c, pair = _power(k)
    out[k] = v if not c else v * down(c)[:, None] * down(c)[None, :] if pair else v * down(c)
  out.update(log2_scale=shared)
  return out


def _pass_on(x: jax.Array, group: str) -> jax.Array:
  """Each device of `group` receives the next device's `x` (a ring)."""
  size = jax.lax.axis_size(group)
  return jax.lax.ppermute(x, group, [((i + 1) % size, i) for i in range(size)])


def _ring(v: jax.Array, group: str, op) -> jax.Array:
  """`op`-reduction of `v` over the devices of `group`, passed around a ring. A
  psum or pmax here would be merged by XLA with those of every other layer,
  keeping every layer's activations alive until all had run (measured on
  ViT-B/16 + R50, 128 rows over 2 devices: 19.9 GiB against 2.6 GiB). A loop, so
  that the program does not grow with the group; on CPU such programs are kept
  out of JAX's persistent compilation cache (`parallel.uncached`)."""
  def hop(_, carry):
    total, passing = carry
    passing = _pass_on(passing, group)
    return op(total, passing), passing
  return jax.lax.fori_loop(0, jax.lax.axis_size(group) - 1, hop, (v, v))[0]


GROUP_SLICE_BYTES = 32 * 2**20  # a device's features passed around the group at a time


def group_gram(a: jax.Array, mask: jax.Array, keep: jax.Array, group: str,
               precision: Precision = HIGHEST) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(this device's row block of the U-centred Gram of a minibatch spread over the
  devices of mesh axis `group`, scaled by 2^-2e; the minibatch mean, scaled by
  2^-e; e), with columns in device order along `group`; `keep` is the mask of
  every row of the minibatch.

  The features are scaled by a power of two shared by the group before anything
  else (exact), then centred on the group's mean. The Gram is made a slice of
  the features at a time (`GROUP_SLICE_BYTES` of this device's rows): each
  device's slice travels once around the group (`ppermute` in a loop, like
  `_ring`), each device adding its rows' products with the slice that arrives.
  So a device holds, beyond its activations, their centred copy and one slice
  passing, where whole row blocks passing (and arriving) held two more copies
  of the largest layer.
  """
  size, me = jax.lax.axis_size(group), jax.lax.axis_index(group)
  x = jnp.reshape(a, (a.shape[0], -1)).astype(jnp.float32)
  rows, features = x.shape
  e = _ring(log2_scales([x], mask)[0], group, jnp.maximum)
  x = x * pow2(-e)
  mean = _ring(jnp.matmul(mask[None, :], x, precision=HIGHEST), group, jnp.add)
  mean = mean / jnp.maximum(keep.sum(), 1.0)
  c = (x - mean) * mask[:, None]

  def add(row, start, width):  # + the products over features [start, start + width)
    mine = jax.lax.dynamic_slice_in_dim(c, start, width, 1)

    def block(row, passing, k):  # the slice of device (me + k) % size has arrived
      at = (0, ((me + k) % size) * rows)
      done = jax.lax.dynamic_slice(row, at, (rows, rows))
      return jax.lax.dynamic_update_slice(
          row, done + jnp.matmul(mine, passing.T, precision=precision), at)

    def hop(k, carry):
      row, passing = carry
      return block(row, passing, k), _pass_on(passing, group)

    row, passing = jax.lax.fori_loop(0, size - 1, hop, (row, mine))
    return block(row, passing, size - 1)

  width = max(1, GROUP_SLICE_BYTES // (4 * rows))
  slices, tail = divmod(features, width)
  row = jnp.zeros_like(c, shape=(rows, size * rows))
  if slices:  # (a loop's body is traced even for no iterations)
    row = jax.lax.fori_loop(0, slices, lambda i, row: add(row, i * width, width), row)
  if tail:
    row = add(row, slices * width, tail)
  # U-centring (as `center_unbiased`) of the whole Gram from its row blocks: the
  # column sums of the symmetric Gram are its row sums, gathered over the group.
  diag = jnp.arange(size * rows)[None, :] == (me * rows + jnp.arange(rows))[:, None]
  off_diag = jnp.where(diag, 0.0, mask[:, None] * keep[None, :])
  g = row * off_diag
  n = keep.sum()
  means = jax.lax.all_gather(g.sum(axis=1), group, tiled=True) / (n - 2)
  means = means - means.sum() / (2 * (n - 1))
  mine = jax.lax.dynamic_slice(means, (me * rows,), (rows,))
  return (g - mine[:, None] - means[None, :]) * off_diag, mean[0], e


def _group_sums(acts, mask, axis_name, group, precision) -> dict[str, jax.Array]:
  m = (jnp.ones((acts[0].shape[0],), jnp.float32) if mask is None
       else mask.astype(jnp.float32))
  keep = jax.lax.all_gather(m, group, tiled=True)
  n = keep.sum()
  grams, moments, exps = [], [], []
  done = keep
  for a in acts:
    # Each layer's collectives after the last layer's: XLA's CPU runtime runs
    # independent ops in any order, and devices that took two layers' collectives
    # in different orders would wait for each other forever.
    a, _ = jax.lax.optimization_barrier((a, done))
    block, mean, e = group_gram(a, m, keep, group, precision)
    done = block
    grams.append(block.ravel())
    moments.append(m.sum() * fourth_moment(mean))  # the group's shares add up to n's
    exps.append(e)
  hs = jnp.matmul(jnp.stack(grams), jnp.stack(grams).T, precision=precision)
  hsic = jnp.where(n >= MIN_BATCH, hs / jnp.maximum(n * (n - 3), 1.0), 0.0)
  return shared_scale({"hsic": hsic, "moments": jnp.stack(moments), "log2_scale": jnp.stack(exps)},
                      axis_name)


def unscale(got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """`minibatch_sums` in float64 at the features' own scale (other entries kept)."""
  if "log2_scale" not in got:
    return got
  out = dict(got)
  e = np.asarray(out.pop("log2_scale"), np.float64)
  for k, v in got.items():  # (a leading axis of minibatches broadcasts)
    c, pair = _power(k)
    if c:
      scale = c * (e[..., :, None] + e[..., None, :]) if pair else c * e
      out[k] = np.ldexp(np.asarray(v, np.float64), scale.astype(int))
  return out


def _hsic_of_grams(g: jax.Array, n_all: int, mask: jax.Array | None,
                   precision: Precision = HIGHEST, g2: jax.Array | None = None) -> jax.Array:
  """All pairs of stacked, flattened U-centred Grams (`g` with `g2`, default `g`)
  in one matmul, normalised."""
  n = _valid_rows(n_all, mask)
  hs = jnp.matmul(g, (g if g2 is None else g2).T, precision=precision)
  return jnp.where(n >= MIN_BATCH, hs / jnp.maximum(n * (n - 3), 1.0), 0.0)


@dataclasses.dataclass
class CKAResult:
  """CKA between every pair of layers; `xy` rows are model x, columns model y."""
  names_x: list[str]
  names_y: list[str]
  xx: np.ndarray
  yy: np.ndarray | None
  xy: np.ndarray | None


def fourth_moment(mean: jax.Array) -> jax.Array:
  """sum_d mean_d^4: the scale a self-HSIC is judged against in `cka_from_hsic`.
  For a constant layer it equals each example's sum_d x_d^4, whose rounding noise
  the floor bounds; any real spread only raises the self-HSIC above it."""
  return jnp.sum(jnp.square(jnp.square(mean)))


# A constant layer's centred features are float32 rounding, at most about
# c u |x_d| per entry (c^2 below NOISE for the minibatch mean of up to ~10^4
# rows), so its self-HSIC, the squared Frobenius norm of that noise's
# covariance, stays below (NOISE u^2)^2 sum_d x_d^4, which for a constant layer
# is sum_d mean_d^4 (`fourth_moment`). A real layer with spread s per feature on
# an offset m is there only if s/m < sqrt(NOISE) u ~ 6e-6.
NOISE = 1e4
U32 = 2.0 ** -24


def noise_floor(mean_m4: np.ndarray) -> np.ndarray:
  """The self-HSIC below which a layer is float32 rounding noise (see above)."""
  return (NOISE * U32 ** 2) ** 2 * np.asarray(mean_m4, np.float64)


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
  check_layers(diag, mean_m4, names)
  return hsic / np.sqrt(np.outer(diag, diag))


def check_layers(self_hsic: np.ndarray, mean_m4: np.ndarray | None, names: Sequence[str],
                 what: str = "CKA") -> None:
  """Every layer's accumulated self-HSIC is finite and above float32's rounding
  level (given each layer's mean `fourth_moment`): else an error naming the layer
  and the cause. Any similarity of a layer that overflowed, or that is constant
  over the examples, is a number that means nothing, whichever measure (`what`)."""
  floors = np.zeros(len(self_hsic)) if mean_m4 is None else noise_floor(mean_m4)
  for name, v, floor in zip(names, self_hsic, floors):
    if not np.isfinite(v):
      raise FloatingPointError(f"{what}: self-HSIC of layer {name!r} is {v}; the activations "
                               "overflowed or contain NaN/inf.")
    if v <= floor:
      raise FloatingPointError(
          f"{what}: layer {name!r} is constant over the examples (self-HSIC {v:.3g}"
          f"{', at float32 rounding level for its feature scale' if v > 0 else ''}), so "
          "its similarity with anything is meaningless. Check the inputs: are the images "
          "identical or blank? (A layer that is constant by design cannot be compared: "
          "leave it out of the captured points.)")


class MinibatchCKA:
  """Accumulates HSIC1 over minibatches for all layer pairs, within and across models.

  State is one (L, L) float32 matrix over the layers of x followed by those of
  y (plus a batch count), independent of the number of examples.
  """

  def __init__(self, names_x: Sequence[str], names_y: Sequence[str] | None = None):
    self.names_x = list(names_x)
    self.names_y = list(names_y) if names_y is not None else None
    size = len(self.names) if self.names_y is None else len(self.names_x) + len(self.names_y)
    self.hsic = np.zeros((size, size), np.float64)
    self.moments = np.zeros((size,), np.float64)  # summed n * fourth_moment(mean)
    self.examples = 0
    self._update = jax.jit(minibatch_sums)

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
    got = unscale(jax.device_get(self._update(acts)))
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
