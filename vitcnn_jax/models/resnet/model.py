"""ResNet v1: post-activation residual units, the CNN of most published work
since 2015 (torchvision, timm, Caffe and TF ports).

Root: 7x7/2 conv (padding 3) -> BatchNorm -> ReLU -> 3x3/2 max-pool, padded
`pool_pad` (torch: (1, 1); TF's SAME at even sizes: (0, 1)). Units: a
bottleneck (1x1 -> 3x3 -> 1x1, 4x expansion) or a basic block (3x3 -> 3x3),
each conv followed by BatchNorm and (but the last) ReLU; the shortcut is the
input, or a strided 1x1 conv and BatchNorm where the shape changes; ReLU
after the sum. The stride of a downsampling bottleneck sits in its 1x1 conv
(`stride_in="1x1"`: the original Caffe and TF models) or its 3x3
(`"3x3"`: torchvision's and timm's v1.5). `batchnorm=False` is a network
whose BatchNorms were folded into its convs' biases (ONNX conversions).
BatchNorm runs in inference mode: its running statistics are parameters.

Representation points (`out` names), per unit `blockB/unitUU/`:
  conv1, act1, conv2, act2[, conv3], shortcut, add, out
(`convN` after its BatchNorm, `add` before the final ReLU) and root/conv,
root/pool, pre_logits, logits.
"""

from __future__ import annotations

import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from vitcnn_jax.models import anatomy
from vitcnn_jax.models import blocks
from vitcnn_jax.models import capturing
from vitcnn_jax.models import layers
from vitcnn_jax.models import sizes

LAYER_PRESETS = {
    "paper": ("root/*", "block*/unit*/conv1", "block*/unit*/act1", "block*/unit*/conv2",
              "block*/unit*/act2", "block*/unit*/conv3", "block*/unit*/out"),
    "blocks": ("block*/unit*/out",),
    "all": ("**",),
}
BLOCKS = ("bottleneck", "basic")
STRIDES_IN = ("1x1", "3x3")
INPUT_ORDERS = ("rgb", "bgr")
# What a torch file's non-4-D stem or shortcut is instead of ResNet v1's conv, for messages.
NOT_V1 = "; deep stems and pooled shortcuts (timm's resnet*d) are not ResNet v1"


class Conv(nn.Module):
  """A conv with symmetric padding (kernel - 1) // 2 (`layers.conv`)."""
  features: int
  kernel: int
  stride: int = 1
  bias: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    w = layers.param(self, "kernel", nn.initializers.he_normal(),
                     (self.kernel, self.kernel, x.shape[-1], self.features), jnp.float32)
    y = layers.conv(x, w, self.stride)
    if self.bias:
      y = y + layers.param(self, "bias", nn.initializers.zeros, (self.features,), jnp.float32)
    return y


class BatchNorm(nn.Module):
  """Inference-mode BatchNorm: (x - mean) / sqrt(var + eps) * scale + bias."""
  eps: float = 1e-5

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = x.shape[-1]
    scale = layers.param(self, "scale", nn.initializers.ones, (c,), jnp.float32)
    bias = layers.param(self, "bias", nn.initializers.zeros, (c,), jnp.float32)
    mean = layers.param(self, "mean", nn.initializers.zeros, (c,), jnp.float32)
    var = layers.param(self, "var", nn.initializers.ones, (c,), jnp.float32)
    return (x - mean) * (scale * jax.lax.rsqrt(var + self.eps)) + bias


def _conv_norm(x: jax.Array, conv: str, bn: str, features: int, kernel: int, stride: int,
               batchnorm: bool, eps: float) -> jax.Array:
  """A conv and its BatchNorm, or a conv with a bias where the BatchNorm was
  folded into it. Called inside a compact module, which owns both."""
  y = Conv(features, kernel, stride, bias=not batchnorm, name=conv)(x)
  return BatchNorm(eps, name=bn)(y) if batchnorm else y


class Unit(nn.Module):
  """A post-activation bottleneck or basic unit."""
  nmid: int
  nout: int
  stride: int = 1
  block: str = "bottleneck"
  stride_in: str = "3x3"
  batchnorm: bool = True
  eps: float = 1e-5

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    cn = lambda y, i, features, kernel, stride: _conv_norm(
        y, f"conv{i}", f"bn{i}", features, kernel, stride, self.batchnorm, self.eps)
    shortcut = x
    if x.shape[-1] != self.nout or self.stride != 1:
      shortcut = cn(x, "_proj", self.nout, 1, self.stride)
    capture.put(out, "shortcut", shortcut)
    if self.block == "basic":
      y = nn.relu(capture.put(out, "conv1", cn(x, 1, self.nmid, 3, self.stride)))
      y = capture.put(out, "act1", y)
      y = capture.put(out, "conv2", cn(y, 2, self.nout, 3, 1))
    else:
      s1, s3 = (self.stride, 1) if self.stride_in == "1x1" else (1, self.stride)
      y = capture.put(out, "act1", nn.relu(capture.put(out, "conv1", cn(x, 1, self.nmid, 1, s1))))
      y = capture.put(out, "act2", nn.relu(capture.put(out, "conv2", cn(y, 2, self.nmid, 3, s3))))
      y = capture.put(out, "conv3", cn(y, 3, self.nout, 1, 1))
    y = capture.put(out, "add", y + shortcut)
    return capture.put(out, "out", nn.relu(y))


class ResNet(anatomy.FeatureMaps, anatomy.NoAttention, anatomy.ParamsAsRead, nn.Module):
  """ResNet v1 of any depths and widths (ResNet-18..152, half-width variants)."""
  num_classes: int | None = 1000
  depth: Sequence[int] = (3, 4, 6, 3)  # units per stage
  widths: Sequence[int] = (64, 128, 256, 512)  # each stage's inner width (3x3 conv)
  stem_width: int = 64
  block: str = "bottleneck"  # or "basic"
  stride_in: str = "3x3"  # where a bottleneck downsamples: "3x3" (v1.5) or "1x1" (v1)
  batchnorm: bool = True  # False: BatchNorm folded into conv biases
  bn_eps: float = 1e-5
  pool_pad: Sequence[int] = (1, 1)  # the root max-pool's (before, after) padding
  input_order: str = "rgb"  # "bgr": the network was trained on BGR (Caffe) inputs
  image_size: int | Sequence[int] = 224  # a default for callers; any size runs

  family = "resnet"
  sublayers = ("unit",)
  stem = "root/conv"
  default_policy = "bicubic_crop0.875_imagenet"
  layer_presets = LAYER_PRESETS

  @property
  def num_blocks(self) -> int:
    return sum(self.depth)

  @property
  def expansion(self) -> int:
    return 4 if self.block == "bottleneck" else 1

  def residuals(self) -> list[anatomy.Residual]:
    units = [f"block{b}/unit{u:02d}" for b, n in enumerate(self.depth, 1) for u in range(1, n + 1)]
    last = "conv3" if self.block == "bottleneck" else "conv2"
    return [anatomy.Residual(k, "unit", f"{k}/shortcut", f"{k}/{last}", f"{k}/add") for k in units]

  def _check(self) -> None:
    for field, value, allowed in (("block", self.block, BLOCKS),
                                  ("stride_in", self.stride_in, STRIDES_IN),
                                  ("input_order", self.input_order, INPUT_ORDERS)):
      if value not in allowed:
        raise ValueError(f"ResNet: {field}={value!r} is not one of {list(allowed)}.")
    if len(self.depth) != len(self.widths) or not all(int(d) > 0 for d in self.depth):
      raise ValueError(f"ResNet: depth={tuple(self.depth)} and widths={tuple(self.widths)} need "
                       "one positive unit count and one width per stage.")
    if len(self.pool_pad) != 2 or not all(0 <= int(p) <= 1 for p in self.pool_pad):
      raise ValueError(f"ResNet: pool_pad={tuple(self.pool_pad)} is not (before, after) in {{0, 1}}.")

  @nn.compact
  def __call__(self, images: jax.Array, *,
               capture: capturing.Capture | str | Sequence[str] | None = None,
               train: bool = False) -> tuple[jax.Array, dict]:
    sizes.check_image(images, None, "ResNet")  # any size runs
    self._check()
    capture = capturing.Capture.of(capture)
    out: dict = {}
    x = images[..., ::-1] if self.input_order == "bgr" else images
    root = capture.child("root")
    x = root.put(out, "conv", _conv_norm(x, "conv_root", "bn_root", self.stem_width, 7, 2,
                                         self.batchnorm, self.bn_eps))
    pad = tuple(int(p) for p in self.pool_pad)
    x = root.put(out, "pool", nn.max_pool(nn.relu(x), (3, 3), (2, 2), (pad, pad)))
    for b, (units, width) in enumerate(zip(self.depth, self.widths), 1):
      unit = functools.partial(Unit, int(width), int(width) * self.expansion, block=self.block,
                               stride_in=self.stride_in, batchnorm=self.batchnorm, eps=self.bn_eps)
      x = unit(2 if b > 1 else 1, name=f"block{b}_unit01")(x, capture.child(f"block{b}/unit01"), out)
      if units > 1:  # the units after the first are identical
        x = blocks.apply_blocks(self, functools.partial(unit, 1),
                                [f"block{b}_unit{u:02d}" for u in range(2, int(units) + 1)], x,
                                [capture.child(f"block{b}/unit{u:02d}") for u in range(2, int(units) + 1)], out,
                                scan=not train)
    x = capture.put(out, "pre_logits", x.mean(axis=(1, 2)))
    if self.num_classes:
      x = capture.put(out, "logits", layers.dense_head(self.num_classes)(x))
    return x, out
