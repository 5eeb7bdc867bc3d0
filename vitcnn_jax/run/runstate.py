"""Where a run stands, saved so that it resumes: finished sums per pass and repeat,
the open repeat's sums, the position, and the run's identity (what determines
its result), which a resumed state must match part by part."""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Sequence

import jax
import ml_collections
import numpy as np

from vitcnn_jax.inputs import data
from vitcnn_jax.models.formats import arrays
from vitcnn_jax.run import control
from vitcnn_jax.run import progress
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results


FETCH_EVERY = 32  # steps whose device results are fetched to the host together
# Steps dispatched and not yet finished at most: enough to keep the device busy
# while the host reads the next minibatch; the progress bar counts finished ones.
IN_FLIGHT = 2


def identity(config: ml_collections.ConfigDict, models: dict, sources: dict[str, data.Source]) -> dict:
  """What determines a run's result, by part. Checkpoints and data count by their
  contents, not their paths."""
  cfg = config.to_dict()
  for volatile in control.VOLATILE:
    cfg.pop(volatile, None)
  return {"config": results.fingerprint(cfg),
          "data": " | ".join(s.identity for s in sources.values()),
          "device count": jax.device_count(),
          "checkpoints": {k: arrays.digest(m.path) for k, m in models.items()},
          "representation points": results.fingerprint({k: m.names for k, m in models.items()})}


def add(sums: protocol.Sums, got: protocol.Sums) -> protocol.Sums:
  """Step results into the host sums, float64; valid rows appended for `rows/` keys."""
  keep = np.asarray(got.pop(protocol.ROWS_MASK, ())) > 0
  out = dict(sums)
  for k, v in got.items():
    v = np.asarray(v, np.float64)
    if k.startswith(protocol.ROWS):
      out[k] = np.concatenate([sums[k], v[keep]]) if k in sums else v[keep]
    else:
      out[k] = sums.get(k, 0.0) + v
  return out


def examples(config: ml_collections.ConfigDict, passes: Sequence[protocol.Pass],
             sources: dict[str, data.Source]) -> list[list[tuple[str, np.ndarray]]]:
  """(source name, indices) of every repeat of every pass: the pass's own choice,
  or `config.num_examples` sampled from "data", a new draw each repeat."""
  def of(p: protocol.Pass, repeat: int) -> tuple[str, np.ndarray]:
    chosen = p.examples(repeat, sources)
    if chosen is not None:
      return chosen
    return "data", data.sample(len(sources["data"]), config.num_examples, config.seed, repeat)
  return [[of(p, r) for r in range(p.repeats)] for p in passes]


class Bootstrap:
  """Poisson bootstrap over minibatches, streaming: each minibatch's `boot/X` sums
  enter `replicates` copies of X, weighted by Poisson(1) draws seeded by (seed,
  pass, repeat, minibatch), so memory does not grow with the examples and a run
  on any device count draws the same weights."""

  def __init__(self, seed: int, replicates: int, pooled: dict[int, protocol.Sums]):
    self.seed, self.replicates, self.pooled = seed, replicates, pooled

  def weights(self, p: int, repeat: int, first: int, count: int) -> np.ndarray:
    """(replicates, count) draws of minibatches first .. first + count - 1."""
    return np.stack([np.random.default_rng((self.seed, p, repeat, m)).poisson(1.0, self.replicates)
                     for m in range(first, first + count)], axis=1).astype(np.float64)

  def add(self, sums: protocol.Sums, got: protocol.Sums, p: int, repeat: int, first: int
          ) -> protocol.Sums:
    """`add`, with each `boot/X` (minibatches, ...) summed into X and, weighted, into
    the replicates of X pooled over the repeats of pass `p`."""
    boot = {k[len(protocol.BOOT):]: np.asarray(v, np.float64) for k, v in got.items()
            if k.startswith(protocol.BOOT)}
    if boot and self.replicates:
      w = self.weights(p, repeat, first, len(next(iter(boot.values()))))
      pooled = self.pooled.setdefault(p, {})
      for k, v in boot.items():
        pooled[k] = pooled.get(k, 0.0) + np.tensordot(w, v, axes=(1, 0))
    rest = {k: v for k, v in got.items() if not k.startswith(protocol.BOOT)}
    return add(sums, {**rest, **{k: v.sum(axis=0) for k, v in boot.items()}})


class State:
  """Finished sums per pass and repeat, the open repeat's sums and the position
  (pass, repeat, step) of the next step, read from `path` if a run of the same
  identity left one; written there (by process 0, `writes`) as the run goes."""

  def __init__(self, path: str, identity_: dict, writes: bool = True):
    self.path, self.identity, self.writes = path, identity_, writes
    saved = results.read_state(path, identity_) or {}
    self.position = tuple(int(v) for v in saved.get("position", (0, 0, 0)))
    self.done: list[list[protocol.Sums]] = []
    self.open: protocol.Sums = {}
    self.pooled: dict[int, protocol.Sums] = {}  # pass -> bootstrap replicates (`Bootstrap`)
    for key, value in saved.items():
      kind, *where = key.split("/")
      if kind == "pooled":
        self.pooled.setdefault(int(where[0]), {})["/".join(where[1:])] = value
      elif kind == "done":
        p, r, name = int(where[0]), int(where[1]), "/".join(where[2:])
        while len(self.done) <= p:
          self.done.append([])
        while len(self.done[p]) <= r:
          self.done[p].append({})
        self.done[p][r][name] = value
      elif kind == "open":
        self.open["/".join(where)] = value

  def start(self, p: int, repeat: int) -> tuple[int, protocol.Sums]:
    """(first step, sums so far) of repeat `repeat` of pass `p`."""
    while len(self.done) <= p:
      self.done.append([])
    if (p, repeat) != self.position[:2] or not self.position[2]:
      return 0, {}
    return self.position[2], {k: np.asarray(v, np.float64) for k, v in self.open.items()}

  def save(self, p: int, repeat: int, step: int, sums: protocol.Sums) -> None:
    """The open repeat stands at `step` with `sums`."""
    self.position, self.open = (p, repeat, step), sums
    self._write()

  def finish(self, p: int, repeat: int, repeats: int, sums: protocol.Sums) -> None:
    """Repeat `repeat` (of `repeats`) of pass `p` is done with `sums`."""
    self.done[p].append(sums)
    self.position = (p, repeat + 1, 0) if repeat + 1 < repeats else (p + 1, 0, 0)
    self.open = {}
    self._write()

  def _write(self) -> None:
    if not self.writes:
      return
    arrays = {f"done/{p}/{r}/{k}": v for p, reps in enumerate(self.done)
              for r, sums in enumerate(reps) for k, v in sums.items()}
    arrays.update({f"open/{k}": v for k, v in self.open.items()})
    arrays.update({f"pooled/{p}/{k}": v for p, sums in self.pooled.items() for k, v in sums.items()})
    results.write_npz(self.path, identity=json.dumps(self.identity, default=str),
                      position=np.asarray(self.position), **arrays)


@dataclasses.dataclass
class Pending:
  """A dispatched step: its first minibatch, its result, its examples, and
  `again`, that step with its layers prescaled (None once it is counted)."""
  first: int
  result: protocol.Sums
  examples: int
  again: Callable[[], protocol.Sums] | None


class Steps:
  """One repeat's step results, fetched to the host in groups and added in step
  order (`boot/` sums also into the pass's bootstrap replicates). The progress
  bar counts a step when its result is ready, not when it is dispatched: with
  every measure at batch 256 a step took 13 s to dispatch and a minute to run,
  and a bar of dispatched steps sat at 28 of 30 for minutes, its ETA 3x short.
  At most `IN_FLIGHT` steps run ahead of the bar."""

  def __init__(self, p: protocol.Pass, sums: protocol.Sums, boot: "Bootstrap", where: tuple,
               bar: progress.Bar):
    self.p, self.sums, self.boot, self.where, self.bar = p, sums, boot, where, bar
    self.pending: list[Pending] = []
    self.counted = 0  # how many of `pending` the bar has

  def add(self, result, first: int, examples: int, again: Callable[[], protocol.Sums]) -> None:
    """`result` of the step whose first minibatch is `first`, over `examples`
    examples; `again()`: that step with its layers prescaled (`grams.Parts`), run
    in its place where `result` says a layer left float32's range
    (`protocol.unfit`), then let go with the minibatch it holds."""
    self.pending.append(Pending(first, result, examples, again))
    self._count(IN_FLIGHT)
    if len(self.pending) >= FETCH_EVERY:
      self.fetch()

  def _count(self, ahead: int) -> None:
    """Advances the bar over the finished steps, in order, waiting for the oldest
    while more than `ahead` are unfinished."""
    while self.counted < len(self.pending):
      step = self.pending[self.counted]
      if len(self.pending) - self.counted > ahead:
        jax.block_until_ready(step.result)
      elif not all(a.is_ready() for a in jax.tree.leaves(step.result)):
        return
      if protocol.unfit(step.result):
        step.result = jax.block_until_ready(step.again())
      step.again = None
      self.bar.update(1, step.examples)
      self.counted += 1

  def fetch(self) -> protocol.Sums:
    self._count(0)
    got = jax.device_get([step.result for step in self.pending])  # one transfer
    for step, g in zip(self.pending, got):
      self.sums = self.boot.add(self.sums, self.p.host_sums(g), *self.where, step.first)
    self.pending.clear()
    self.counted = 0
    return self.sums
