"""Kept passes combined: the sums a fused run's steps would have made, from the
models' kept stacks instead of their forwards.

For each repeat and minibatch, the stacks of every model are read (each file's
bytes checked), their examples and source pixels checked equal, joined in the
models' order and summed by `measures.stack_sums`, the per-cell null keyed as a
fused run keys it (seed, pass 0, repeat, minibatch), into float64 host sums and
the Poisson bootstrap's replicates (`runstate.Bootstrap`, seeded alike). An
analysis's `finalize` takes them as it takes a fused run's.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import numpy as np

from vitcnn_jax.run import driver
from vitcnn_jax.run import kept
from vitcnn_jax.run import progress
from vitcnn_jax.run import protocol
from vitcnn_jax.run import runstate
from vitcnn_jax.similarity import grams
from vitcnn_jax.similarity import layer_search
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import registry
from vitcnn_jax.similarity import scales


@functools.partial(jax.jit, static_argnames=("spec", "precision"))
def _sums(stacks: list[registry.Stack], mask: jax.Array, key: jax.Array, spec: measures.Spec,
          precision: grams.Precision) -> dict[str, jax.Array]:
  return measures.stack_sums(registry.Stack.join(stacks), mask, spec, key=key, precision=precision)


@functools.partial(jax.jit, static_argnames=("spec", "precision"))
def _draws(stacks: list[registry.Stack], mask: jax.Array, keys: jax.Array, spec: measures.Spec,
           precision: grams.Precision) -> dict[str, jax.Array]:
  return layer_search.draw_sums(registry.Stack.join(stacks[:-1]), stacks[-1], mask, spec, keys, precision)


@functools.lru_cache(maxsize=64)  # the same for every pair of a comparison
def minibatch_key(seed: int, repeat: int, minibatch: int) -> jax.Array:
  """The key a fused run's step gives minibatch `minibatch` of `repeat` (pass 0)."""
  key, first = driver.random_of(seed, 0, repeat, minibatch)
  return jax.random.fold_in(key, first)


def check_minibatch(passes: Sequence[kept.Pass], parts: Sequence[dict], repeat: int, minibatch: int) -> None:
  """Every pass's minibatch holds the same examples, in order, from the same pixels."""
  first = parts[0]
  for p, got in zip(passes[1:], parts[1:]):
    for field, what in (("indices", "other examples (or another order)"),
                        ("pixels", "other source pixels for the same examples (another preprocessing or crop)")):
      if not np.array_equal(first[field], got[field]):
        raise kept.KeptError(f"minibatch {minibatch} of repeat {repeat}: the kept pass of {p.name!r} "
                             f"({p.path(repeat, minibatch)}) holds {what} than that of "
                             f"{passes[0].name!r} ({passes[0].path(repeat, minibatch)}). Keep both "
                             "passes from the same config.data and seed.")


def draw_keys(seed: int, repeat: int, minibatch: int, num: int) -> jax.Array:
  """The layer-search null's keys of one minibatch: apart from its per-cell null's."""
  return jax.random.split(jax.random.fold_in(minibatch_key(seed, repeat, minibatch), 1), num)


@dataclasses.dataclass
class Combined:
  """What `combine` makes: each repeat's float64 sums, the bootstrap replicates
  pooled over repeats, and (with draws) each repeat's draws of the layer-search
  null of the last pass against the others, as sums ({key: (K, ...)})."""
  sums: list[protocol.Sums]
  pooled: protocol.Sums
  draws: list[protocol.Sums]


def combine(passes: Sequence[kept.Pass], digests: Sequence[dict[str, str]], spec: measures.Spec,
            seed: int, bootstrap: int = 0, precision: grams.Precision = grams.HIGHEST,
            draws: int = 0) -> Combined:
  """The sums of `spec`'s measures over the layers of `passes`, in order, as a
  fused run of them makes them; with `draws`, also that many draws of the last
  pass's examples permuted against the others (`layer_search`)."""
  kept.check_shared(list(passes))
  reps = range(len(passes[0].manifest["sample"]["repeats"]))
  boot = runstate.Bootstrap(seed, bootstrap, {})
  out = Combined([], {}, [])
  with progress.Bar(sum(map(passes[0].minibatches, reps)), "comparison",
                    jax.process_index() == 0) as bar:
    for r in reps:
      sums, drawn = {}, {}
      for b in range(passes[0].minibatches(r)):
        parts = [p.read(r, b, d) for p, d in zip(passes, digests)]
        check_minibatch(passes, parts, r, b)
        stacks = [registry.Stack(*(x[k] for k in kept.STACK)) for x in parts]
        mask = parts[0]["mask"]
        got = jax.device_get(_sums(stacks, mask, minibatch_key(seed, r, b), spec, precision))
        if bootstrap:
          got = {k if k == "log2_scale" else protocol.BOOT + k: v if k == "log2_scale" else v[None]
                 for k, v in got.items()}
        sums = boot.add(sums, scales.unscale(got, measures.SCALES), 0, r, b)
        if draws:
          new = jax.device_get(_draws(stacks, mask, draw_keys(seed, r, b, draws), spec, precision))
          drawn = runstate.add(drawn, scales.unscale(new, measures.SCALES))
        bar.update(1, int(parts[0]["mask"].sum()))
      out.sums.append(sums)
      out.draws.append(drawn)
  out.pooled = boot.pooled.get(0, {})
  return out
