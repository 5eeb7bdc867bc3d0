"""What an analysis is to the driver: passes of jit-compiled steps over the data.

A step sees the models through `Forward` (their captured points on one device's
rows) and returns named sums over those rows; the driver does the rest. A
single-pass analysis is its own pass (`Analysis.passes`); the base classes
give every optional member its default, so the driver asks for nothing twice.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models import capturing
from vitcnn_jax.plotting import style
from vitcnn_jax.run import parallel
from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import hsic
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import registry
from vitcnn_jax.similarity import scales

Sums = dict[str, Any]  # named sums over examples (arrays), the result of a step
ROWS = "rows/"  # step results that are rows, gathered rather than summed
ROWS_MASK = "rows/.mask"
BOOT = "boot/"  # step results per minibatch: summed, and into bootstrap replicates


def unfit(got: Sums) -> bool:
  """Whether a step's result says that a layer, made from its features as they
  are, left float32's range (a `log2_scale` of `grams.UNFIT`): its minibatch is
  run again with its layers prescaled (`Forward`'s `prescale`)."""
  return any(grams.needs_prescaling(v) for k, v in got.items() if k.rsplit("/", 1)[-1] == "log2_scale")


class Forward:
  """What a step sees of the models: their captured points on this device's rows,
  `constants`, the arrays its pass's `setup` made (e.g. fitted probes), `key`, a
  random key of this device's minibatch, and `activation_sums`/`measure_sums`, the
  sums of this device's share of its minibatch. The captured points' Grams are
  made from the features as they are, or with `prescale` from them scaled first
  (`grams.layer_parts`)."""

  def __init__(self, models: dict, params: dict, images: dict,
               points: dict[str, Sequence[str]], constants: Any = None,
               grouped: bool = False, precision: grams.Precision = grams.HIGHEST,
               key: jax.Array | None = None, prescale: bool = False):
    self.models, self._params, self._images, self._points = models, params, images, points
    self.constants, self.key = constants, key
    self.grouped, self._precision, self._prescale = grouped, precision, prescale
    self._group = parallel.GROUP if grouped else None  # the mesh axis a minibatch spans

  def activation_sums(self, acts: Sequence[jax.Array], mask: jax.Array) -> Sums:
    """`hsic.activation_sums` of these rows' activations (one per layer), for a
    minibatch held by this device or spread over its group of devices."""
    return hsic.activation_sums(acts, mask, parallel.AXES, self._group, self._precision, self._prescale)

  def stacked_sums(self, stacks: Sequence[jax.Array], mask: jax.Array) -> Sums:
    """`activation_sums` of the layers stacked in each of `stacks` (`hsic.stacked_sums`:
    one batched program for any number of same-shaped layers)."""
    return hsic.stacked_sums(stacks, mask, parallel.AXES, self._group, self._precision, self._prescale)

  def measure_sums(self, points: dict[str, Sequence[str]], mask: jax.Array, spec: measures.Spec
                   ) -> Sums:
    """`activation_sums` and the sums of `spec`'s other measures of the points of
    each model (`measures.stack_sums`), each point's Gram made where the forward
    makes it (`layers`)."""
    if self.grouped:
      acts = [self(name)[p] for name, names in points.items() for p in names]
      return measures.minibatch_sums(acts, mask, spec, parallel.AXES, self._group, self.key,
                                     self._precision)
    got: dict[str, grams.Parts] = {}
    for group in self._alike(points):
      got.update(self._group_layers(group, points[group[0]], mask))
    layers = jax.tree.map(lambda *a: jnp.concatenate(a), *[got[name] for name in points])
    return measures.stack_sums(registry.Stack.of(layers), mask, spec, parallel.AXES, self.key,
                               self._precision)

  def layers(self, name: str, points: Sequence[str], mask: jax.Array) -> grams.Parts:
    """`grams.layer_parts` of each of `points` of model `name`, stacked in that
    order, each made inside the forward as it is computed
    (`capturing.Capture.reduce`): in a scan over identical blocks its activation
    dies in its block and its code is compiled once. `registry.Stack.of` brings
    them to their scales together."""
    return self._layers(name, self._params[name], self._images[name], points, mask)

  def _layers(self, name: str, params: Any, images: jax.Array, points: Sequence[str], mask: jax.Array
              ) -> grams.Parts:
    capture = capturing.Capture(tuple(points),
                                reduce=lambda a: grams.layer_parts(a, mask, self._precision, self._prescale))
    x = preprocess.normalize(images, self.models[name].policy)
    out = self.models[name].model.apply({"params": params}, x, capture=capture)[1]
    return capturing.stacked([out[p] for p in points])

  def _alike(self, points: dict[str, Sequence[str]]) -> list[list[str]]:
    """The models in groups that run the same program: one architecture,
    preprocessing, points, input shape and parameter shapes (seeds or checkpoints
    of one network), in the order of `points`."""
    def signature(name):
      leaves, tree = jax.tree.flatten(self._params[name])
      shapes = tuple((a.shape, a.dtype) for a in leaves)
      return (self.models[name].policy, tuple(points[name]), tree, shapes,
              self._images[name].shape, self._images[name].dtype)

    signatures = {name: signature(name) for name in points}

    def alike(a, b):
      try:  # a module field holding an array (training's skip gates) compares as an array
        return signatures[a] == signatures[b] and bool(self.models[a].model == self.models[b].model)
      except (TypeError, ValueError):
        return False
    groups: list[list[str]] = []
    for name in points:
      match = next((g for g in groups if alike(g[0], name)), None)
      if match is None:
        groups.append([name])
      else:
        match.append(name)
    return groups

  def _group_layers(self, group: list[str], points: Sequence[str], mask: jax.Array
                    ) -> dict[str, grams.Parts]:
    """`layers` of each model of `group` (`_alike`): for two or more, one loop over
    their stacked parameters and inputs, so that the forward and Gram code is
    compiled once for the group, not once per model."""
    if len(group) == 1:
      return {group[0]: self.layers(group[0], points, mask)}
    stack = lambda trees: jax.tree.map(lambda *a: jnp.stack(a), *trees)
    got = jax.lax.map(lambda pi: self._layers(group[0], pi[0], pi[1], points, mask),
                      (stack([self._params[n] for n in group]), stack([self._images[n] for n in group])))
    return {n: jax.tree.map(lambda a, i=i: a[i], got) for i, n in enumerate(group)}

  def inputs(self, name: str) -> jax.Array:
    """Model `name`'s input images, float32, normalised as its policy says."""
    return preprocess.normalize(self._images[name], self.models[name].policy)

  def logits(self, name: str) -> jax.Array:
    """Model `name`'s class logits on its inputs."""
    return self.models[name].model.apply({"params": self._params[name]}, self.inputs(name),
                                         capture=[])[0]

  def __call__(self, name: str, images: jax.Array | None = None) -> dict[str, jax.Array]:
    """{point: activation} of model `name` on its inputs (or on `images`)."""
    x = self.inputs(name) if images is None else images
    return self.models[name].model.apply({"params": self._params[name]}, x,
                                         capture=list(self._points[name]))[1]


class Pass:
  """One sweep over the data, `repeats` times (each on a new sample)."""
  points: dict[str, Sequence[str]]  # model name -> representation points it needs
  repeats = 1
  labels = False  # whether steps need class labels
  constants: Any = None  # arrays the step reads as `forward.constants` (set by `setup`)

  def step(self, forward: Forward, labels: jax.Array, mask: jax.Array) -> Sums:
    """Sums over this device's valid rows (mask 1); jit-compiled, no I/O. Floating
    leaves are summed over devices; integer leaves (e.g. scale exponents) must be
    equal on all devices and are kept once; leaves named `rows/...` are this
    device's rows themselves, which the host concatenates (valid rows only, in
    the order of the examples): only for a few rows, e.g. a probe's shots;
    leaves named `boot/X` are this minibatch's own sums, which the host adds to X
    and, weighted by each minibatch's Poisson(1) draws, to the bootstrap
    replicates of X (`Analysis.replicates`)."""
    raise NotImplementedError

  def host_sums(self, got: Sums) -> Sums:
    """A step's result as float64 sums on the host (e.g. `scales.unscale`)."""
    return got

  def program(self) -> Hashable | None:
    """Everything `step` computes from beyond its models, points and inputs (e.g.
    the measures and their parameters), as a hashable value: a later run whose
    pass has an equal one reuses this one's compiled step in the same process
    (`programs.Step`). None: compiled anew for each run."""
    return None

  def setup(self, done: list[list[Sums]]) -> None:
    """Runs before the pass with the sums of the passes before it."""

  def examples(self, repeat: int, sources: dict) -> tuple[str, np.ndarray] | None:
    """(source name, indices) of a repeat; None: `config.num_examples` sampled
    from the source "data", a new draw each repeat."""
    del repeat, sources
    return None


class HsicPass(Pass):
  """A pass whose steps return `Forward.activation_sums` (or other HSIC sums)."""

  def host_sums(self, got: Sums) -> Sums:
    return scales.unscale(got, measures.SCALES)


class Analysis(Pass):
  """An analysis: its passes (itself, unless it needs more), then its results.
  `replicates[pass]` holds, before `finalize`, the bootstrap replicates of each
  `boot/` sum of that pass, pooled over its repeats: {X: (replicates, ...)}."""
  replicates: list[Sums] = []

  def passes(self) -> Sequence[Pass]:
    return [self]

  def finalize(self, sums: list[list[Sums]]) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays and a JSON summary from sums[pass][repeat] (float64)."""
    raise NotImplementedError

  def plot(self, arrays: dict[str, np.ndarray], summary: dict, workdir: str,
           figures: style.Figures) -> list:
    """Its figures of `arrays` and `summary`, written to `workdir` as `figures` says,
    and returned (matplotlib Figures: a notebook shows them; the driver lets them go)."""
    raise NotImplementedError
