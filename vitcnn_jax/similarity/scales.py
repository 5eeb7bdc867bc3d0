"""The power-of-two scales that a step's sums carry, shared across devices and
undone on the host.

Each layer's Gram is made at a scale 2^-e (`grams.Layer`), so a sum built
from it carries that scale: a pair's sum 2^-(c (e_a + e_b)), a layer's 2^-(c e).
Which sums carry which power is declared beside the code that makes them: the
linear HSIC's in `hsic.SCALES`, every other measure family's in its
`registry.Family.scales`; `measures.SCALES` gathers them all.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import grams


class Scale(NamedTuple):
  """A sum's scale 2^-(c e): `power` c, per pair of layers (e_a + e_b) or per layer."""
  power: int
  per_pair: bool


NONE = Scale(0, False)


def of(key: str, table: Mapping[str, Scale]) -> Scale:
  """The scale of the sum `key` ("prefix/name": that of name); `NONE` for a scale-free one."""
  return table.get(key.rsplit("/", 1)[-1], NONE)


def shared_scale(sums: dict[str, jax.Array], axis_name: str | tuple[str, ...] | None,
                 table: Mapping[str, Scale]) -> dict[str, jax.Array]:
  """`sums` at the exponents shared along `axis_name` (`log2_scale` there), ready
  to be summed over it."""
  if axis_name is None:
    return sums
  e = sums["log2_scale"]
  shared = jax.lax.pmax(e, axis_name)
  shift = e - shared  # <= 0; below 2^-126 a device's share is negligible anyway
  down = lambda c: grams.pow2(jnp.maximum(c * shift, -126))
  out = {}
  for k, v in sums.items():
    c, pair = of(k, table)
    out[k] = v if not c else v * down(c)[:, None] * down(c)[None, :] if pair else v * down(c)
  out.update(log2_scale=shared)
  return out


def unscale(got: dict[str, np.ndarray], table: Mapping[str, Scale]) -> dict[str, np.ndarray]:
  """A step's sums in float64 at the features' own scale (other entries kept)."""
  if "log2_scale" not in got:
    return got
  if grams.needs_prescaling(got["log2_scale"]):
    raise ValueError("a step's sums have a layer out of float32's range (log2_scale grams.UNFIT): "
                     "its minibatch must be run again with the layers prescaled (runstate.Steps does).")
  out = dict(got)
  e = np.asarray(out.pop("log2_scale"), np.float64)
  for k, v in got.items():  # (a leading axis of minibatches broadcasts)
    c, pair = of(k, table)
    if c:
      scale = c * (e[..., :, None] + e[..., None, :]) if pair else c * e
      out[k] = np.ldexp(np.asarray(v, np.float64), scale.astype(int))
  return out
