"""`lapack`: jaxlib's CPU LAPACK at one thread of its own, and the eigendecompositions
the same batched or one matrix at a time."""

from __future__ import annotations

import ctypes
import glob
import os

import jax
import numpy as np
import pytest
import scipy

from vitcnn_jax.similarity import lapack


def _bundled() -> ctypes.CDLL | None:
  """The OpenBLAS scipy ships (its wheels for Linux), found here independently."""
  paths = glob.glob(os.path.join(os.path.dirname(scipy.__file__), os.pardir, "scipy.libs", "libscipy_openblas*"))
  return ctypes.CDLL(paths[0]) if paths else None


@pytest.fixture
def fresh(monkeypatch):
  """`single_threaded` not yet called in this process; called again afterwards."""
  monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
  lapack.single_threaded.cache_clear()
  yield monkeypatch
  lapack.single_threaded.cache_clear()
  monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
  lapack.single_threaded()


def test_scipy_s_openblas_is_set_to_one_thread(fresh):
  lib = _bundled()
  if lib is None:  # scipy on Accelerate, MKL or a system library: nothing set, one matrix at a time
    assert lapack.single_threaded() is False
    return
  lib.scipy_openblas_set_num_threads(2)
  assert lapack.single_threaded() is True
  assert lib.scipy_openblas_get_num_threads() == 1


@pytest.mark.parametrize("value, want", [("3", False), ("1", True)])
def test_an_openblas_setting_of_the_user_s_is_kept(fresh, value, want):
  fresh.setenv("OPENBLAS_NUM_THREADS", value)
  lib = _bundled()
  if lib is not None:
    lib.scipy_openblas_set_num_threads(2)
  assert lapack.single_threaded() is want
  if lib is not None:
    assert lib.scipy_openblas_get_num_threads() == 2  # untouched


@pytest.mark.parametrize("one_thread", [True, False])  # batched, and one matrix at a time
def test_eigh_is_float64_s_within_rounding(monkeypatch, one_thread):
  """Eigenvalues of symmetric 24 x 24 matrices within the backward error of a stable
  eigensolver, n u ‖K‖₂ (doubled for the float32 input's own rounding), and the
  vectors reconstruct each matrix as closely."""
  monkeypatch.setattr(lapack, "single_threaded", lambda: one_thread)
  rng = np.random.default_rng(3)
  x = rng.standard_normal((5, 24, 30))
  k = np.einsum("lnd,lmd->lnm", x, x).astype(np.float32)
  s, u = jax.jit(lambda m: lapack.eigh(m))(k)  # traced anew for each branch
  want = np.linalg.eigvalsh(k.astype(np.float64))
  bound = 2 * 24 * np.finfo(np.float32).eps * want[:, -1:]
  assert np.all(np.abs(np.asarray(s, np.float64) - want) <= bound)
  u = np.asarray(u, np.float64)
  back = np.einsum("lik,lk,ljk->lij", u, np.asarray(s, np.float64), u)
  assert np.all(np.abs(back - k).max((1, 2)) <= 2 * bound[:, 0])
