"""MLP-Mixer with the parameter tree of the vision_transformer Mixer files.

Parameters: stem, MixerBlock_i/{LayerNorm_0, token_mixing/Dense_{0,1},
LayerNorm_1, channel_mixing/Dense_{0,1}}, pre_head_layer_norm, head.

Representation points (`out` names), per block `blockNN/`:
  in, ln1, token_mlp/hidden (B,D,tokens_mlp_dim), token_mlp/out (B,T,D),
  token_mlp/residual, ln2, channel_mlp/hidden, channel_mlp/out, out
and stem (B,h,w,D), encoded, pre_logits, logits.
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

# Capture presets (as ViT's): about six points per block; block outputs; every point.
LAYER_PRESETS = {
    "paper": ("block*/ln1", "block*/token_mlp/out", "block*/ln2", "block*/channel_mlp/hidden",
              "block*/channel_mlp/out", "block*/out"),
    "blocks": ("block*/out",),
    "all": ("**",),
}


class MixerBlock(nn.Module):
  tokens_mlp_dim: int
  channels_mlp_dim: int
  gelu: str = "tanh"

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    capture.put(out, "in", x)
    y = capture.put(out, "ln1", layers.layer_norm("LayerNorm_0")(x))
    y = layers.MlpBlock(self.tokens_mlp_dim, self.gelu, name="token_mixing")(
        jnp.swapaxes(y, 1, 2), capture.child("token_mlp"), out)
    y = capture.put(out, "token_mlp/out", jnp.swapaxes(y, 1, 2))
    x = capture.put(out, "token_mlp/residual", x + y)
    y = capture.put(out, "ln2", layers.layer_norm("LayerNorm_1")(x))
    y = layers.MlpBlock(self.channels_mlp_dim, self.gelu, name="channel_mixing")(
        y, capture.child("channel_mlp"), out)
    capture.put(out, "channel_mlp/out", y)
    return capture.put(out, "out", x + y)


class Mixer(anatomy.PatchTokens, anatomy.NoAttention, anatomy.ParamsAsRead, nn.Module):
  num_classes: int | None = 1000
  patch_size: int | Sequence[int] = 16
  image_size: int | Sequence[int] = 224
  hidden_dim: int = 768
  num_blocks: int = 12
  tokens_mlp_dim: int = 384
  channels_mlp_dim: int = 3072
  gelu: str = "tanh"

  family = "mixer"
  # Anatomy (models/anatomy.py).
  RESIDUALS = (("token", "in", "token_mlp/out", "token_mlp/residual"),
               ("channel", "token_mlp/residual", "channel_mlp/out", "out"))
  stem = None
  prefix_tokens = ()
  num_prefix_tokens = 0
  default_policy = "resize"
  layer_presets = LAYER_PRESETS

  @nn.compact
  def __call__(self, images: jax.Array, *,
               capture: capturing.Capture | str | Sequence[str] | None = None,
               train: bool = False) -> tuple[jax.Array, dict]:
    capture = capturing.Capture.of(capture)
    sizes.check_image(images, sizes.to_pair(self.image_size), "Mixer")
    out: dict = {}
    p = sizes.to_pair(self.patch_size)
    x = nn.Conv(self.hidden_dim, p, strides=p, padding="VALID", name="stem")(images)
    capture.put(out, "stem", x)
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    x = blocks.apply_blocks(
        self, functools.partial(MixerBlock, self.tokens_mlp_dim, self.channels_mlp_dim, self.gelu),
        [f"MixerBlock_{i}" for i in range(self.num_blocks)], x,
        [capture.child(f"block{i:02d}") for i in range(self.num_blocks)], out, scan=not train)
    x = capture.put(out, "encoded", layers.layer_norm("pre_head_layer_norm")(x))
    x = capture.put(out, "pre_logits", x.mean(axis=1))
    if self.num_classes:
      x = capture.put(out, "logits", layers.dense_head(self.num_classes)(x))
    return x, out
