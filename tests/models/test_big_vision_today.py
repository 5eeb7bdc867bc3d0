"""big_vision's current releases: sincos2d files at any input size, SigLIP image
towers of So400m's shape, and FlexiViT's patch size chosen at load; against
float64 NumPy forwards written from upstream's arithmetic."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from conftest import compiled
from support import numpy_ref
from support import upstream_files as uf
from support.numerics import VIT_ROUNDINGS, assert_close, network
from vitcnn_jax import checkpoints

VIT = dict(width=48, depth=2, heads=3, mlp=96, patch=8)
VIT_TOL = network(VIT_ROUNDINGS)
# Width 1152, MLP 4304, patch 14: patch 588 + one block (LayerNorms, q, k, v, out and fc1
# over 1152 each, fc2 over 4304, scores over 72) 11,300 + final norm 1,152 + MAP head
# (the same sums again) 10,100.
SO400M_TOL = network(23_500)


def _images(size: int, n: int = 2, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def _unprefixed(w: dict) -> dict:
  return {k[len("params/"):]: v for k, v in w.items()}


def _check(ours, ref, what: str, tol: float = VIT_TOL) -> None:
  scale = float(np.abs(ref).max())
  assert scale > 1e-2, what
  assert_close(ours, ref, tol * scale, what)


def test_a_sincos2d_file_runs_at_any_input_size_without_resolution(tmp_path):
  w = uf.bv_vit(2, pool="gap", posemb="sincos2d", **VIT)
  c = checkpoints.load(uf.save(tmp_path / "s.npz", w))
  assert c.assumed == {"image_size": 224, "pool": "gap"}  # 224: only the size data is resized to
  for size in (32, 56, 24):  # the embedding is computed for each grid, as upstream
    x = _images(size)
    _check(compiled(c.model, c.params, x)[0], numpy_ref.bv_vit(_unprefixed(w), x, pool="gap")[1],
           f"sincos2d at {size} px")
  with pytest.raises(ValueError, match=r"\(30, 30\) is not a multiple of patch_size \(8, 8\)"):
    compiled(c.model, c.params, _images(30))


def _tf_bilinear(n_in: int, n_out: int) -> np.ndarray:
  """tf.image.resize(method="bilinear") (half-pixel centres, no antialias) of each
  unit vector, written from TF's kernel: lower/upper sources clamped to the edge."""
  m = np.zeros((n_out, n_in))
  for i in range(n_out):
    src = (i + 0.5) * n_in / n_out - 0.5
    lo = int(np.floor(src))
    frac = src - lo
    m[i, min(max(lo, 0), n_in - 1)] += 1 - frac
    m[i, min(max(lo + 1, 0), n_in - 1)] += frac
  return m


def _flexi_kernel(kernel: np.ndarray, new: int) -> np.ndarray:
  """FlexiViT's resample_patchemb: pinv of the resize matrix of every basis patch."""
  old = kernel.shape[0]
  basis = np.eye(old * old).reshape(-1, old, old)
  resize = np.stack([(_tf_bilinear(old, new) @ b @ _tf_bilinear(old, new).T).ravel()
                     for b in basis]).T  # (new*new, old*old): resized basis patches
  flat = np.linalg.pinv(resize.T) @ kernel.reshape(old * old, -1).astype(np.float64)
  return flat.reshape(new, new, *kernel.shape[2:])


@pytest.mark.parametrize("patch,size", [(4, 32), (12, 48), (16, 48)])
def test_flexivit_patch_size_is_chosen_at_load(tmp_path, patch, size):
  """A FlexiViT file (patch 8, a 4x4 embedding grid) at another patch size: the
  kernel resized by the pseudo-inverse, the embedding by jax.image.resize
  (FlexiViT's own calls), then big_vision's ViT."""
  w = uf.bv_vit(3, pool="tok", **VIT)
  c = checkpoints.load(uf.save(tmp_path / "f.npz", w), patch_size=patch, resolution=size)
  assert (c.model.patch_size, c.model.image_size) == (patch, size)
  ref = _unprefixed(w)
  ref["embedding/kernel"] = _flexi_kernel(ref["embedding/kernel"], patch)
  grid = size // patch
  pe = np.asarray(ref["pos_embedding"], np.float32).reshape(1, 4, 4, 48)
  ref["pos_embedding"] = np.asarray(jax.image.resize(pe, (1, grid, grid, 48), "linear")
                                    ).reshape(1, grid * grid, 48)
  x = _images(size, seed=patch)
  _check(compiled(c.model, c.params, x)[0], numpy_ref.bv_vit(ref, x, pool="tok")[1],
         f"FlexiViT at patch {patch}, {size} px")


def test_flexivit_resize_matches_the_same_patch_seen_larger():
  """FlexiViT's defining property: upsampling the patch by k and the kernel by
  the pinv resize gives the same token as the original patch and kernel."""
  from vitcnn_jax.models.vit import resize as vit_resize
  rng = np.random.default_rng(4)
  kernel = rng.standard_normal((4, 4, 3, 5))
  patch = rng.standard_normal((4, 4, 3))
  up = np.einsum("ij,jkc,lk->ilc", _tf_bilinear(4, 8), patch, _tf_bilinear(4, 8))
  big = vit_resize.resize_patch_embedding(kernel, (8, 8))
  np.testing.assert_allclose(np.einsum("ijc,ijcd->d", up, big),
                             np.einsum("ijc,ijcd->d", patch, kernel), rtol=1e-9, atol=1e-9)


def test_a_siglip_so400m_tower_has_its_shape_read_from_the_file(tmp_path):
  """So400m: width 1152, MLP 4304 (not 4x), 16 heads, MAP head; one block here,
  27 in the release (the depth is counted like any other)."""
  tower = uf.bv_vit(5, width=1152, depth=1, heads=16, mlp=4304, patch=14, grid=2, pool="map",
                    num_classes=None, prefix="")
  path = uf.save(tmp_path / "siglip.npz", uf.two_tower(tower))
  c = checkpoints.load(path + ":img")
  m = c.model
  assert (m.width, m.depth, m.mlp_dim, m.num_heads, m.patch_size, m.pool, m.image_size) == (
      1152, 1, 4304, 16, 14, "map", 28)
  assert c.policy == "resize" and not c.assumed
  x = _images(28, n=1)
  _check(compiled(m, c.params, x)[0], numpy_ref.bv_vit(tower, x, pool="map")[1],
         "So400m-shaped SigLIP tower", SO400M_TOL)
