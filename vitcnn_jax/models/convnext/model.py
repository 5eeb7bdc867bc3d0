"""ConvNeXt (v1 and v2), the modern CNN that ViTs are compared with, with
timm's arithmetic (its files are timm state dicts; `timm.py`).

Stem: a patch x patch / patch conv, then LayerNorm over channels. Stages
1..3 start with LayerNorm and a 2x2/2 conv. Block: 7x7 depthwise conv
(padding 3) -> LayerNorm -> Dense 4C -> exact GELU [-> GRN, v2] -> Dense C
[* gamma, v1's layer scale] + the block's input. Head: global average pool ->
LayerNorm -> Dense. Every LayerNorm has eps 1e-6 (timm's), but the head's is
`head_eps` (transformers' ConvNeXt takes config.json's layer_norm_eps there).

Representation points (`out` names), per block `stageS/blockBB/`:
  in, dwconv, norm, mlp/hidden, mlp/out (after gamma), out
and stem (B,h,w,C), stageS/downsample, pre_logits (the normed pooled
features), logits.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.models import anatomy
from vitcnn_jax.models import capturing
from vitcnn_jax.models import layers
from vitcnn_jax.models import sizes
from vitcnn_jax.models.formats.base import Reading

# (depths, widths) of timm's names; v2 adds `grn=True, layer_scale=False`.
VARIANTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "T": ((3, 3, 9, 3), (96, 192, 384, 768)),
    "S": ((3, 3, 27, 3), (96, 192, 384, 768)),
    "B": ((3, 3, 27, 3), (128, 256, 512, 1024)),
    "L": ((3, 3, 27, 3), (192, 384, 768, 1536)),
}
LAYER_PRESETS = {
    "paper": ("stem", "stage*/block*/dwconv", "stage*/block*/norm", "stage*/block*/mlp/hidden",
              "stage*/block*/mlp/out", "stage*/block*/out", "pre_logits"),
    "blocks": ("stage*/block*/out",),
    "all": ("**",),
}
EPS = 1e-6


def _norm(name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=EPS, name=name)


class GRN(nn.Module):
  """ConvNeXt-V2's global response normalisation: each channel's spatial L2
  norm, divided by its mean over channels, rescales the features."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = x.shape[-1]
    gamma = layers.param(self, "scale", nn.initializers.zeros, (c,), x.dtype)
    beta = layers.param(self, "bias", nn.initializers.zeros, (c,), x.dtype)
    g = jnp.sqrt(jnp.sum(jnp.square(x), axis=(1, 2), keepdims=True))
    n = g / (g.mean(axis=-1, keepdims=True) + EPS)
    return x + gamma * (x * n) + beta


class Block(nn.Module):
  grn: bool
  layer_scale: bool
  kernel: int = 7

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    c, k = x.shape[-1], self.kernel
    capture.put(out, "in", x)
    y = nn.Conv(c, (k, k), padding=[(k // 2, k // 2)] * 2, feature_group_count=c,
                name="conv_dw")(x)
    y = capture.put(out, "dwconv", y)
    y = capture.put(out, "norm", _norm("norm")(y))
    y = nn.Dense(4 * c, name="fc1")(y)
    y = layers.get_gelu("exact")(y)
    if self.grn:
      y = GRN(name="grn")(y)
    y = capture.put(out, "mlp/hidden", y)
    y = nn.Dense(c, name="fc2")(y)
    if self.layer_scale:
      y = y * layers.param(self, "gamma", nn.initializers.constant(1e-6), (c,), x.dtype)
    capture.put(out, "mlp/out", y)
    return capture.put(out, "out", x + y)


class ConvNeXt(anatomy.FeatureMaps, anatomy.Stages, anatomy.NoAttention, anatomy.ParamsAsRead,
               nn.Module):
  """ConvNeXt-{T,S,B,L} (v1: layer scale; v2: GRN) or any depths and widths."""
  num_classes: int | None = 1000
  depths: Sequence[int] = (3, 3, 27, 3)
  widths: Sequence[int] = (128, 256, 512, 1024)
  patch_size: int = 4
  kernel_size: int = 7  # of the depthwise convs
  grn: bool = False  # ConvNeXt-V2
  layer_scale: bool = True  # v1's gamma per block
  image_size: int | Sequence[int] = 224  # a default for callers; any size runs
  head_eps: float = EPS  # the pooled features' LayerNorm

  family = "convnext"
  # Anatomy (models/anatomy.py): residual blocks, no tokens, no attention.
  sublayers = ("block",)
  stem = "stem"
  default_policy = "bicubic_crop0.875_imagenet"  # timm's evaluation: every ConvNeXt is timm's
  layer_presets = LAYER_PRESETS

  def residuals(self) -> list[anatomy.Residual]:
    return [anatomy.Residual(k, "block", f"{k}/in", f"{k}/mlp/out", f"{k}/out")
            for k in self.block_names()]

  @nn.compact
  def __call__(self, images: jax.Array, *,
               capture: capturing.Capture | str | Sequence[str] | None = None,
               train: bool = False) -> tuple[jax.Array, dict]:
    del train
    sizes.check_image(images, None, "ConvNeXt")  # any size runs
    if len(self.depths) != len(self.widths):
      raise ValueError(f"depths {tuple(self.depths)} and widths {tuple(self.widths)} differ in "
                       "length: one width per stage.")
    capture = capturing.Capture.of(capture)
    out: dict = {}
    p = self.patch_size
    x = nn.Conv(self.widths[0], (p, p), strides=(p, p), padding="VALID", name="stem_conv")(images)
    x = capture.put(out, "stem", _norm("stem_norm")(x))
    for s, (depth, width) in enumerate(zip(self.depths, self.widths)):
      if s:
        x = _norm(f"stage{s}_downsample_norm")(x)
        x = nn.Conv(width, (2, 2), strides=(2, 2), padding="VALID",
                    name=f"stage{s}_downsample_conv")(x)
        x = capture.put(out, f"stage{s}/downsample", x)
      for b in range(depth):
        x = Block(self.grn, self.layer_scale, self.kernel_size, name=f"stage{s}_block{b:02d}")(
            x, capture.child(f"stage{s}/block{b:02d}"), out)
    x = capture.put(out, "pre_logits", nn.LayerNorm(epsilon=self.head_eps, name="head_norm")(
        x.mean(axis=(1, 2))))
    if self.num_classes:
      x = capture.put(out, "logits", nn.Dense(self.num_classes, name="head")(x))
    return x, out


def adapt(cfg: dict, r: Reading, native: int | None, path: str) -> None:
  """Every reader's adaptation: any resolution runs (a conv net), but the input
  must tile into the strides."""
  del r, native
  size, stride = cfg.get("image_size") or 224, cfg["patch_size"] * 2 ** (len(cfg["depths"]) - 1)
  if any(s % stride for s in np.atleast_1d(size)):
    raise ValueError(f"{path}: resolution {size} is not a multiple of {stride}, the stem's "
                     "patch times the downsamplings.")
