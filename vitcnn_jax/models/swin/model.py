"""Swin Transformer (v1): windowed self-attention with shifted windows and a
relative position bias, over feature maps that halve at each stage, the
hierarchical ViT between the paper's ViT and ResNet.

Stem: a patch x patch / patch conv, then LayerNorm over channels. Stages 1..n
start with patch merging: each 2x2 neighbourhood's four features concatenated
(offsets (0,0), (1,0), (0,1), (1,1): row, column), LayerNorm, a bias-free Dense
to twice the width. Block (pre-norm, two residuals): LayerNorm -> the map cut
into window x window windows (every second block first rolled up and left by
window // 2, with the wrapped-around regions kept apart by a -100 attention mask)
-> multi-head attention within each window, a learned bias per head and relative
offset added to the logits -> windows put back (and rolled back) -> + input;
LayerNorm -> MLP (exact GELU) -> + input. A map the window's size is one window,
unshifted. Head: LayerNorm, the tokens' mean, Dense. LayerNorm eps 1e-5
(torch's default, timm and transformers alike).

Representation points (`out` names), per block `stageS/blockBB/` on (B, H, W, C)
maps: in, ln1, attn/weights (B, windows, heads, N, N), attn/heads (B, windows * N,
heads, hd: before the output projection), attn/out, attn/residual, ln2,
mlp/hidden, mlp/out, out; around them stem, stageS/merge, pre_logits, logits.
`attention()` places every window's tokens on the image (the roll undone), so
attention distances are in image pixels.
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

LAYER_PRESETS = {
    "paper": ("stem", "stage*/block*/ln1", "stage*/block*/attn/out", "stage*/block*/ln2",
              "stage*/block*/mlp/hidden", "stage*/block*/mlp/out", "stage*/block*/out"),
    "blocks": ("stage*/block*/out",),
    "all": ("**",),
    "attention": ("stage*/block*/attn/weights",),  # every block's attention weights
}
MASKED = -100.0  # the logit bias between tokens of different regions in a shifted window


def window_geometry(size: tuple[int, int], window: int, shifted: bool) -> tuple[int, int]:
  """(window, shift) at a map of `size`: a map the window's size is one window, not
  shifted (as both upstreams: the published models' last stage). A smaller map is
  refused: there timm resizes the bias table and transformers fails."""
  if min(size) < window:
    raise ValueError(f"Swin: a {size[0]}x{size[1]} map is smaller than the {window}x{window} "
                     "window; use an input size whose last stage's map is at least the window.")
  return window, window // 2 if shifted and min(size) > window else 0


def relative_index(window: int) -> np.ndarray:
  """(N, N) index into the ((2w-1)**2, heads) bias table of each pair of a window's
  tokens (row-major): their row offset, then column offset, each shifted to >= 0."""
  ys, xs = np.divmod(np.arange(window * window), window)
  dy = ys[:, None] - ys[None, :] + window - 1
  dx = xs[:, None] - xs[None, :] + window - 1
  return dy * (2 * window - 1) + dx


def check_tiles(size: tuple[int, int], window: int) -> None:
  """Refuses a map that windows do not tile (neither upstream's padding is ours)."""
  if size[0] % window or size[1] % window:
    raise ValueError(f"Swin: a {size[0]}x{size[1]} map does not tile into {window}x{window} windows; "
                     "use an input size whose maps at every stage are multiples of the window.")


def to_windows(x: np.ndarray | jax.Array, window: int) -> np.ndarray | jax.Array:
  """(..., H, W, C) -> (..., windows, window * window, C): windows row-major, and
  tokens row-major within each."""
  *lead, h, w, c = x.shape
  x = x.reshape(*lead, h // window, window, w // window, window, c)
  return x.swapaxes(-4, -3).reshape(*lead, -1, window * window, c)


def regions(size: tuple[int, int], window: int, shift: int) -> np.ndarray:
  """(windows, N) the region of the rolled map each window's token lies in: the
  roll brings the regions from opposite edges together, and they stay apart."""
  h, w = size
  region = np.zeros((h, w, 1), np.int64)
  bounds = lambda n: ((0, n - window), (n - window, n - shift), (n - shift, n))
  for i, (y0, y1) in enumerate(bounds(h)):
    for j, (x0, x1) in enumerate(bounds(w)):
      region[y0:y1, x0:x1] = 3 * i + j
  return to_windows(region, window)[..., 0]


def shift_mask(size: tuple[int, int], window: int, shift: int) -> np.ndarray:
  """(windows, N, N): 0 between tokens of one region of the rolled map, MASKED
  between tokens that the roll brought together from opposite edges."""
  r = regions(size, window, shift)
  return np.where(r[:, :, None] == r[:, None, :], 0., MASKED).astype(np.float32)


def window_layout(size: tuple[int, int], window: int, shift: int, pixels: int
                  ) -> tuple[np.ndarray, np.ndarray | None]:
  """Where a block's window tokens lie on the image, the roll undone: (windows, N, 2)
  pixel centres of tokens `pixels` in size, and (windows, N, N) the pairs its mask
  lets attend (None unshifted)."""
  check_tiles(size, window)
  rows, cols = np.meshgrid(np.arange(size[0]), np.arange(size[1]), indexing="ij")
  at = np.stack([np.roll(rows, -shift, 0), np.roll(cols, -shift, 1)], axis=-1)  # as the forward rolls
  centres = (to_windows(at, window) + 0.5) * pixels
  if not shift:
    return centres, None
  r = regions(size, window, shift)
  return centres, r[:, :, None] == r[:, None, :]


class WindowAttention(nn.Module):
  """Multi-head attention within windows of a (B, H, W, C) map, shifted or not."""
  num_heads: int
  window: int
  shift: int

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    b, h, w, c = x.shape
    ws, s, heads = self.window, self.shift, self.num_heads
    check_tiles((h, w), ws)
    if s:
      x = jnp.roll(x, (-s, -s), axis=(1, 2))
    n = ws * ws
    win = to_windows(x, ws)
    hd = c // heads
    proj = lambda name: nn.Dense(c, name=name)(win).reshape(b, -1, n, heads, hd).transpose(0, 1, 3, 2, 4)
    q, k, v = proj("query") / jnp.sqrt(hd).astype(x.dtype), proj("key"), proj("value")
    table = layers.param(self, "rel_bias", nn.initializers.truncated_normal(0.02), ((2 * ws - 1) ** 2, heads),
                         x.dtype)
    logits = q @ k.swapaxes(-1, -2) + table[relative_index(ws)].transpose(2, 0, 1)
    if s:
      logits = logits + jnp.asarray(shift_mask((h, w), ws, s))[None, :, None]
    y = capture.put(out, "heads", layers.attend(logits, v, capture, out).transpose(0, 1, 3, 2, 4)
                    .reshape(b, -1, heads, hd))
    y = nn.Dense(c, name="out")(y.reshape(b, -1, n, c))
    y = y.reshape(b, h // ws, w // ws, ws, ws, c).swapaxes(2, 3).reshape(b, h, w, c)
    return jnp.roll(y, (s, s), axis=(1, 2)) if s else y


class Block(nn.Module):
  num_heads: int
  window: int
  shifted: bool
  mlp_dim: int
  eps: float

  @nn.compact
  def __call__(self, x: jax.Array, capture: capturing.Capture, out: dict) -> jax.Array:
    ws, s = window_geometry(x.shape[1:3], self.window, self.shifted)
    capture.put(out, "in", x)
    y = capture.put(out, "ln1", nn.LayerNorm(epsilon=self.eps, name="LayerNorm_0")(x))
    y = capture.put(out, "attn/out", WindowAttention(self.num_heads, ws, s, name="attn")(
        y, capture.child("attn"), out))
    x = capture.put(out, "attn/residual", x + y)
    y = capture.put(out, "ln2", nn.LayerNorm(epsilon=self.eps, name="LayerNorm_1")(x))
    y = capture.put(out, "mlp/out", layers.MlpBlock(self.mlp_dim, "exact", name="MlpBlock_0")(
        y, capture.child("mlp"), out))
    return capture.put(out, "out", x + y)


def merge_patches(x: jax.Array) -> jax.Array:
  """(B, H, W, C) -> (B, H/2, W/2, 4C): each 2x2 neighbourhood's features side by
  side, offsets (0,0), (1,0), (0,1), (1,1) as (row, column)."""
  return jnp.concatenate([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)


class Swin(anatomy.FeatureMaps, anatomy.Stages, anatomy.ParamsAsRead, nn.Module):
  """Swin-{T,S,B,L}, or any depths, heads and window."""
  num_classes: int | None = 1000
  patch_size: int = 4
  embed_dim: int = 96
  depths: Sequence[int] = (2, 2, 6, 2)
  heads: Sequence[int] = (3, 6, 12, 24)
  window: int = 7
  mlp_ratio: float = 4.0
  ln_eps: float = 1e-5
  image_size: int | Sequence[int] = 224

  family = "swin"
  sublayers = ("attn", "mlp")
  stem = "stem"
  default_policy = "bicubic_crop0.9_imagenet"  # timm's Swin evaluation
  layer_presets = LAYER_PRESETS

  def residuals(self) -> list[anatomy.Residual]:
    return [anatomy.Residual(k, sub, f"{k}/{z}", f"{k}/{f}", f"{k}/{o}") for k in self.block_names()
            for sub, z, f, o in (("attn", "in", "attn/out", "attn/residual"),
                                 ("mlp", "attn/residual", "mlp/out", "out"))]

  def attention(self) -> list[anatomy.AttentionLayer]:
    found = []
    (rows, cols), p = sizes.to_pair(self.image_size), self.patch_size  # as the patch conv: floor
    rows, cols = rows // p, cols // p
    for s, (heads, depth) in enumerate(zip(self.heads, self.depths)):
      size = (rows // 2 ** s, cols // 2 ** s)
      for b in range(depth):
        ws, shift = window_geometry(size, self.window, b % 2 == 1)
        centres, allowed = window_layout(size, ws, shift, self.patch_size * 2 ** s)
        name = f"stage{s}/block{b:02d}"
        found.append(anatomy.AttentionLayer(len(found), f"{name}/attn/weights", f"{name}/attn/heads",
                                            heads, centres, allowed=allowed))
    return found

  def head_projection(self, params: dict, block: int) -> jax.Array:
    stage, name = self.block_names()[block].split("/")
    kernel = params[f"{stage}_{name}"]["attn"]["out"]["kernel"]
    heads = self.heads[int(stage.removeprefix("stage"))]
    return kernel.reshape(heads, -1, kernel.shape[-1])

  @nn.compact
  def __call__(self, images: jax.Array, *,
               capture: capturing.Capture | str | Sequence[str] | None = None,
               train: bool = False) -> tuple[jax.Array, dict]:
    del train
    sizes.check_image(images, None, "Swin")
    if len(self.depths) != len(self.heads):
      raise ValueError(f"Swin: depths {tuple(self.depths)} and heads {tuple(self.heads)} need one "
                       "entry per stage.")
    capture = capturing.Capture.of(capture)
    out: dict = {}
    p = self.patch_size
    x = nn.Conv(self.embed_dim, (p, p), strides=(p, p), padding="VALID", name="patch_embed")(images)
    x = capture.put(out, "stem", nn.LayerNorm(epsilon=self.ln_eps, name="patch_norm")(x))
    for s, (depth, heads) in enumerate(zip(self.depths, self.heads)):
      if s:
        x = nn.LayerNorm(epsilon=self.ln_eps, name=f"stage{s}_merge_norm")(merge_patches(x))
        x = capture.put(out, f"stage{s}/merge", nn.Dense(2 * x.shape[-1] // 4, use_bias=False,
                                                         name=f"stage{s}_merge")(x))
      for b in range(depth):
        x = Block(heads, self.window, b % 2 == 1, int(x.shape[-1] * self.mlp_ratio), self.ln_eps,
                  name=f"stage{s}_block{b:02d}")(x, capture.child(f"stage{s}/block{b:02d}"), out)
    x = nn.LayerNorm(epsilon=self.ln_eps, name="norm")(x)
    x = capture.put(out, "pre_logits", x.mean(axis=(1, 2)))
    if self.num_classes:
      x = capture.put(out, "logits", nn.Dense(self.num_classes, name="head")(x))
    return x, out
