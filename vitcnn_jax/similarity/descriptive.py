"""Differences of one statistic of each layer (ReSi's descriptive measures).

Each layer's statistic is read from its Gram within each minibatch, summed over
minibatches and finished once; a pair of layers gets |s_a - s_b| (0 for equal
layers, a distance). Which example is which does not enter, so they have no
null (examples permuted, it would equal the measure).

- `magnitude_difference`: the norm of the layer's mean, ‖E x‖ (Wang et al. 2022),
  from the unbiased (Σ_{i≠j} <x_i, x_j>) / (n (n - 1)) of each minibatch (its
  own mean's squared norm is too large by tr Σ / n).
- `concentricity_difference`: the mean cosine of each example to its
  minibatch's mean (Wang et al. 2022).
- `uniformity_difference`: Wang & Isola's (2020) uniformity of the
  l2-normalised features, log of the mean over pairs i ≠ j of exp(-t ‖x̂_i - x̂_j‖²).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import registry
from vitcnn_jax.similarity.scales import Scale


def statistic_sums(raw: jax.Array, cos: jax.Array, proj: jax.Array, mean_sq: jax.Array,
                   mask: jax.Array, names: tuple[str, ...], t: float) -> dict[str, jax.Array]:
  """One minibatch's (L,) sums of each layer's statistics from its (L, n, n)
  uncentred Grams `raw` and cosines `cos`, each centred row's projection on the
  mean `proj` (L, n) and the mean's squared norm (L,) (raw and its sums carry the
  layers' scales, declared in `FAMILY.scales`); `pair_count` n (n - 1)."""
  m = mask.astype(jnp.float32)
  n = m.sum()
  pairs = hsic.pair_mask(mask)
  out = {"pair_count": n * (n - 1)}
  if "magnitude_difference" in names:
    out["magnitude"] = jnp.einsum("lij,ij->l", raw, pairs)
  if "concentricity_difference" in names:  # <x_i, mean> = proj_i + ‖mean‖²
    along = proj + mean_sq[:, None]
    norms = jnp.sqrt(jnp.maximum(jnp.diagonal(raw, axis1=1, axis2=2) * mean_sq[:, None], 0.0))
    out["concentricity"] = (jnp.where(norms > 0, along / jnp.where(norms > 0, norms, 1.0), 0.0)
                            * m).sum(1)
    out["concentricity_count"] = n
  if "uniformity_difference" in names:
    out["uniformity"] = jnp.einsum("lij,ij->l", jnp.exp(-t * (2 - 2 * cos)), pairs)
  return out


def statistics(sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Each measure's (L,) statistic from the float64 sums at the layers' own scale
  (NaN without a pair of examples, e.g. a bootstrap replicate that drew no minibatch)."""
  pairs = sums.get("pair_count", 0.0)
  ratio = lambda key, count: np.divide(sums[key], count, out=np.full(np.shape(sums[key]), np.nan),
                                       where=np.broadcast_to(count > 0, np.shape(sums[key])))
  out = {}
  if "magnitude" in sums:  # clipped at 0: counted by `negative_squared_norms`
    out["magnitude_difference"] = np.sqrt(np.maximum(ratio("magnitude", pairs), 0.0))
  if "concentricity" in sums:
    out["concentricity_difference"] = ratio("concentricity", sums["concentricity_count"])
  if "uniformity" in sums:
    out["uniformity_difference"] = np.log(ratio("uniformity", pairs))
  return out


def negative_squared_norms(sums: dict[str, np.ndarray]) -> int:
  """How many layers' unbiased squared norm of the mean came out negative (the
  sum of <x_i, x_j> over pairs i != j: a mean small against the examples' spread),
  which `statistics` clips to 0."""
  return int(np.sum(np.asarray(sums["magnitude"]) < 0))


def _sums(mb: registry.Minibatch, chosen: tuple[str, ...]) -> dict[str, jax.Array]:
  stack = mb.stack
  return statistic_sums(stack.raw(mb.mask), mb.shared(registry.cosines), stack.proj, stack.mean_sq,
                        mb.mask, chosen, mb.spec.uniformity_t)


def _check(spec: registry.Spec, smallest: int, chosen: tuple[str, ...]) -> None:
  del smallest, chosen
  if not spec.uniformity_t > 0:
    raise ValueError(f"config.uniformity_t={spec.uniformity_t} must be > 0 (2 in Wang & Isola 2020).")


def _measure(name: str, label: str, estimator: str, params, clip: registry.Clip | None = None
             ) -> registry.Measure:
  """|s_a - s_b| of the layers' statistics: a distance, without a null."""
  def value(t: registry.Totals) -> np.ndarray:
    s = statistics(t.sums)[name]
    return np.abs(s[:, None] - s[None, :])
  return registry.Measure(name, label, estimator, params, value, distance=True, null=False, clip=clip)


FAMILY = registry.Family((
    _measure("magnitude_difference", "magnitude difference", "|a - b| of each layer's norm of the "
             "mean, from the sum over minibatches of <x_i, x_j> over pairs i != j",
             lambda spec: "unbiased squared norm",
             registry.Clip("layers whose unbiased squared norm of the mean (the mean of <x_i, x_j> "
                           "over pairs i != j) was negative, clipped to 0 before the root",
                           lambda t: negative_squared_norms(t.sums))),
    _measure("concentricity_difference", "concentricity difference", "|a - b| of each layer's mean "
             "over every example of its cosine to its minibatch's mean", lambda spec: "minibatch means"),
    _measure("uniformity_difference", "uniformity difference", "|a - b| of each layer's log of the "
             "mean over pairs within minibatches of exp(-t ||x_i - x_j||^2), features l2-normalised",
             lambda spec: f"t {spec.uniformity_t}")), _sums, _check,
    scales={"magnitude": Scale(2, per_pair=False)})
