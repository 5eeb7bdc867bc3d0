"""Identical blocks applied in turn, each run of them one `lax.scan`: a network of
identical blocks is traced and compiled once, not once per block."""

from __future__ import annotations

import collections
from typing import Any, Callable, Hashable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.models import param_trees
from vitcnn_jax.models.capturing import Capture, Row

Array = jax.Array


def apply_blocks(parent: nn.Module, make: Callable[..., nn.Module], names: Sequence[str], x: Array,
                 captures: Sequence[Capture], out: dict, *args, scan: bool = True) -> Array:
  """Identical blocks `make(name=names[i])` of `parent` applied in turn as
  `block(x, captures[i], out, *args) -> x`: made one by one when `parent` is
  initialised (their parameters as they are stored) or not `scan` (training:
  differentiated, a scan of the demo ViT compiled in 3.1 s against 1.3 s and
  stepped in 179 ms against 124), scanned otherwise (`run_blocks`)."""
  if parent.is_initializing() or not scan:
    for name, capture in zip(names, captures):
      x = make(name=name)(x, capture, out, *args)
    return x
  params = parent.variables["params"]
  _check_alike(parent, names, params)
  return run_blocks(make(parent=None), [params[n] for n in names], x, captures, out, *args)


def _check_alike(parent: nn.Module, names: Sequence[str], params: Any) -> None:
  """Identical blocks' parameters are all there and agree in names and shapes:
  a scan stacks them, and the blocks' own checks name a parameter within its
  block only."""
  prefix = "".join(f"{p}/" for p in parent.scope.path)
  missing = [name for name in names if name not in params]
  if missing:
    raise ValueError(f"the parameters of block {prefix}{missing[0]} are missing: the parameters are not "
                     "this model's (load them with its family's loader, which checks every shape).")
  leaves = lambda name: {k: np.shape(v) for k, v in param_trees.flatten(params[name]).items()}
  first = leaves(names[0])
  for name in names[1:]:
    other = leaves(name)
    for key in sorted(first.keys() | other.keys()):
      if first.get(key) != other.get(key):
        raise ValueError(
            f"identical blocks {prefix}{names[0]} and {prefix}{name} disagree on their parameter {key}: "
            f"{first.get(key, 'absent')} against {other.get(key, 'absent')}. The parameters are not "
            "this model's: load them with its family's loader, which checks every shape.")


# Runs of fewer blocks are applied one by one: for one or two blocks a scan's loop
# and stacked parameters cost more to trace and compile than they save (the tiny
# test models: 19% more suite time on two analysis test files).
MIN_SCAN = 3


def run_blocks(block: nn.Module, params: Sequence[Any], x: Array, captures: Sequence[Capture],
               out: dict, *args) -> Array:
  """`block` (unbound: `parent=None`) applied in turn with `params[i]`, capturing
  with `captures[i]`, as `block(x, capture, out, *args) -> x`: each run of at
  least `MIN_SCAN` consecutive blocks that keep the same points is one
  `lax.scan` (its points stacked by the scan, then handed out per block; reduced
  ones as `Row`s of the scan's output), so a network of identical blocks is
  traced and compiled once, not once per block.
  Parameters are stacked for each run: a copy of those blocks' weights per call."""
  # Too few blocks to scan: no points asked for, so one run, applied block by block.
  names = _block_points(block, params[0], x, args) if len(params) >= MIN_SCAN else []
  wanted = [tuple(c.wants(n) for n in names) for c in captures]
  start = 0
  while start < len(params):
    stop = start + 1
    while stop < len(params) and wanted[stop] == wanted[start]:
      stop += 1
    if stop - start < MIN_SCAN:
      for i in range(start, stop):
        x = block.apply({"params": params[i]}, x, captures[i], out, *args)
    else:
      x = _scan(block, params[start:stop], x, captures[start:stop], out, args)
    start = stop
  return x


# Each block's points, by what decides them (`_block_points`): listing a model's points
# and then tracing each step ask for the same blocks, at 10 to 70 ms of abstract
# evaluation each (workload W's step: 0.13 s of its 0.8 s trace on 2 cores). The
# oldest is dropped first.
KEEP_POINTS = 64
_POINTS: collections.OrderedDict[Hashable, list[str]] = collections.OrderedDict()


def _block_points(block: nn.Module, params: Any, x: Array, args: tuple) -> list[str]:
  """Every point `block` can capture (abstract evaluation: nothing runs), kept
  for the next trace of a block that is the same but for its batch: its fields,
  its parameters', input's (less the batch) and extra arrays' shapes and types,
  and its other arguments' values. A block whose fields or arguments cannot be
  hashed or compared (an array field) is never kept."""
  shape = lambda a: (np.shape(a), str(a.dtype)) if hasattr(a, "dtype") else (None, a)
  leaves, tree = jax.tree.flatten((params, args))
  key = (block, tree, tuple(map(shape, leaves)), np.shape(x)[1:], str(x.dtype))
  try:
    kept = _POINTS.get(key)
  except (TypeError, ValueError):
    key, kept = None, None
  if kept is not None:
    return list(kept)
  abstract = lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype)

  def points(p, x):
    local: dict = {}
    block.apply({"params": p}, x, Capture(None), local, *args)
    return local
  names = list(jax.eval_shape(points, jax.tree.map(abstract, params), abstract(x)))
  if key is not None:
    _POINTS[key] = names
    while len(_POINTS) > KEEP_POINTS:
      _POINTS.popitem(last=False)
  return list(names)


def _scan(block: nn.Module, params: Sequence[Any], x: Array, captures: Sequence[Capture],
          out: dict, args: tuple) -> Array:
  """One `lax.scan` over the blocks. (Eager, a scan is compiled and a run applied
  block by block is not: their roundings differ, so points that split a scan into
  short runs can move the logits by a rounding there; under jit they do not.)"""
  first, order = captures[0], []

  def body(x, p):
    local: dict = {}
    x = block.apply({"params": p}, x, first, local, *args)
    order[:] = local  # the network's order (the scan returns its dict sorted)
    return x, local

  x, stacked = jax.lax.scan(body, x, jax.tree.map(lambda *a: jnp.stack(a), *params))
  for i, c in enumerate(captures):
    for name in order:
      out[c.prefix + name[len(first.prefix):]] = (
          Row(stacked[name], i) if first.reduce is not None
          else jax.tree.map(lambda a, i=i: a[i], stacked[name]))
  return x
