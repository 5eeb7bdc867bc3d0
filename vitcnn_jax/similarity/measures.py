"""Similarity measures beyond linear CKA, from the Grams minibatch CKA forms.

Every measure is computed within each minibatch from the layers' Grams
(`grams.Layer`), for every pair of layers at once, and summed over minibatches
(each device holds whole minibatches). Each belongs to a family registered in
`FAMILIES` (a `registry.Family`: its measures' names, labels, how their
minibatches combine, parameters and their checks, sums and values):

- `linear_cka` (biased; the unbiased is `hsic.linear_sums`), `rbf_cka`,
  `distance_correlation`, `mutual_knn`, `cknna`, `rsa`, `rsm_difference`: from
  each minibatch's kernel, distance or correlation matrices (`kernels.py`).
- `knn_jaccard`, `rank_similarity`, `second_order_cosine`: each example's k
  nearest neighbours compared (`neighbours.py`).
- the CCA family (`mean_cca`, `cca_r2`, `svcca`, `pwcca`), `regression`,
  `shape_metric`, `procrustes`, `gulp`, `eigenspace_overlap`: from each layer's
  principal subspace (`subspaces.py`).
- `magnitude_difference`, `concentricity_difference`, `uniformity_difference`:
  one statistic per layer (`descriptive.py`).

A new measure is a `Measure` in its family's module (or a new module with its
`Family`) and, for a new family, one line in `FAMILIES`.

`null=True` adds each measure with one layer's examples permuted within the
minibatch (a re-index of its matrices, no forward): what the measure gives for
unrelated representations of the same statistics. Above the diagonal the column
layer's are permuted, below it the row layer's, so that each unordered pair is
computed once (`layerpairs`).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.similarity import descriptive
from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import kernels
from vitcnn_jax.similarity import layer_checks
from vitcnn_jax.similarity import neighbours
from vitcnn_jax.similarity import registry
from vitcnn_jax.similarity import scales
from vitcnn_jax.similarity import subspaces

# Every measure's family, in the order of `NAMES` (and of the demo's figure panels).
FAMILIES = (kernels.LINEAR_CKA, kernels.RBF_CKA, kernels.DISTANCE_CORRELATION, kernels.MUTUAL_KNN,
            kernels.CKNNA, neighbours.FAMILY, kernels.RSA, kernels.RSM_DIFFERENCE, subspaces.FAMILY,
            descriptive.FAMILY)
REGISTRY: dict[str, registry.Measure] = {m.name: m for f in FAMILIES for m in f.measures}
NAMES = tuple(REGISTRY)
# Every sum that carries the layers' scales, by key: the linear HSIC's and each family's.
SCALES: dict[str, scales.Scale] = {**hsic.SCALES, **{k: v for f in FAMILIES for k, v in f.scales.items()}}
# The most principal components of a layer a decomposition per pair of layers reads
# by default (`subspace_dims`; the CCA family's `cca_dims` too): its cost grows as
# their cube, and every pair (and its null) takes one. 0 reads them all.
SUBSPACE_DIMS = 32
Spec = registry.Spec


def permutation(key: jax.Array, mask: jax.Array) -> jax.Array:
  """A random order of the valid rows (which come first), padding left in place."""
  u = jax.random.uniform(key, mask.shape)
  return jnp.argsort(jnp.where(mask > 0, u, 2.0 + jnp.arange(mask.shape[0])))


def measure_sums(stack: registry.Stack, mask: jax.Array, spec: Spec,
                 order: jax.Array | None = None,
                 precision: grams.Precision = grams.HIGHEST) -> dict[str, jax.Array]:
  """One minibatch's sums of every measure of `spec` but unbiased linear CKA
  (`hsic.linear_sums`), for every pair of the `stack`'s layers, family by family (each
  family's `sums`); with `order`, each again with one layer's examples
  re-indexed (prefix "null/", see `layerpairs`). Some carry the layers' scales
  (each family's `scales`, gathered in `SCALES` and undone by `scales.unscale`);
  the others are scale-free."""
  mb = registry.Minibatch(stack, mask, spec, order, precision)
  out = {}
  for family in FAMILIES:
    chosen = tuple(m for m in spec.names if m in family.names)
    if chosen:
      out.update(family.sums(mb, chosen))
  return out


def only_linear(spec: Spec) -> bool:
  """Whether `spec` asks for nothing but the paper's (unbiased linear) CKA."""
  return set(spec.names) <= {"linear_cka"} and spec.estimator == "unbiased" and not spec.null


def minibatch_sums(acts: Sequence[jax.Array], mask: jax.Array, spec: Spec,
                   axis_name: str | tuple[str, ...] | None = None, group: str | None = None,
                   key: jax.Array | None = None,
                   precision: grams.Precision = grams.HIGHEST) -> dict[str, jax.Array]:
  """`stack_sums` of the layers' activations, each prescaled (`grams.scaled_layer`);
  a minibatch spread over a `group` of devices has unbiased linear CKA alone
  (`hsic.activation_sums`)."""
  if group is not None:
    if not only_linear(spec):
      raise ValueError(f"config.measures={spec.names} (estimator {spec.estimator!r}, null "
                       f"{spec.null}) need each minibatch on one device: set "
                       "config.devices_per_minibatch=1 or a smaller config.batch_size; a minibatch "
                       "spread over devices has unbiased linear CKA only.")
    return hsic.activation_sums(acts, mask, axis_name, group, precision)
  return stack_sums(registry.Stack.of_activations(acts, mask, precision), mask, spec, axis_name, key, precision)


def stack_sums(stack: registry.Stack, mask: jax.Array, spec: Spec,
               axis_name: str | tuple[str, ...] | None = None, key: jax.Array | None = None,
               precision: grams.Precision = grams.HIGHEST) -> dict[str, jax.Array]:
  """`hsic.linear_sums` of one minibatch's layers (`grams.Parts`, made
  where the forward made each activation, stacked) and, from the same Grams, the
  sums of `spec`'s other measures (and nulls, permuted by `key`), at the
  exponents shared along `axis_name`."""
  order = permutation(key, mask) if spec.null else None
  out = hsic.linear_sums(stack, mask, precision, order)
  if not only_linear(spec):
    out.update(measure_sums(stack, mask, spec, order, precision))
  return scales.shared_scale(out, axis_name, SCALES)


def spec_of(config) -> Spec:
  """The measures a config asks for (`measures`, `estimator`, `rbf_sigma`, `knn_k`,
  `rsa_method`, `null`, `cca_dims`, `subspace_dims`, `shape_alpha`, `gulp_lambda`,
  `svcca_variance`, `uniformity_t`), checked against its minibatches by every
  family (a parameter whether or not its measures are chosen)."""
  names = tuple(config.get("measures") or ("linear_cka",))
  smallest = min(config.batch_size, config.num_examples % config.batch_size or config.batch_size)
  width = int(config.get("subspace_dims", SUBSPACE_DIMS))
  if width < 0:
    raise ValueError(f"config.subspace_dims={width} must be >= 1, or 0 for every component.")
  dims = int(config.get("cca_dims", 0)) or max(1, min((smallest - 1) // 2, width or smallest))
  spec = Spec(names, config.get("estimator", "unbiased"), float(config.get("rbf_sigma", 1.0)),
              int(config.get("knn_k", 10)), config.get("rsa_method", "pearson"),
              bool(config.get("null", False)), dims, width, float(config.get("shape_alpha", 1.0)),
              float(config.get("gulp_lambda", 0.01)), float(config.get("svcca_variance", 0.99)),
              float(config.get("uniformity_t", 2.0)))
  unknown = [m for m in names if m not in REGISTRY]
  if unknown or len(set(names)) != len(names):
    raise ValueError(f"config.measures={list(names)}: each at most once, of {list(NAMES)}.")
  for family in FAMILIES:
    family.check(spec, smallest, tuple(m for m in names if m in family.names))
  return spec


def values(sums: dict, names: Sequence[str], spec: Spec, num_examples: int,
           null: bool = False) -> dict[str, np.ndarray | int]:
  """Each measure's (L, L) matrix from one repeat's float64 sums (`null`: its
  null's, normalised by the measure's own self-terms; none for a measure
  without a null), and for each measure M with a `clip` the number of cells (or
  layers) whose negative estimate was clipped to 0, as "clipped/M" (for the json).
  Layers that overflowed or are constant over the examples are refused for every
  measure, as linear CKA refuses them; a cell no layer explains is named too."""
  layer_checks.check_layers(np.diag(sums["hsic"]), sums["moments"] / num_examples, names, ", ".join(spec.names))
  totals = registry.Totals(sums, null, spec, names, num_examples)
  out, clipped = {}, {}
  for m in spec.names:
    measure = REGISTRY[m]
    if null and not measure.null:
      continue
    out[m] = measure.value(totals)
    if measure.clip is not None:
      clipped[m] = measure.clip.count(totals)
  for m, v in out.items():
    _check_finite(v, names, ("null/" if null else "") + m)
  return {**out, **{f"clipped/{m}": c for m, c in clipped.items()}}


def clip_counts(measure: str, per_repeat: Sequence[dict], null: Sequence[dict] | None = None) -> dict:
  """A clipping measure's json entry: what its clip is, and how many cells (or
  layers) it fired for in each repeat's `values` (and in its null's)."""
  key = f"clipped/{measure}"
  out = {"what": REGISTRY[measure].clip.what, "per_repeat": [int(r[key]) for r in per_repeat]}
  if null and key in null[0]:
    out["null_per_repeat"] = [int(r[key]) for r in null]
  return out


def _check_finite(v: np.ndarray, names: Sequence[str], measure: str) -> None:
  """A measure's matrix is finite, or an error naming its cells: its layers passed
  `layer_checks.check_layers`, so what is left is a step's own arithmetic failing (e.g. a
  decomposition that did not converge)."""
  bad = np.argwhere(~np.isfinite(v))
  if len(bad):
    cells = ", ".join(f"{names[i]!r} x {names[j]!r}" for i, j in bad[:4])
    raise FloatingPointError(f"{measure}: {len(bad)} of {v.size} layer pairs are not finite ({cells}"
                             f"{', ...' if len(bad) > 4 else ''}), though every layer is finite and "
                             "varies: a decomposition or a sum failed in some minibatch. Please report it "
                             "with the config; the other measures are unaffected (leave this one out).")


def describe(measure: str, spec: Spec) -> str:
  """How a measure's minibatches combine, with its parameters (for the json)."""
  m = REGISTRY[measure]
  return f"{m.estimator} ({m.params(spec)})"
