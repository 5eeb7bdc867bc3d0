"""Image and patch sizes: a size as a pair, a patch grid, and the input check
every model makes before its forward."""

from __future__ import annotations

from typing import Sequence

import jax

Array = jax.Array


def to_pair(v: int | Sequence[int]) -> tuple[int, int]:
  if isinstance(v, int):
    return (v, v)
  v = tuple(int(a) for a in v)
  if len(v) != 2:
    raise ValueError(f"Expected an int or a pair, got {v}.")
  return v  # type: ignore[return-value]


def patch_grid(patch_size, image_size) -> tuple[int, int]:
  """Rows and columns of the patch tokens of a ViT or Mixer."""
  (ph, pw), (h, w) = to_pair(patch_size), to_pair(image_size)
  if h % ph or w % pw:
    raise ValueError(f"image_size {(h, w)} is not a multiple of patch_size {(ph, pw)}.")
  return h // ph, w // pw


def check_image(images: Array, image_size: tuple[int, int] | None, model: str) -> None:
  """Errors early, naming both shapes, instead of failing deep inside XLA
  (`image_size` None: a model that runs at any size)."""
  if images.ndim != 4 or images.shape[-1] != 3:
    raise ValueError(
        f"{model} expects NHWC images with 3 channels, got shape {images.shape}.")
  if image_size is not None and tuple(images.shape[1:3]) != tuple(image_size):
    raise ValueError(
        f"{model} was built for {image_size[0]}x{image_size[1]} images but got "
        f"{images.shape[1]}x{images.shape[2]} (shape {images.shape}). Resize the "
        "images, or reload with load_model(path, resolution=...) to resample "
        "the position embedding.")
