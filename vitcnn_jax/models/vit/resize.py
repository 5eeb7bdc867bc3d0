"""A ViT file run at another resolution or patch size, as its upstream would run
it: the one resampler of position embeddings (each upstream's interpolation),
FlexiViT's resize of the patch embedding, and `adapt`, which every ViT reader's
adaptation ends with."""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models import sizes
from vitcnn_jax.models.formats.base import CheckpointError, Reading

SCIPY_LINEAR = "scipy_linear"  # vision_transformer, big_vision: scipy.ndimage.zoom, order 1
JAX_LINEAR = "jax_linear"  # FlexiViT: jax.image.resize, linear, in float32
# One of the two above, or separable (n_out, n_in) weights applied in float64: timm's
# antialiased bicubic (`preprocess.bicubic_weights`), transformers' torch bicubic or PIL bilinear.
Interpolation = str | Callable[[int, int], np.ndarray]


def resample_posemb(pe: np.ndarray, old_grid: tuple[int, int], new_grid: tuple[int, int],
                    interpolation: Interpolation) -> np.ndarray:
  """A (1, rows * cols, D) embedding of the patch tokens moved to another grid
  with the interpolation of the file's upstream (prefix tokens carry their own)."""
  if tuple(old_grid) == tuple(new_grid):
    return pe
  d = pe.shape[-1]
  if interpolation == SCIPY_LINEAR:
    import scipy.ndimage  # only here: kept off every start
    zoom = (new_grid[0] / old_grid[0], new_grid[1] / old_grid[1], 1)
    grid = scipy.ndimage.zoom(pe.reshape(old_grid[0], old_grid[1], d), zoom, order=1)
  elif interpolation == JAX_LINEAR:
    grid = np.asarray(jax.image.resize(np.asarray(pe, np.float32).reshape(1, *old_grid, d),
                                       (1, *new_grid, d), "linear"))
  elif callable(interpolation):
    rows, cols = (interpolation(o, n) for o, n in zip(old_grid, new_grid))
    grid = np.einsum("ij,jkd,lk->ild", rows, pe.reshape(old_grid[0], old_grid[1], d).astype(np.float64),
                     cols)
  else:
    raise ValueError(f"interpolation={interpolation!r} is neither {SCIPY_LINEAR!r}, {JAX_LINEAR!r} "
                     "nor a function of (n_in, n_out) giving weights.")
  return grid.reshape(1, new_grid[0] * new_grid[1], d).astype(pe.dtype)


def resize_patch_embedding(kernel: np.ndarray, new: tuple[int, int]) -> np.ndarray:
  """FlexiViT's patch-embedding resize: the kernel whose response to a patch
  equals the old kernel's response to that patch bilinearly resized to the old
  size, in the least-squares sense (pseudo-inverse of the resize matrix)."""
  old = kernel.shape[:2]
  if tuple(old) == tuple(new):
    return kernel
  resize = np.kron(preprocess.bilinear_weights(old[0], new[0]),
                   preprocess.bilinear_weights(old[1], new[1]))  # (new pixels, old pixels)
  flat = np.linalg.pinv(resize.T) @ kernel.reshape(old[0] * old[1], -1).astype(np.float64)
  return flat.reshape(*new, *kernel.shape[2:]).astype(kernel.dtype)


def adapt(cfg: dict, r: Reading, native: int | None, path: str,
          interpolation: Interpolation) -> None:
  """Checks the resolution and the blocks named; a learned embedding is
  resampled to the new grid (with `interpolation`, the file's upstream's, or
  FlexiViT's where the patch size changes, which resizes the patch embedding too)."""
  if cfg.get("image_size") is None:
    raise CheckpointError(
        f"{path}: cannot infer a square input size from {r.evidence['image_size']}; pass "
        "resolution=(height, width).")
  bad = [b for b in cfg.get("no_skip") or () if not 0 <= b < cfg["depth"]]
  if bad:
    raise ValueError(f"{path}: no_skip={tuple(cfg['no_skip'])} names blocks {bad}, but the "
                     f"model has blocks 0..{cfg['depth'] - 1}.")
  patch, new = sizes.to_pair(cfg["patch_size"]), sizes.to_pair(cfg["image_size"])
  if new[0] % patch[0] or new[1] % patch[1]:
    raise ValueError(f"resolution {new} is not a multiple of the patch size {patch}.")
  kernel = r.params["embedding/kernel"]
  if tuple(kernel.shape[:2]) != patch:  # another patch size, as FlexiViT: both resized its way
    r.params["embedding/kernel"] = resize_patch_embedding(kernel, patch)
    interpolation = JAX_LINEAR
  if "pos_embedding" not in r.params:
    return
  rows, grid = r.params["pos_embedding"].shape[1], (new[0] // patch[0], new[1] // patch[1])
  if grid[0] * grid[1] != rows:
    if native is None:
      raise CheckpointError(f"{path}: cannot resample a non-square position "
                            f"embedding ({r.evidence['image_size']}) to {new}.")
    old = native // kernel.shape[0]
    r.params["pos_embedding"] = resample_posemb(r.params["pos_embedding"], (old, old), grid,
                                                interpolation)
