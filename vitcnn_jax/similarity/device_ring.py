"""The Gram of a minibatch whose rows are spread over the devices of a mesh axis
(`config.devices_per_minibatch`), made by passing the features around a ring.

A minibatch larger than one device's memory is split by rows over a group of
devices; each device makes its row block of the U-centred Gram, the features
travelling once around the group a slice at a time (`group_gram`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity.grams import HIGHEST, Precision


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
  out of JAX's persistent compilation cache (`run.parallel.uncached`)."""
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
  e = _ring(grams.log2_scales([x], mask)[0], group, jnp.maximum)
  x = x * grams.pow2(-e)
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
  # U-centring (as `grams.center_unbiased`) of the whole Gram from its row blocks: the
  # column sums of the symmetric Gram are its row sums, gathered over the group.
  diag = jnp.arange(size * rows)[None, :] == (me * rows + jnp.arange(rows))[:, None]
  off_diag = jnp.where(diag, 0.0, mask[:, None] * keep[None, :])
  g = row * off_diag
  n = keep.sum()
  means = jax.lax.all_gather(g.sum(axis=1), group, tiled=True) / (n - 2)
  means = means - means.sum() / (2 * (n - 1))
  mine = jax.lax.dynamic_slice(means, (me * rows,), (rows,))
  return (g - mine[:, None] - means[None, :]) * off_diag, mean[0], e
