"""BiT ResNet-v2: pre-activation bottlenecks, weight-standardised convs, GroupNorm.

Numerics follow google-research/big_transfer and big_vision's `bit_paper`,
which agree on all but one point: weight standardisation with eps 1e-10 over
(H, W, Cin), GroupNorm with 32 groups and eps 1e-5 (variance as the mean
squared deviation), symmetric explicit padding, and a 3x3/2 max-pool after the
unnormalised root conv, whose padding differs: zeros in big_transfer (TF, JAX
and PyTorch code alike), -inf in `bit_paper` (Flax's max_pool). Since the root
conv output can be negative, this changes border values; `root_pool_pad`
records which, and the loader sets it from the file's format.

Parameter tree (big_vision `bit_paper` names, GroupNorm params as (C,)):
  root_block/conv_root, blockB/unitUU/{gn1,conv1,gn2,conv2,gn3,conv3,conv_proj},
  norm-pre-head, head.

Representation points (`out` names), per unit `blockB/unitUU/`:
  preact (relu(gn1(x))), shortcut, conv1, preact2, conv2, preact3, conv3, out
and root/conv, root/pool, head/preact (B,h,w,C), pre_logits, logits.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.models import anatomy
from vitcnn_jax.models import blocks
from vitcnn_jax.models import capturing
from vitcnn_jax.models import layers
from vitcnn_jax.models import sizes

# Capture presets. "paper": every ResNet-v2 sublayer (the projection shortcut
# duplicates nothing, identity shortcuts would duplicate the previous unit's output,
# so shortcuts are left out); "blocks": unit outputs; "all": every point.
LAYER_PRESETS = {
    "paper": ("root/*", "block*/unit*/preact", "block*/unit*/conv1", "block*/unit*/preact2",
              "block*/unit*/conv2", "block*/unit*/preact3", "block*/unit*/conv3",
              "block*/unit*/out", "head/preact"),
    "blocks": ("block*/unit*/out",),
    "all": ("**",),
}
DEPTHS: dict[int, tuple[int, ...]] = {
    50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def block_sizes(depth: int | Sequence[int]) -> tuple[int, ...]:
  if isinstance(depth, int):
    if depth not in DEPTHS:
      raise ValueError(f"depth={depth} is not one of {sorted(DEPTHS)}; pass the "
                       "units per block instead, e.g. depth=(2, 2, 2, 2).")
    return DEPTHS[depth]
  return tuple(int(d) for d in depth)


class StdConv(nn.Module):
  """Bias-free conv whose kernel is standardised per output channel (unless
  `standardized`: the kernel given is standardised already, see `BiT.for_inference`).
  Computed as `layers.conv` (dots where XLA's CPU convolution is slow)."""
  features: int
  kernel: int
  stride: int = 1
  standardized: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    w = layers.param(self, "kernel", nn.initializers.he_normal(),
                     (self.kernel, self.kernel, x.shape[-1], self.features), jnp.float32)
    if not self.standardized:
      w = standardize_kernel(w)
    return layers.conv(x, w.astype(x.dtype), self.stride)


def standardize_kernel(w: jax.Array | np.ndarray, xp: Any = jnp) -> jax.Array | np.ndarray:
  """Weight standardisation: each output channel's (H, W, Cin) kernel to mean 0,
  variance 1, in float32; `xp` the array module (numpy: on the host)."""
  w = w - w.mean(axis=(0, 1, 2), keepdims=True)
  return w / xp.sqrt(xp.mean(xp.square(w), axis=(0, 1, 2), keepdims=True) + 1e-10)


def _standardize_kernels(params: Any) -> Any:
  """`standardize_kernel` applied on the host to every conv kernel (4-D `kernel`)
  of a BiT's parameters: a jitted pass over BiT-R50x1's 53 kernels compiled in
  0.6 s for 0.04 s of work, once per new process; numpy takes 0.06 s."""
  return jax.tree_util.tree_map_with_path(
      lambda path, w: standardize_kernel(w, np) if path[-1].key == "kernel" and w.ndim == 4 else w,
      jax.device_get(params))


class GroupNorm(nn.Module):
  """GroupNorm with statistics from per-channel sums: a reduction over the pixels
  keeps the channels contiguous (XLA:CPU vectorises it; a reduction over a
  (groups, channels per group) split of them ran at a quarter of the speed), and
  the normalisation is a subtraction and a multiply-add per element with
  per-(example, channel) coefficients."""
  groups: int = 32
  eps: float = 1e-5

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    n, h, w, c = x.shape
    if c % self.groups:
      raise ValueError(f"GroupNorm: {c} channels are not divisible into {self.groups} groups.")
    k = c // self.groups
    per_group = lambda a: a.reshape(n, self.groups, k).sum(-1)  # (n, c) -> (n, groups)
    per_channel = lambda a: jnp.repeat(a, k, axis=1)[:, None, None, :]  # (n, groups) -> (n,1,1,c)
    # Mean and variance in one pass over x (sum and sum of squares), taken about
    # the mean of the group's first row of pixels, which is close to the group's
    # mean, so that a large mean does not cancel digits of the variance. The
    # result does not depend on the shift, so no gradient flows into it.
    shift = per_channel(jax.lax.stop_gradient(per_group(x[:, 0].mean(axis=1)) / k))
    d = x - shift
    count = h * w * k
    mean_d = per_group(d.sum(axis=(1, 2))) / count
    var = jnp.maximum(per_group(jnp.square(d).sum(axis=(1, 2))) / count - jnp.square(mean_d), 0.0)
    scale = layers.param(self, "scale", nn.initializers.ones, (c,), jnp.float32)
    bias = layers.param(self, "bias", nn.initializers.zeros, (c,), jnp.float32)
    # Shift and mean subtracted one after the other: their float32 sum would lose
    # the mean's digits where the shift is large.
    return (d - per_channel(mean_d)) * (per_channel(jax.lax.rsqrt(var + self.eps)) * scale) + bias


class Unit(nn.Module):
  """Pre-activation bottleneck; the projection sees the activated input."""
  nmid: int
  stride: int = 1
  standardized: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    nout = 4 * self.nmid
    conv = functools.partial(StdConv, standardized=self.standardized)
    p = capture.put(out, "preact", nn.relu(GroupNorm(name="gn1")(x)))
    shortcut = x
    if x.shape[-1] != nout or self.stride != 1:
      shortcut = conv(nout, 1, self.stride, name="conv_proj")(p)
    capture.put(out, "shortcut", shortcut)
    y = capture.put(out, "conv1", conv(self.nmid, 1, name="conv1")(p))
    y = capture.put(out, "preact2", nn.relu(GroupNorm(name="gn2")(y)))
    y = capture.put(out, "conv2", conv(self.nmid, 3, self.stride, name="conv2")(y))
    y = capture.put(out, "preact3", nn.relu(GroupNorm(name="gn3")(y)))
    y = capture.put(out, "conv3", conv(nout, 1, name="conv3")(y))
    return capture.put(out, "out", y + shortcut)


ROOT_POOL_PADS = ("zero", "-inf")


class Root(nn.Module):
  """7x7/2 conv (no norm, no ReLU), then a 3x3/2 max-pool padded by `pad`.

  The pool pads inside the reduction (-inf), and for zero padding the windows
  that reach into the padding take the max with 0 too: the same values as
  pooling a zero-padded copy, without writing that copy of the largest
  activation (XLA:CPU did not fuse the pad into the pool: 47 of 3,650 ms of a
  R50 forward at batch 32)."""
  features: int
  pad: str = "zero"
  standardized: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    x = capture.put(out, "conv", StdConv(self.features, 7, 2, self.standardized, name="conv_root")(x))
    y = nn.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)))
    if self.pad == "zero":
      # Output i pools input rows 2i - 1 .. 2i + 1: the padding is row -1 or row h.
      edge = lambda size, n: (2 * jnp.arange(n) - 1 < 0) | (2 * jnp.arange(n) + 1 >= size)
      border = edge(x.shape[1], y.shape[1])[:, None] | edge(x.shape[2], y.shape[2])[None, :]
      y = jnp.where(border[None, :, :, None], jnp.maximum(y, 0.0), y)
    return capture.put(out, "pool", y)


class Stage(nn.Module):
  units: int
  nmid: int
  stride: int
  standardized: bool = False
  scan: bool = True  # identical units as one scan (`blocks.apply_blocks`)

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    names = [f"unit{u:02d}" for u in range(1, self.units + 1)]
    x = Unit(self.nmid, self.stride, self.standardized, name=names[0])(x, capture.child(names[0]), out)
    if len(names) == 1:
      return x
    # The units after the first are identical.
    return blocks.apply_blocks(self, functools.partial(Unit, self.nmid, 1, self.standardized), names[1:],
                               x, [capture.child(n) for n in names[1:]], out, scan=self.scan)


class BiT(anatomy.FeatureMaps, anatomy.NoAttention, nn.Module):
  """ResNet-v2 R{50,101,152}x{width}; any units per block via `depth`."""
  num_classes: int | None = 1000
  width: float = 1  # R50x1 -> 1; fractions (0.5) make tiny test models
  depth: int | Sequence[int] = 50
  image_size: int | Sequence[int] = 224  # a default for callers; any size runs
  root_pool_pad: str = "zero"  # "zero": big_transfer; "-inf": big_vision bit_paper
  standardized: bool = False  # conv kernels given standardised (`for_inference`)

  family = "bit"
  # Anatomy (models/anatomy.py): residual blocks are units; no tokens, no attention.
  sublayers = ("unit",)
  stem = "root/conv"
  default_policy = "resize"
  layer_presets = LAYER_PRESETS

  @property
  def num_blocks(self) -> int:
    return sum(block_sizes(self.depth))

  def for_inference(self, params: Any) -> tuple[BiT, Any]:
    """Every conv kernel standardised once (in float32, as each step did), and a
    model that uses them as given: the same function without that work per step.
    Abstract parameters (shapes only) stay as they are: standardising keeps shapes."""
    if self.standardized:
      return self, params
    if not any(isinstance(a, jax.ShapeDtypeStruct) for a in jax.tree.leaves(params)):
      params = _standardize_kernels(params)
    return self.clone(standardized=True), params

  def residuals(self) -> list[anatomy.Residual]:
    units = [f"block{b}/unit{u:02d}" for b, n in enumerate(block_sizes(self.depth), 1)
             for u in range(1, n + 1)]
    return [anatomy.Residual(k, "unit", f"{k}/shortcut", f"{k}/conv3", f"{k}/out") for k in units]

  @nn.compact
  def __call__(self, images: jax.Array, *,
               capture: capturing.Capture | str | Sequence[str] | None = None,
               train: bool = False) -> tuple[jax.Array, dict]:
    sizes.check_image(images, None, "BiT")  # any size runs
    if self.root_pool_pad not in ROOT_POOL_PADS:
      raise ValueError(f"root_pool_pad={self.root_pool_pad!r} is not one of {sorted(ROOT_POOL_PADS)}.")
    capture = capturing.Capture.of(capture)
    out: dict = {}
    root = int(64 * self.width)
    x = Root(root, self.root_pool_pad, self.standardized, name="root_block")(images, capture.child("root"), out)
    for b, units in enumerate(block_sizes(self.depth), 1):
      name = f"block{b}"
      x = Stage(units, root * 2 ** (b - 1), 1 if b == 1 else 2, self.standardized, not train,
                name=name)(
          x, capture.child(name), out)
    x = capture.put(out, "head/preact", nn.relu(GroupNorm(name="norm-pre-head")(x)))
    x = capture.put(out, "pre_logits", x.mean(axis=(1, 2)))
    if self.num_classes:
      x = capture.put(out, "logits", layers.dense_head(self.num_classes)(x))
    return x, out
