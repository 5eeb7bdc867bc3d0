r"""What every similarity measure costs, beside linear CKA, in one run.

  .venv/bin/python -m benchmarks.measures_cost [--layers 55 --batch 256] [--each] [--settings] [--demo [--families]]

The step's measures alone (no forward): `--layers` layers of `--batch` rows
each (features of rank 64 that share a common part, as a network's do), every
measure with its null, compiled once, then timed over `--repeats` calls; with
`--each`, also each measure alone with linear CKA (a measure's share of work
another also needs, such as the eigendecompositions of the subspace family,
counts in each). The defaults are the demo's shape: 55 layers (24 ViT, 31
BiT), minibatches of 256. The step of every measure is then traced once more
(JAX's profiler) for the wall time LAPACK's decompositions (the eigh and SVD
custom calls) take of it: a floor under that step whatever the code around them
(on CPU; on an accelerator, whose decompositions are other calls, the step's times alone).
With `--settings`, the step of every measure is also timed under the settings
that trade what the measures give for time (`SETTINGS`: the null on or off, and
fewer principal components per subspace pair): the choices left for issue 53's
10x, beside the ratios they reach and LAPACK's share of each.

`--demo` times `main.py --config=configs/cka_vit_resnet.py:demo` (linear CKA)
and `:demo_measures` (every measure, the null, 50 bootstrap replicates), each
end to end in a fresh workdir, the demo models cached first: cold (each with an
empty compilation cache of its own, what a first run pays) and then warm (each
again, reading the cache its cold run filled), and prints their ratios (issue
53's target: at most 3x); where each run's time goes (its first step, compile
included; the steps after it; the rest of the process: start, results, figures),
from its progress bar to the second; and how far the cold progress bar's ETA at
its midpoint was from the time that was really left. `--demo --settings` times
instead `:demo_measures` cold under each of the cheaper settings, and as it is,
against the demo cold before and after them: what each setting would do to the
3x end to end. `--demo --families` times `:demo_measures` cold with linear CKA and
one family of measures at a time (`family_sets`), with every measure, and with
every measure but the family that added the most, against the demo cold: what
each family adds end to end (its compile, its steps, its figures), the costs a
smaller set of measures than every one would be chosen by.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _layers(num: int, rows: int, seed: int = 0) -> list[np.ndarray]:
  """`num` (rows, 64) float32 layers: a shared random part mixed differently in each, plus noise."""
  rng = np.random.default_rng(seed)
  shared = rng.standard_normal((rows, 64))
  return [(shared @ rng.standard_normal((64, 64)) + 0.5 * rng.standard_normal((rows, 64))).astype(np.float32)
          for _ in range(num)]


def compiled_step(names: tuple[str, ...], acts: list[np.ndarray], null: bool = True,
                  **fields: Any) -> tuple[Any, tuple, float]:
  """The measures step for `names`, with the null unless not `null` and any other
  config `fields` (e.g. `subspace_dims`), compiled and called once; its
  arguments; and the seconds that took."""
  import jax
  import ml_collections
  from vitcnn_jax.similarity import measures
  rows = len(acts[0])
  config = ml_collections.ConfigDict(dict(measures=names, null=null, batch_size=rows, num_examples=rows,
                                          **fields))
  spec = measures.spec_of(config)
  args = (acts, np.ones((rows,), np.float32), jax.random.PRNGKey(0))
  t = time.perf_counter()
  step = jax.jit(lambda a, m, k: measures.minibatch_sums(a, m, spec, key=k)).lower(*args).compile()
  jax.block_until_ready(step(*args))
  return step, args, time.perf_counter() - t


def mean_seconds(step: Any, args: tuple, repeats: int) -> float:
  """Mean seconds a call of the compiled `step` on `args`, over `repeats` calls."""
  import jax
  t = time.perf_counter()
  for _ in range(repeats):
    jax.block_until_ready(step(*args))
  return (time.perf_counter() - t) / repeats


def step_seconds(names: tuple[str, ...], acts: list[np.ndarray], repeats: int) -> float:
  """Mean seconds a call of the measures step for `names` with the null."""
  step, args, _ = compiled_step(names, acts)
  return mean_seconds(step, args, repeats)


LAPACK_CALL = re.compile(r'%([\w.\-]+) = [^\n]*custom-call\([^\n]*custom_call_target="lapack_')


def lapack_seconds(step: Any, args: tuple, runs: int = 2) -> tuple[float, float]:
  """(wall seconds a call in which LAPACK's custom calls ran, traced seconds a
  call) of a compiled step, from JAX's profiler: each LAPACK call splits its batch
  over XLA's pool without events of its own, so its event's span is all of it."""
  from benchmarks import forward_profile
  hlo = step.as_text()
  lapack = set(LAPACK_CALL.findall(hlo))
  named = set(re.findall(r"%([\w.\-]+) = ", hlo))
  events = [e for e in forward_profile.trace(step, args, runs) if e[2] in named]
  share, idle = forward_profile.wall_shares(events)
  return sum(share.get(n, 0.0) for n in lapack) / runs, (sum(share.values()) + idle) / runs


# Settings of every measure: (the null, principal components per subspace pair; None:
# the default). `DEFAULTS` as the config has them; each of `SETTINGS` costs less, and
# gives something up.
DEFAULTS = (True, None)
SETTINGS = ((True, 16), (True, 8), (False, None), (False, 16), (False, 8))


def setting_fields(null: bool, dims: int | None) -> dict[str, Any]:
  """`compiled_step`'s keyword arguments (and the config's fields) for a setting."""
  return dict(null=null) if dims is None else dict(null=null, subspace_dims=dims)


def setting_label(null: bool, dims: int | None) -> str:
  components = f"subspace_dims {dims}" if dims else "subspace_dims at its default"
  return f"{'with' if null else 'without'} the null, {components}"


def costs(layers: int, batch: int, repeats: int, each: bool, settings: bool = False) -> None:
  """Prints the step's times; LAPACK's share and `settings` on CPU only, where the
  decompositions are LAPACK's."""
  import jax
  from vitcnn_jax.similarity import measures
  acts = _layers(layers, batch)
  print(f"{layers} layers of {batch} rows, every measure with its null, the step alone "
        f"(no forward), mean of {repeats} calls after the first:", flush=True)
  base = step_seconds(("linear_cka",), acts, repeats)
  print(f"  linear_cka alone: {base:.3f} s", flush=True)
  if each:
    for m in measures.NAMES[1:]:
      s = step_seconds(("linear_cka", m), acts, repeats)
      print(f"  + {m}: {s:.3f} s ({s - base:+.3f} s)", flush=True)
  step, args, compile_s = compiled_step(measures.NAMES, acts)
  s = mean_seconds(step, args, repeats)
  print(f"  every measure: {s:.3f} s ({s / base:.1f}x linear CKA alone; compiled in {compile_s:.1f} s)",
        flush=True)
  if jax.default_backend() != "cpu":  # its decompositions are other custom calls, on the device
    print(f"  (LAPACK's share, and --settings, on CPU only: this ran on {jax.default_backend()})", flush=True)
    return
  lapack, traced = lapack_seconds(step, args)
  print(f"  of which LAPACK's decompositions (eigh, SVD), traced: {lapack:.3g} s of {traced:.3g} s a call "
        f"(alone {lapack / base:.1f}x linear CKA alone)", flush=True)
  if not settings:
    return

  def report(setting: tuple[bool, int | None], s: float, lapack: float, compile_s: float) -> None:
    print(f"  {setting_label(*setting)}: {s:.3f} s = {s / base:.1f}x; LAPACK alone {lapack / base:.1f}x "
          f"(compiled in {compile_s:.1f} s)", flush=True)
  print("every measure under cheaper settings, against linear CKA alone with its null (the target: 10x):",
        flush=True)
  report(DEFAULTS, s, lapack, compile_s)  # the step timed above
  for setting in SETTINGS:
    step, args, compile_s = compiled_step(measures.NAMES, acts, **setting_fields(*setting))
    report(setting, mean_seconds(step, args, repeats), lapack_seconds(step, args)[0], compile_s)


def _timed_main(variant: str, workdir: str, cache: str, **fields: Any) -> tuple[float, str]:
  """Seconds of one run of `variant` end to end in `workdir`, JAX's compilation
  cache in folder `cache`, its config `fields` set by flags; and its stderr."""
  t = time.perf_counter()
  done = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"),
                         f"--config=configs/cka_vit_resnet.py:{variant}", f"--workdir={workdir}",
                         f"--config.compilation_cache={cache}", *(f"--config.{k}={v}" for k, v in fields.items())],
                        cwd=ROOT, capture_output=True, text=True)
  if done.returncode:
    raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
  return time.perf_counter() - t, done.stderr


def _bar_rows(log: str) -> list[tuple[int, int, int, int]]:
  """The CKA job's tqdm lines: (step, steps, elapsed s, ETA s), to the second as the bar prints them."""
  clock = lambda h: sum(int(v) * 60 ** i for i, v in enumerate(reversed(h.split(":"))))
  return [(int(n), int(total), clock(elapsed), clock(left)) for n, total, elapsed, left in
          re.findall(r"^cka:.*?(\d+)/(\d+) \[([\d:]+)<([\d:]+)", log.replace("\r", "\n"), re.M)]


def midpoint_eta(log: str) -> tuple[int, int, int, int]:
  """From the CKA job's tqdm output: (step, steps, its ETA in s at the midpoint
  step, the seconds that were really left)."""
  rows = _bar_rows(log)
  end = max(r[2] for r in rows)
  n, total, elapsed, left = [r for r in rows if r[0] == rows[-1][1] // 2][-1]
  return n, total, left, end - elapsed


def bar_phases(log: str) -> tuple[int, int, int]:
  """From the CKA job's tqdm output: (seconds to its first step, that step's
  compile included; seconds of the steps after it; how many those were)."""
  rows = _bar_rows(log)
  first = max(r[2] for r in rows if r[0] == 1)
  return first, max(r[2] for r in rows) - first, rows[-1][1] - 1


def phases_text(seconds: float, log: str) -> str:
  """Where a run of `seconds` went, from its tqdm output `log` (`bar_phases`)."""
  first, rest, steps = bar_phases(log)
  return (f"first step {first} s (its compile included), the {steps} after it {rest} s "
          f"({rest / steps:.2f} s a step), outside the bar {seconds - first - rest:.1f} s")


@contextlib.contextmanager
def _demo_runs() -> Iterator[Callable[..., str]]:
  """Paths in a temporary folder for a benchmark's runs of the demo job, after a
  first run there has trained the demo models (if they were not cached)."""
  with tempfile.TemporaryDirectory() as work:
    at = lambda *name: os.path.join(work, *name)
    _timed_main("demo", at("first"), at("cache", "first"))
    yield at


def demo() -> None:
  with _demo_runs() as at:
    times, logs = {}, {}
    for state in ("cold", "warm"):  # the warm runs read the caches their cold runs filled
      for variant in ("demo", "demo_measures"):
        times[state, variant], logs[state, variant] = _timed_main(variant, at(state, variant),
                                                                  at("cache", variant))
  for state in ("cold", "warm"):
    linear, every = times[state, "demo"], times[state, "demo_measures"]
    print(f"{state} compilation cache: demo (linear CKA) {linear:.1f} s end to end; demo_measures "
          f"(every measure, the null, 50 bootstrap replicates) {every:.1f} s -> {every / linear:.2f}x "
          f"(target <= 3x)")
    for variant in ("demo", "demo_measures"):  # where the time goes
      print(f"  {variant}: {phases_text(times[state, variant], logs[state, variant])}")
    print(f"  -> 3x demo is {3 * linear:.1f} s, of which demo_measures' steps after its first take "
          f"{bar_phases(logs[state, 'demo_measures'])[1]} s")
  n, total, eta, left = midpoint_eta(logs["cold", "demo_measures"])
  print(f"demo_measures' progress bar (cold) at step {n} of {total}: ETA {eta} s, really left {left} s "
        f"({abs(eta - left) / max(left, 1):.0%} off; target <= 25%)")


def demo_settings() -> None:
  """`:demo_measures` under each of `SETTINGS`, and as it is, each cold (an
  empty compilation cache of its own), against the demo run cold before and after them."""
  with _demo_runs() as at:
    before, _ = _timed_main("demo", at("demo_before"), at("cache", "demo_before"))
    runs = []
    for i, setting in enumerate((DEFAULTS, *SETTINGS)):
      seconds, _ = _timed_main("demo_measures", at(f"setting{i}"), at("cache", f"setting{i}"),
                               **setting_fields(*setting))
      runs.append((setting, seconds))
    after, _ = _timed_main("demo", at("demo_after"), at("cache", "demo_after"))
  linear = (before + after) / 2
  print(f"cold compilation caches: demo (linear CKA) {before:.1f} s before the runs below, {after:.1f} s after "
        f"(their mean {linear:.1f} s: 3x is {3 * linear:.1f} s); demo_measures (every measure, 50 bootstrap "
        f"replicates):")
  for setting, seconds in runs:
    print(f"  {setting_label(*setting)}: {seconds:.1f} s -> {seconds / linear:.2f}x (target <= 3x)")


def family_sets() -> list[tuple[str, ...]]:
  """The measures of each `--families` run: linear CKA (what the ratio's demo
  computes), and with it each other family of `measures.FAMILIES` in turn."""
  from vitcnn_jax.similarity import measures
  return [tuple(dict.fromkeys(("linear_cka", *family.names))) for family in measures.FAMILIES]


def demo_families() -> None:
  """`:demo_measures` (the null, 50 bootstrap replicates) with each of
  `family_sets`, with every measure, and with every measure but the family that
  added the most, each cold (an empty compilation cache of its own), against the
  demo cold."""
  from vitcnn_jax.similarity import measures
  with _demo_runs() as at:
    linear, _ = _timed_main("demo", at("demo"), at("cache", "demo"))
    runs = []

    def run(names: tuple[str, ...] | None, label: str) -> None:  # None: every measure, as the variant has it
      fields = {} if names is None else {"measures": names}
      seconds, log = _timed_main("demo_measures", at(f"set{len(runs)}"), at("cache", f"set{len(runs)}"), **fields)
      runs.append((label, seconds, phases_text(seconds, log)))
    sets = family_sets()
    for names in sets:
      run(names, "linear_cka alone" if len(names) == 1 else "linear_cka + " + ", ".join(names[1:]))
    run(None, "every measure")
    costliest = max(range(1, len(sets)), key=lambda i: runs[i][1])  # and every measure but that family
    run(tuple(m for m in measures.NAMES if m not in sets[costliest][1:]),
        "every measure but " + ", ".join(sets[costliest][1:]))
  print(f"cold compilation caches: demo (linear CKA) {linear:.1f} s end to end (3x is {3 * linear:.1f} s); "
        "demo_measures (the null, 50 bootstrap replicates) with:")
  base = runs[0][1]
  for i, (label, seconds, phases) in enumerate(runs):
    more = f" ({seconds - base:+.1f} s)" if i else ""
    print(f"  {label}: {seconds:.1f} s = {seconds / linear:.2f}x{more}; {phases}")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--layers", type=int, default=55)
  ap.add_argument("--batch", type=int, default=256)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--each", action="store_true", help="also each measure alone with linear CKA")
  ap.add_argument("--settings", action="store_true",
                  help="also every measure under cheaper settings (with --demo: only those, end to end)")
  ap.add_argument("--demo", action="store_true", help="instead time the demo and demo_measures end to end")
  ap.add_argument("--families", action="store_true",
                  help="with --demo: demo_measures with linear CKA and one family of measures at a time")
  args = ap.parse_args()
  if args.families and not (args.demo and not args.settings):
    ap.error("--families goes with --demo alone (not --settings): it times demo_measures runs")
  if args.demo:
    demo_families() if args.families else demo_settings() if args.settings else demo()
  else:
    from benchmarks import forward_profile
    forward_profile.trace_events_on()  # for `lapack_seconds`
    costs(args.layers, args.batch, args.repeats, args.each, args.settings)


if __name__ == "__main__":
  main()
