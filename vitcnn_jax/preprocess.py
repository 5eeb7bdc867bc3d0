"""Evaluation preprocessing of the upstream pipelines, in NumPy.

Per image (host side, any input size) -> fixed-size uint8, then per batch
(device side) -> float32 in [-1, 1], the range every official checkpoint was
trained on: (x - 127.5) / 127.5.

Policies (`policy` config field):
  resize             direct bilinear resize to size x size, no antialias:
                     vision_transformer and big_transfer evaluation, and Mixer.
  resize_small_crop  big_vision: area-resize the shorter side to size * 8/7
                     (256 for 224), round, then a central size x size crop.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

POLICIES = ("resize", "resize_small_crop")


def _as_rgb(image: np.ndarray) -> np.ndarray:
  image = np.asarray(image)
  if image.ndim == 2:
    image = image[..., None]
  if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
    raise ValueError(f"Expected an HxW, HxWx1, HxWx3 or HxWx4 image, got shape {image.shape}.")
  if image.shape[-1] == 1:
    image = np.repeat(image, 3, axis=-1)
  return image[..., :3]


@functools.lru_cache(maxsize=64)
def _bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) interpolation matrix, half-pixel centres (tf.image.resize)."""
  pos = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
  pos = np.clip(pos, 0, n_in - 1)
  lo = np.floor(pos).astype(int)
  hi = np.minimum(lo + 1, n_in - 1)
  frac = pos - lo
  w = np.zeros((n_out, n_in))
  np.add.at(w, (np.arange(n_out), lo), 1 - frac)
  np.add.at(w, (np.arange(n_out), hi), frac)
  return w


@functools.lru_cache(maxsize=64)
def _area_weights(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) box-overlap averaging matrix (tf.image.resize 'area')."""
  edges = np.arange(n_out + 1) * n_in / n_out
  lo, hi = edges[:-1, None], edges[1:, None]
  pix = np.arange(n_in)[None, :]
  overlap = np.clip(np.minimum(hi, pix + 1) - np.maximum(lo, pix), 0, None)
  return overlap / overlap.sum(axis=1, keepdims=True)


def resize(image: np.ndarray, size: tuple[int, int], method: str = "bilinear") -> np.ndarray:
  """Separable resize of an HxWxC image; returns float64."""
  weights = {"bilinear": _bilinear_weights, "area": _area_weights}[method]
  wy = weights(image.shape[0], size[0])
  wx = weights(image.shape[1], size[1])
  rows = np.tensordot(wy, image.astype(np.float64), axes=(1, 0))  # (h', W, C)
  return np.einsum("iwc,jw->ijc", rows, wx, optimize=True)


def _to_uint8(x: np.ndarray) -> np.ndarray:
  # Upstream pipelines clip and cast back to uint8 (truncating) before the value range.
  return np.clip(x, 0, 255).astype(np.uint8)


def central_crop(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  h, w = image.shape[:2]
  if h < size[0] or w < size[1]:
    raise ValueError(f"Cannot crop {size} from an image of shape {image.shape}.")
  dy, dx = (h - size[0]) // 2, (w - size[1]) // 2
  return image[dy:dy + size[0], dx:dx + size[1]]


def preprocess_image(image: np.ndarray, size: int, policy: str = "resize") -> np.ndarray:
  """One image of any size and channel count -> size x size x 3 uint8."""
  image = _as_rgb(image)
  if policy == "resize":
    if image.shape[:2] == (size, size):
      return image.astype(np.uint8)
    return _to_uint8(resize(image, (size, size), "bilinear"))
  if policy == "resize_small_crop":
    small = round(size * 8 / 7)
    h, w = image.shape[:2]
    factor = small / min(h, w)
    new = (max(size, round(h * factor)), max(size, round(w * factor)))
    return central_crop(_to_uint8(resize(image, new, "area")), (size, size))
  raise ValueError(f"Unknown preprocessing policy {policy!r}; expected one of {POLICIES}.")


def to_model_range(images) -> jnp.ndarray:
  """uint8 [0, 255] -> float32 [-1, 1]."""
  return (jnp.asarray(images, jnp.float32) - 127.5) / 127.5

