"""Whether a layer's accumulated self-similarity is a number that means something.

Every measure divides by, or compares with, a layer's own HSIC. A layer that
overflowed, or that is constant over the examples (identical or blank images, a
layer constant by design), has none worth the name: `check_layers` refuses it by
name, for whichever measure asked, before any value is computed from it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

# A constant layer's centred features are float32 rounding, at most about
# c u |x_d| per entry (c^2 below NOISE for the minibatch mean of up to ~10^4
# rows), so its self-HSIC, the squared Frobenius norm of that noise's
# covariance, stays below (NOISE u^2)^2 sum_d x_d^4, which for a constant layer
# is sum_d mean_d^4 (`fourth_moment`). A real layer with spread s per feature on
# an offset m is there only if s/m < sqrt(NOISE) u ~ 6e-6.
NOISE = 1e4
U32 = 2.0 ** -24


def noise_floor(mean_m4: np.ndarray) -> np.ndarray:
  """The self-HSIC below which a layer is float32 rounding noise (see above)."""
  return (NOISE * U32 ** 2) ** 2 * np.asarray(mean_m4, np.float64)


def check_layers(self_hsic: np.ndarray, mean_m4: np.ndarray | None, names: Sequence[str],
                 what: str = "CKA") -> None:
  """Every layer's accumulated self-HSIC is finite and above float32's rounding
  level (given each layer's mean `fourth_moment`): else an error naming the layer
  and the cause. Any similarity of a layer that overflowed, or that is constant
  over the examples, is a number that means nothing, whichever measure (`what`)."""
  floors = np.zeros(len(self_hsic)) if mean_m4 is None else noise_floor(mean_m4)
  for name, v, floor in zip(names, self_hsic, floors):
    if not np.isfinite(v):
      raise FloatingPointError(f"{what}: self-HSIC of layer {name!r} is {v}; the activations "
                               "overflowed or contain NaN/inf.")
    if v <= floor:
      raise FloatingPointError(
          f"{what}: layer {name!r} is constant over the examples (self-HSIC {v:.3g}"
          f"{', at float32 rounding level for its feature scale' if v > 0 else ''}), so "
          "its similarity with anything is meaningless. Check the inputs: are the images "
          "identical or blank? (A layer that is constant by design cannot be compared: "
          "leave it out of the captured points.)")
