"""Which named representation points a forward pass keeps (`Capture`), by glob,
and their reduced values stacked (`stacked`)."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


@functools.lru_cache(maxsize=None)
def _glob_regex(pattern: str) -> re.Pattern:
  parts = re.split(r"(\*\*/?|\*|\?|\[[^\]]+\])", pattern)
  table = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
  return re.compile("".join(
      table.get(p, p if p.startswith("[") and len(p) > 2 else re.escape(p)) for p in parts))


def matches(name: str, patterns: Sequence[str]) -> bool:
  """Whether a representation name matches any of the Capture globs."""
  return any(_glob_regex(p).fullmatch(name) for p in patterns)


@dataclasses.dataclass(frozen=True)
class Capture:
  """Which named representation points a forward pass keeps.

  Names read like paths (`block03/attn/out`); `patterns` are globs matched
  against the full name, where `*` stays within one path segment and `**`
  crosses segments: `block*/out` is every block output, `block03/**` all of
  block 3, `**/attn/weights` every attention map. `None` keeps every point.
  Filtering where each tensor is made (not at the end) keeps eager callers from
  holding every activation of the network at once.
  """
  patterns: tuple[str, ...] | None = None
  prefix: str = ""
  # Applied to each kept point where it is made (e.g. its Gram's parts, `grams.layer_parts`):
  # inside a scan over identical blocks (`blocks.run_blocks`) the activation then dies
  # within its block, the reduction is compiled once for the run, and the point's value
  # is a `Row` of the scan's output (`stacked` takes the values of many points at once).
  reduce: Callable[[Array], Any] | None = None

  @classmethod
  def of(cls, spec: "Capture | str | Sequence[str] | None") -> "Capture":
    if isinstance(spec, Capture):
      return spec
    if spec is None:
      return cls(None)
    if isinstance(spec, str):
      spec = (spec,)
    return cls(tuple(spec))

  def child(self, name: str) -> "Capture":
    return dataclasses.replace(self, prefix=f"{self.prefix}{name}/")

  def wants(self, name: str) -> bool:
    if self.patterns is None:
      return True
    full = self.prefix + name
    return matches(full, self.patterns)

  def put(self, out: dict[str, Any], name: str, value: Array) -> Array:
    """Records `value` under its full name if wanted; returns it unchanged."""
    if self.wants(name):
      out[self.prefix + name] = value if self.reduce is None else self.reduce(value)
    return value


@dataclasses.dataclass(frozen=True)
class Row:
  """The value of a point that a scan over identical blocks reduced in each of
  them (`Capture.reduce`): row `index` of the scan's output for that point
  (`stacked`, the blocks on its leading axis), left whole so that `stacked`
  takes many points' values with no slice per block. Sliced out per block and
  point, they were 546 slices in workload W's step, 80 of the 258 kernels XLA
  compiled for it, and 0.6 to 0.7 s of its 5.6 to 5.9 s compile on 2 cores."""
  stacked: Any
  index: int


def stacked(values: Sequence[Any]) -> Any:
  """`values` (pytrees of one structure, or `Row`s of such) on a new leading axis,
  in their order: each scan's output joined whole, so that a leaf takes one
  concatenation and at most one gather, whatever the blocks and points."""
  parts, start, rows, total = [], {}, [], 0
  for v in values:
    if not isinstance(v, Row):
      v = Row(jax.tree.map(lambda a: a[None], v), 0)
    if id(v.stacked) not in start:
      start[id(v.stacked)] = total
      parts.append(v.stacked)
      total += jax.tree.leaves(v.stacked)[0].shape[0]
    rows.append(start[id(v.stacked)] + v.index)
  joined = jax.tree.map(lambda *a: jnp.concatenate(a), *parts)
  if rows == list(range(total)):
    return joined
  return jax.tree.map(lambda a: a[np.asarray(rows)], joined)
