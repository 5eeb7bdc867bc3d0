"""Vision Transformer with the parameter tree of the upstream Flax models.

Parameter names follow big_vision's linen layout (`embedding`, top-level
`pos_embedding` without a cls row, `cls`, `Transformer/encoderblock_i/...`,
`MAPHead_0`, `pre_logits`, `head`); `google.py` maps the original
vision_transformer files (pre-linen names, cls row inside the position
embedding) onto it exactly: cls + pe[0] equals big_vision's folded cls.
Position embeddings are learned (`posemb="learn"`), big_vision's fixed 2-D
sin-cos (`"sincos2d"`, computed for the grid in use) or none (`"none"`), and
rotary embeddings of the queries and keys may add to them (`rope`: DINOv3's,
EVA-02's or the Perception Encoder's, computed for the grid in use). Pooling: `token` (cls),
`gap`, `map` (big_vision's attention pooling), `0` (big_vision's first
patch token, no cls) or `token_gap` (the class token beside the patch tokens'
mean: transformers' DINOv2 classifiers).

Representation points (`out` names), per block `blockNN/`:
  in, ln1, attn/weights (B,H,Q,K), attn/heads (B,T,H,hd, before the output
  projection), attn/out, attn/residual, ln2, mlp/hidden, mlp/out, out
and around them: stem (B,h,w,D), embedded (B,T,D), encoded, head_input,
pre_logits, logits. `T` counts the cls token first when pool == "token".
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.models import anatomy
from vitcnn_jax.models import blocks
from vitcnn_jax.models import capturing
from vitcnn_jax.models import layers
from vitcnn_jax.models import sizes

POOLS = ("token", "gap", "map", "0", "token_gap")
POSEMBS = ("learn", "sincos2d", "none")
ROPES = ("", "dinov3", "eva02", "pe")
ATTN = "MultiHeadDotProductAttention_0"  # the attention's sub-tree in a block and the MAP head

# (width, depth, mlp_dim, num_heads); Ti/S from the AugReg paper, B/L/H from ViT.
VARIANTS: dict[str, tuple[int, int, int, int]] = {
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "H": (1280, 32, 5120, 16),
}


# Capture presets: about six points per block, as in the paper's figures (Section 4,
# Fig 1 axes); block outputs; every point.
LAYER_PRESETS = {
    "paper": ("block*/ln1", "block*/attn/out", "block*/ln2", "block*/mlp/hidden", "block*/mlp/out",
              "block*/out"),
    "blocks": ("block*/out",),
    "all": ("**",),
    "attention": ("block*/attn/weights",),  # every block's attention weights
}


def decode_variant(variant: str) -> dict:
  """'B/16' -> the width, depth, mlp_dim, num_heads and patch_size fields."""
  name, _, patch = variant.partition("/")
  if name not in VARIANTS or (patch and not patch.isdigit()):
    raise ValueError(
        f"Unknown ViT variant {variant!r}; expected one of {sorted(VARIANTS)} "
        "with an optional '/<patch>' such as 'B/16'.")
  width, depth, mlp_dim, heads = VARIANTS[name]
  cfg = dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=heads)
  if patch:
    cfg["patch_size"] = int(patch)
  return cfg


def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.) -> np.ndarray:
  """big_vision's fixed 2-D embedding (MoCo v3): [sin x, cos x, sin y, cos y] with
  width/4 frequencies temperature**(-i / (width/4 - 1)); x the column, y the row."""
  if width % 4:
    raise ValueError(f"posemb='sincos2d' needs a width divisible by 4, got {width}.")
  quarter = width // 4
  omega = 1.0 / temperature ** (np.arange(quarter) / (quarter - 1))
  y, x = np.mgrid[:h, :w]
  x = x.reshape(-1, 1) * omega
  y = y.reshape(-1, 1) * omega
  pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
  return pe[None].astype(np.float32)


def rotary(kind: str, h: int, w: int, head_dim: int, theta: float, ref: int = 0,
           offset: float = 0.) -> tuple[np.ndarray, np.ndarray]:
  """(cos, sin), each (h*w, head_dim): the rotary embedding of an h x w grid, for
  rotations of dims i and i + head_dim/2 together (`_rotate_half`). head_dim/4
  frequencies per axis, the first axis's in the first quarter (and third):
  dinov3  each patch's centre in [-1, 1] per axis; angles 2 pi coord / theta**(4j/hd);
          rows first.
  eva02   the patch index scaled to a `ref`-wide grid, (i + offset) / S * ref;
          angles coord * theta**(-j/(hd/4)); rows first.
  pe      as eva02, columns first (the Perception Encoder: offset 1 but in its
          gigantic model).
  EVA-02's and PE's own rotations pair dims 2i and 2i+1: their readers reorder
  each head's query and key dims (evens, then odds) to this, which leaves every
  dot product of a query and a key as it was."""
  if head_dim % 4:
    raise ValueError(f"rope={kind!r} needs a head width divisible by 4, got {head_dim}.")
  j = np.arange(head_dim // 4)
  y, x = (a.reshape(-1).astype(np.float64) for a in np.mgrid[:h, :w])
  if kind == "dinov3":
    coords = np.stack([(y + .5) / h, (x + .5) / w], axis=1) * 2 - 1
    angles = 2 * np.pi * coords[:, :, None] / theta ** (4 * j / head_dim)
  else:
    order = (0, 1) if kind == "eva02" else (1, 0)
    coords = np.stack([(y + offset) / h * ref, (x + offset) / w * ref], axis=1)[:, order]
    angles = coords[:, :, None] * theta ** (-j / (head_dim // 4))
  angles = angles.reshape(h * w, -1)
  angles = np.concatenate([angles, angles], axis=1)
  return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rotate_half(x: jax.Array) -> jax.Array:
  half = x.shape[-1] // 2
  return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rotated(x: jax.Array, rope: tuple[np.ndarray, np.ndarray]) -> jax.Array:
  """(B, H, T, hd) with its last len(rope[0]) tokens (the patches) rotated; the
  prefix tokens before them are left as they are."""
  cos, sin = (jnp.asarray(r, x.dtype) for r in rope)
  prefix, patches = x[:, :, :x.shape[2] - cos.shape[0]], x[:, :, x.shape[2] - cos.shape[0]:]
  return jnp.concatenate([prefix, patches * cos + _rotate_half(patches) * sin], axis=2)


class Attention(nn.Module):
  """Multi-head dot-product attention, exposing weights and per-head outputs.

  Same parameters as flax.linen.MultiHeadDotProductAttention, and its arithmetic
  (query scaled by 1/sqrt(head_dim) before the product, float32 softmax) but for
  where the softmax is normalised: after the product with the values (`layers.attend`);
  `norm_eps`: a LayerNorm (`norm`) on the heads' joined outputs before the output
  projection (EVA-02's CLIP towers).
  """
  num_heads: int
  norm_eps: float | None = None

  @nn.compact
  def __call__(self, q_in: jax.Array, kv_in: jax.Array, capture: capturing.Capture, out: dict,
               rope: tuple[np.ndarray, np.ndarray] | None = None) -> jax.Array:
    d = q_in.shape[-1]
    if d % self.num_heads:
      raise ValueError(f"width {d} is not divisible by num_heads {self.num_heads}.")
    hd = d // self.num_heads

    def proj(name: str, x: jax.Array) -> jax.Array:
      return nn.DenseGeneral((self.num_heads, hd), name=name,
                             kernel_init=nn.initializers.xavier_uniform())(x)

    # Heads first, (B, H, T, hd), so that both products are plain batched matmuls:
    # XLA:CPU ran einsums over the (B, T, H, hd) layout at half the speed (ViT-B/16,
    # batch 32: 144 vs 80 ms a block, a quarter of the whole forward before).
    by_head = lambda x: x.transpose(0, 2, 1, 3)
    q = by_head(proj("query", q_in) / jnp.sqrt(hd).astype(q_in.dtype))
    k = by_head(proj("key", kv_in))
    v = by_head(proj("value", kv_in))
    if rope is not None:  # linear in q: the scale above commutes with it
      q, k = _rotated(q, rope), _rotated(k, rope)
    heads = capture.put(out, "heads", by_head(layers.attend(q @ k.swapaxes(-1, -2), v, capture, out)))
    if self.norm_eps is not None:
      joined = heads.reshape(*heads.shape[:-2], d)
      heads = nn.LayerNorm(epsilon=self.norm_eps, name="norm")(joined).reshape(heads.shape)
    return nn.DenseGeneral(d, axis=(-2, -1), name="out",
                           kernel_init=nn.initializers.xavier_uniform())(heads)


@dataclasses.dataclass(frozen=True)
class BlockOptions:
  """What the upstreams' blocks differ in (Google's files: the defaults)."""
  gelu: str = "tanh"
  mlp: str = "gelu"  # or "swiglu" (packed, DINOv2-g)
  ln_eps: float = 1e-6  # CLIP: 1e-5
  layer_scale: bool = False  # a learned per-channel scale on each branch (DeiT III, DINOv2)
  mlp_norm: bool = False  # a LayerNorm on the MLP's hidden features (EVA-02 B/L)
  attn_norm: bool = False  # a LayerNorm on the heads' joined outputs (EVA-02's CLIP towers)

  @property
  def mlp_norm_eps(self) -> float | None:
    return self.ln_eps if self.mlp_norm else None


class EncoderBlock(nn.Module):
  """Pre-LN transformer block; `skip=False` drops both residual connections, a
  traced 0/1 `skip` gates them (`ViT.skip_gates`)."""
  mlp_dim: int
  num_heads: int
  options: BlockOptions = BlockOptions()
  skip: bool | jax.Array = True

  def _residual(self, x: jax.Array, y: jax.Array) -> jax.Array:
    if isinstance(self.skip, bool):
      return x + y if self.skip else y
    return x * self.skip.astype(x.dtype) + y  # x * 1 + y = x + y, x * 0 + y = y (finite x)

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict,
               rope: tuple[np.ndarray, np.ndarray] | None = None) -> jax.Array:
    o = self.options
    capture.put(out, "in", x)
    y = capture.put(out, "ln1", layers.layer_norm("LayerNorm_0", o.ln_eps)(x))
    y = Attention(self.num_heads, o.ln_eps if o.attn_norm else None,
                  name=ATTN)(y, y, capture.child("attn"), out, rope)
    if o.layer_scale:
      y = y * layers.param(self, "ls1", nn.initializers.ones, (x.shape[-1],), x.dtype)
    capture.put(out, "attn/out", y)
    x = capture.put(out, "attn/residual", self._residual(x, y))
    y = capture.put(out, "ln2", layers.layer_norm("LayerNorm_1", o.ln_eps)(x))
    y = layers.MlpBlock(self.mlp_dim, o.gelu, o.mlp, o.mlp_norm_eps, name="MlpBlock_0")(
        y, capture.child("mlp"), out)
    if o.layer_scale:
      y = y * layers.param(self, "ls2", nn.initializers.ones, (x.shape[-1],), x.dtype)
    capture.put(out, "mlp/out", y)
    return capture.put(out, "out", self._residual(x, y))


class Encoder(nn.Module):
  depth: int
  mlp_dim: int
  num_heads: int
  options: BlockOptions = BlockOptions()
  no_skip: tuple[int, ...] = ()
  final_norm: bool = True  # False: the pooled features are normed instead (`fc_norm`)
  skip_gates: jax.Array | None = None  # see ViT
  scan: bool = True  # identical blocks as one scan (`blocks.apply_blocks`)

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict,
               rope: tuple[np.ndarray, np.ndarray] | None = None) -> jax.Array:
    captures = [capture.child(f"block{i:02d}") for i in range(self.depth)]
    names = [f"encoderblock_{i}" for i in range(self.depth)]
    if self.no_skip or self.skip_gates is not None:  # blocks that differ in their residuals
      for i in range(self.depth):
        x = EncoderBlock(self.mlp_dim, self.num_heads, self.options,
                         skip=i not in self.no_skip if self.skip_gates is None else self.skip_gates[i],
                         name=names[i])(x, captures[i], out, rope)
    else:
      x = blocks.apply_blocks(self, functools.partial(EncoderBlock, self.mlp_dim, self.num_heads,
                                                      self.options), names, x, captures, out, rope,
                              scan=self.scan)
    return layers.layer_norm("encoder_norm", self.options.ln_eps)(x) if self.final_norm else x


class MAPHead(nn.Module):
  """big_vision's multi-head attention pooling: one learned probe query (timm's
  AttentionPoolLatent computes the same)."""
  mlp_dim: int
  num_heads: int
  options: BlockOptions = BlockOptions()

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    n, _, d = x.shape
    probe = layers.param(self, "probe", nn.initializers.xavier_uniform(), (1, 1, d), x.dtype)
    probe = jnp.tile(probe, (n, 1, 1))
    x = Attention(self.num_heads, name=ATTN)(
        probe, x, capture.child("attn"), out)
    y = layers.layer_norm("LayerNorm_0", self.options.ln_eps)(x)
    x = x + layers.MlpBlock(self.mlp_dim, self.options.gelu, self.options.mlp, name="MlpBlock_0")(
        y, capture.child("mlp"), out)
    return x[:, 0]


class ViT(anatomy.PatchTokens, anatomy.ParamsAsRead, nn.Module):
  """ViT-{Ti,S,B,L,H}/p at any resolution; see the module docstring for names."""
  num_classes: int | None = 1000
  patch_size: int | Sequence[int] = 16
  image_size: int | Sequence[int] = 224
  width: int = 768
  depth: int = 12
  mlp_dim: int = 3072
  num_heads: int = 12
  pool: str = "token"
  posemb: str = "learn"
  representation_size: int | None = None
  gelu: str = "tanh"  # "exact": PyTorch's (timm files); "quick": OpenAI CLIP's
  no_skip: tuple[int, ...] = ()  # blocks trained without residual connections
  # Training only: (depth,) 0/1 gates of the blocks' residual connections, traced,
  # so that the copies of a skip ablation (Fig 8) share one compiled step.
  skip_gates: jax.Array | None = None
  # Options of later ViTs (timm-layout files); the defaults are Google's.
  class_token: bool | None = None  # None: with `token` pooling
  num_registers: int = 0  # register tokens after the class token (DINOv2 with registers)
  distilled: bool = False  # DeiT's distillation token after the class token, its own head
  pre_norm: bool = False  # a LayerNorm before the blocks (CLIP)
  fc_norm: bool = False  # the pooled features normed, not the tokens (MAE-style heads)
  mlp: str = "gelu"  # or "swiglu"
  ln_eps: float = 1e-6
  layer_scale: bool = False
  patch_bias: bool = True
  head_bias: bool = True
  rope: str = ""  # rotary embeddings of the patch tokens' queries and keys (`rotary`)
  rope_theta: float = 100.0  # their base period (DINOv3 100, EVA-02 and PE 1e4)
  rope_ref: int = 0  # EVA-02's and PE's reference grid (ref_feat_shape)
  rope_offset: float = 0.  # and their patch index's offset (PE: 1)
  mlp_norm: bool = False  # a LayerNorm on the MLP's hidden features (EVA-02 B/L's scale_mlp)
  attn_norm: bool = False  # a LayerNorm on the heads' joined outputs (EVA-02 CLIP's scale_attn_inner)
  map_heads: int = 0  # the attention pool's heads (0: num_heads; PE: 8)
  map_prefix: bool = False  # the attention pool reads the prefix tokens too (PE)

  family = "vit"
  # Anatomy (models/anatomy.py).
  RESIDUALS = (("attn", "in", "attn/out", "attn/residual"), ("mlp", "attn/residual", "mlp/out", "out"))
  stem = None
  default_policy = "resize"
  layer_presets = LAYER_PRESETS

  @property
  def num_blocks(self) -> int:
    return self.depth

  @property
  def has_class_token(self) -> bool:
    return self.pool == "token" if self.class_token is None else self.class_token

  @property
  def prefix_tokens(self) -> tuple[str, ...]:
    """Tokens before the spatial ones: class, distillation, then register tokens."""
    return (("cls",) * self.has_class_token + ("dist",) * self.distilled
            + ("reg",) * self.num_registers)

  @property
  def options(self) -> BlockOptions:
    return BlockOptions(self.gelu, self.mlp, self.ln_eps, self.layer_scale, self.mlp_norm,
                        self.attn_norm)

  @property
  def num_prefix_tokens(self) -> int:
    return len(self.prefix_tokens)

  def attention(self) -> list[anatomy.AttentionLayer]:
    centres = anatomy.grid_centres(self.grid, self.token_pixels)[None]  # one window: every token
    return [anatomy.AttentionLayer(b, f"block{b:02d}/attn/weights", f"block{b:02d}/attn/heads",
                                   self.num_heads, centres, self.num_prefix_tokens)
            for b in range(self.depth)]

  def head_projection(self, params, block: int) -> jax.Array:
    if self.attn_norm:
      raise ValueError("this ViT norms its heads' joined outputs before projecting them (EVA-02's "
                       "CLIP towers): a head's own contribution to the output is not defined.")
    return params["Transformer"][f"encoderblock_{block}"][ATTN]["out"]["kernel"]

  @nn.compact
  def __call__(self, images: jax.Array, *,
               capture: capturing.Capture | str | Sequence[str] | None = None,
               train: bool = False) -> tuple[jax.Array, dict]:
    # No dropout: these models are for analysis and light training; a model being
    # trained applies its blocks one by one (`blocks.apply_blocks`).
    if self.pool not in POOLS:
      raise ValueError(f"pool={self.pool!r} is not one of {POOLS}.")
    if self.posemb not in POSEMBS:
      raise ValueError(f"posemb={self.posemb!r} is not one of {POSEMBS}.")
    if self.rope not in ROPES:
      raise ValueError(f"rope={self.rope!r} is not one of {ROPES}.")
    if self.pool in ("token", "token_gap") and not self.has_class_token:
      raise ValueError(f"pool={self.pool!r} reads the class token, and class_token=False.")
    if self.distilled and (self.pool != "token" or self.representation_size or self.fc_norm):
      raise ValueError("distilled=True (DeiT) reads the class and distillation tokens: "
                       "pool='token', without pre_logits or fc_norm.")
    capture = capturing.Capture.of(capture)
    sizes.patch_grid(self.patch_size, self.image_size)  # validates the sizes
    if self.posemb == "learn":
      sizes.check_image(images, sizes.to_pair(self.image_size), "ViT")
    else:  # the embedding is computed for the grid of the images given, as upstream does
      sizes.check_image(images, None, "ViT")
      sizes.patch_grid(self.patch_size, images.shape[1:3])
    out: dict = {}
    p = sizes.to_pair(self.patch_size)
    x = nn.Conv(self.width, p, strides=p, padding="VALID", use_bias=self.patch_bias,
                name="embedding")(images)
    capture.put(out, "stem", x)
    n, h, w, d = x.shape
    x = x.reshape(n, h * w, d)
    if self.posemb == "learn":
      x = x + layers.param(self, "pos_embedding", nn.initializers.normal(1 / np.sqrt(d)),
                           (1, h * w, d), x.dtype)  # prefix tokens hold their own
    elif self.posemb == "sincos2d":
      x = x + jnp.asarray(posemb_sincos_2d(h, w, d), x.dtype)
    rope = (rotary(self.rope, h, w, d // self.num_heads, self.rope_theta, self.rope_ref,
                   self.rope_offset) if self.rope else None)
    prefix = []
    if self.has_class_token:
      prefix.append(layers.param(self, "cls", nn.initializers.zeros, (1, 1, d), x.dtype))
    if self.distilled:
      prefix.append(layers.param(self, "dist", nn.initializers.zeros, (1, 1, d), x.dtype))
    if self.num_registers:
      prefix.append(layers.param(self, "reg", nn.initializers.zeros, (1, self.num_registers, d), x.dtype))
    if prefix:
      x = jnp.concatenate([jnp.tile(t, (n, 1, 1)) for t in prefix] + [x], axis=1)
    if self.pre_norm:
      x = layers.layer_norm("norm_pre", self.ln_eps)(x)
    capture.put(out, "embedded", x)

    x = Encoder(self.depth, self.mlp_dim, self.num_heads, self.options, tuple(self.no_skip),
                final_norm=not self.fc_norm, skip_gates=self.skip_gates, scan=not train,
                name="Transformer")(
                    x, capture, out, rope)
    capture.put(out, "encoded", x)
    return self._head(x, capture, out), out

  def _head(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    """Pooling, fc_norm, pre_logits and the classifier; DeiT's distilled models
    average two heads, on the class and the distillation token (as timm)."""
    if self.distilled:
      capture.put(out, "head_input", (x[:, 0] + x[:, 1]) / 2)
      capture.put(out, "pre_logits", (x[:, 0] + x[:, 1]) / 2)
      if not self.num_classes:
        return (x[:, 0] + x[:, 1]) / 2
      x = (layers.dense_head(self.num_classes, use_bias=self.head_bias)(x[:, 0]) + layers.dense_head(
          self.num_classes, "head_dist", self.head_bias)(x[:, 1])) / 2
      return capture.put(out, "logits", x)
    x = self._pool(x, capture, out)
    if self.fc_norm:
      x = layers.layer_norm("fc_norm", self.ln_eps)(x)
    capture.put(out, "head_input", x)
    if self.representation_size:
      x = jnp.tanh(nn.Dense(self.representation_size, name="pre_logits")(x))
    capture.put(out, "pre_logits", x)
    if self.num_classes:
      x = layers.dense_head(self.num_classes, use_bias=self.head_bias)(x)
      capture.put(out, "logits", x)
    return x

  def _pool(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    """The class token (`token`), the first token (`0`), the spatial tokens' mean
    (`gap`), both side by side (`token_gap`), or attention pooling over them (`map`;
    over every token with `map_prefix`)."""
    if self.pool in ("token", "0"):
      return x[:, 0]
    spatial = x[:, self.num_prefix_tokens:]
    if self.pool == "gap":
      return spatial.mean(axis=1)
    if self.pool == "token_gap":
      return jnp.concatenate([x[:, 0], spatial.mean(axis=1)], axis=-1)
    return MAPHead(self.mlp_dim, self.map_heads or self.num_heads, self.options, name="MAPHead_0")(
        x if self.map_prefix else spatial, capture.child("map"), out)
