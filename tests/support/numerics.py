"""Float32 tolerances derived from the arithmetic, and a record of how close each test came.

CI runs on CPUs whose vector width, thread count and XLA reduction order differ
from ours, so a bound set just above what one machine printed fails on the next.
Every float32 comparison states its bound from the problem instead:

- `worst(n, ...)`: Higham's worst case for float32 sums/dots of n terms, n*u
  relative to the sum of the terms' magnitudes (u = 2**-24, the unit roundoff).
  Holds for any summation order.
- `likely(n, ...)`: the probabilistic bound of Higham & Mary (2019), lam*sqrt(n)*u
  with lam = 8: rounding errors as independent mean-zero variables, exceeded
  with probability below 2*exp(-lam**2/2) ~ 3e-14 per sum, in any order. Used
  where the worst case would be too loose to catch the bug the test is about.

`assert_close` records error/bound per test; `pytest --tolerances` (conftest)
prints the largest ratios, which is how the closing notes report margins.
"""

from __future__ import annotations

import math
import os

import numpy as np

U32 = 2.0 ** -24  # float32 unit roundoff
LAM = 8.0

RECORD: list[tuple[str, str, float, float]] = []  # (test, what, error, bound)


def worst(*lengths: int) -> float:
  """Relative worst-case error of a chain of float32 sums with these lengths."""
  return U32 * sum(lengths)


def likely(*lengths: int) -> float:
  """Relative probabilistic error bound of a chain of float32 sums (Higham & Mary)."""
  return LAM * U32 * sum(math.sqrt(n) for n in lengths)


def assert_close(actual, desired, bound: float, what: str = "") -> float:
  """max |actual - desired| <= bound (absolute); records the ratio for the report."""
  actual = np.asarray(actual, np.float64)
  desired = np.asarray(desired, np.float64)
  assert actual.shape == desired.shape or desired.ndim == 0, (what, actual.shape, desired.shape)
  err = float(np.max(np.abs(actual - desired))) if actual.size else 0.0
  test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
  RECORD.append((test, what, err, bound))
  assert err <= bound, f"{what}: max |error| = {err:.3g} exceeds the bound {bound:.3g}"
  return err


def cka_bound(n: int, d: int) -> float:
  """Absolute float32 error of a (minibatch) linear CKA from minibatches of n
  examples with d features: the feature mean (n terms), the Gram (d), the two
  U-centring sums (2n) and the HSIC dot (n*n), in each of the three HSICs of the
  ratio. Absolute because |sum k_ij l_ij| <= ||K|| ||L|| (Cauchy-Schwarz) makes
  each relative HSIC error an absolute CKA error, whatever the CKA's value."""
  return 3 * likely(n, d, 2 * n, n * n)


def network(roundings: int) -> float:
  """Relative difference between two float32 evaluations of one network (another
  implementation, fusion or summation order): each output collects about
  `roundings` roundings on each side (the fan-ins along its path: embeddings,
  norms, matmuls, convs), independent and so adding in quadrature."""
  return likely(2 * roundings)


# Roundings per output of the tiny test models (tests/support/upstream_files.py defaults).
VIT_ROUNDINGS = 1_100   # ViT w48 d2: patch 192 + 2 x 386 per block + final norm and head 96
MIXER_ROUNDINGS = 700   # Mixer w32: 192 + 2 x 184 + 80
BIT_ROUNDINGS = 20_000  # BiT w0.5, up to 5 units at 64 px; GroupNorm sums over H W C/32


def job_runs_bound(batch: int) -> float:
  """Two float32 runs of the tiny ViT + BiT CKA job (`tiny_vit_bit`), or of its
  forwards, compiled apart: each CKA within its own bound twice over, plus 4x the
  models' relative difference (each Gram moves by twice it). The widest layer:
  BiT root conv at 32 px, 16 x 16 x 32 features."""
  return 2 * cka_bound(batch, 16 * 16 * 32) + 4 * (network(VIT_ROUNDINGS) + network(BIT_ROUNDINGS))
