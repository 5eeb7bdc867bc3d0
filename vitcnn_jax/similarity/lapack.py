"""The step's LAPACK calls (eigendecompositions and SVDs) as each backend runs them.

jaxlib's CPU decompositions call the LAPACK that scipy ships (on Linux wheels,
its own OpenBLAS), and split a batch over XLA's thread pool, each call blocking
its pool thread until its share is done. What that asks of the CPU is here:
LAPACK at one thread of its own (`single_threaded`), batches one matrix at a
time where it cannot be (`eigh`), and two batched calls never side by side
(`OneAtATime`).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os

import jax
import jax.numpy as jnp


@functools.cache
def single_threaded() -> bool:
  """Whether jaxlib's CPU LAPACK runs on one thread of its own: sets the OpenBLAS
  bundled with scipy to one (once a process; scipy.linalg's own calls in this
  process then run on one thread too), unless OPENBLAS_NUM_THREADS chooses.
  XLA's pool already spreads a batch over the cores, and OpenBLAS's threads on
  top of it oversubscribed them: a batch of 110 eigendecompositions of 256 x 256
  took 1,057 ms on 2 cores, 196 ms with OpenBLAS at one thread (348 ms one
  matrix at a time). False where scipy bundles no OpenBLAS (Accelerate, MKL, a
  system library)."""
  if "OPENBLAS_NUM_THREADS" in os.environ:
    return os.environ["OPENBLAS_NUM_THREADS"].strip() == "1"
  spec = importlib.util.find_spec("scipy")
  if spec is None or spec.origin is None:
    return False
  for path in glob.glob(os.path.join(os.path.dirname(spec.origin), os.pardir, "scipy.libs",
                                     "libscipy_openblas*")):
    setter = getattr(ctypes.CDLL(path), "scipy_openblas_set_num_threads", None)
    if setter is not None:
      setter(1)
      return True
  return False


def eigh(k: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Eigenvalues (ascending) and eigenvectors of (L, n, n) symmetric matrices: one
  batched call, or on CPU where LAPACK keeps threads of its own (`single_threaded`)
  one matrix at a time."""
  if jax.default_backend() == "cpu" and not single_threaded():
    return jax.lax.map(jnp.linalg.eigh, k)
  return jnp.linalg.eigh(k)


class OneAtATime:
  """Runs the step's LAPACK calls one after another. jaxlib's CPU eigh and SVD
  split a batch over XLA's thread pool and block their thread until it is done;
  two such calls that XLA runs side by side can each hold a thread the other
  waits for (on 2 cores: a deadlock). Each call's inputs get a zero computed from
  the previous call's output: a data dependency that orders them at run time,
  which an optimization_barrier (its buffers aliased) does not."""

  def __init__(self):
    self.last = None

  def __call__(self, fn, *args):
    if self.last is not None:
      zero = 0.0 * jnp.nan_to_num(jax.tree.leaves(self.last)[0].ravel()[0].astype(jnp.float32))
      args = jax.tree.map(lambda x: x + zero.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                          else x, args)
    out = fn(*args)
    self.last = out
    return out


def svd(m: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The thin SVD with vectors of (P, r, s) matrices. On CPU, LAPACK's divide and
  conquer (gesdd, XLA's default) returned NaN vectors and values, and said
  nothing, for one (127, 127) product of a real DINOv2's and a real ResNet's
  factors (canonical correlations clustered at 1), whose values alone it got
  right; so a batch it leaves non-finite is done again by the QR-based gesvd,
  which is 2 to 2.5x slower at that size (not worth paying every time).
  Elsewhere the backend's own."""
  if jax.default_backend() != "cpu":
    return jax.lax.linalg.svd(m, full_matrices=False)
  single_threaded()  # its batch is split over XLA's pool too: LAPACK at one thread of its own
  algorithms = jax.lax.linalg.SvdAlgorithm
  fast = jax.lax.linalg.svd(m, full_matrices=False, algorithm=algorithms.DIVIDE_AND_CONQUER)
  finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in fast]))
  return jax.lax.cond(finite, lambda: fast,
                      lambda: jax.lax.linalg.svd(m, full_matrices=False, algorithm=algorithms.QR))
