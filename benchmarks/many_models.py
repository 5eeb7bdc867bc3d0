r"""Many models from kept passes against one fused run, side by side, end to end.

  python -m benchmarks.many_models [--measures linear_cka|every] [--examples 512] [--batch 256]

On `configs/many_models.py:demo`'s models (each block's output, 512 photo crops
in minibatches of 256, one repeat, no calibration draws: the fused run has
none), each step a fresh process (`python main.py`, compile included):

- each model's pass alone (`keep_only`), the comparison of all of them from the
  kept passes, one many_models job doing both, and the fused CKA job on the same
  models, measures and images: the ratios to the fused job;
- a ninth model added to a finished comparison of eight (its pass and its eight
  pairs) against its pass alone, for a small model (the medians of `--rounds`
  alternating rounds) and for the slowest (one round), and the comparison's
  cost per new layer pair;
- the comparison's peak memory (the process's) with 4 and with 8 models.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = '''"""The many-model demo's models, `:NAME+NAME...` of them, for benchmarks/many_models.py."""
from configs import many_models


def get_config(arg):
  names, measures = arg.split(":")
  config = many_models.get_config("demo,examples={examples},batch={batch},draws=0")
  config.models = {{k: v for k, v in config.models.items() if k in names.split("+")}}
  if measures == "every":
    from configs.cka_vit_resnet import MEASURES
    config.measures, config.null = tuple(MEASURES), True
  else:
    config.measures = (measures,)
  if {fused}:  # the CKA job on the same models, measures and images
    from configs import common
    fused = common.analysis("cka")
    for field in ("models", "data", "measures", "null", "num_examples", "batch_size", "repeats", "seed", "knn_k"):
      fused[field] = config[field]
    return fused
  return config
'''


def _main_py(folder: str, config: str, arg: str, workdir: str, *flags: str) -> tuple[float, float]:
  """(seconds, peak resident GiB) of `python main.py` with `config:arg` in a new process."""
  cmd = [sys.executable, os.path.join(ROOT, "main.py"), f"--config={os.path.join(folder, config)}:{arg}",
         f"--workdir={workdir}", *flags]
  start = time.perf_counter()
  with tempfile.TemporaryFile("w+") as err:
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, text=True)
    _, status, usage = os.wait4(p.pid, 0)  # this child's own peak, not the largest of all children
    seconds = time.perf_counter() - start
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
      err.seek(0)
      raise SystemExit(f"{' '.join(cmd)} failed:\n{err.read()[-3000:]}")
  return seconds, usage.ru_maxrss / 2**20


def _layers(kept_dir: str, name: str) -> int:
  import json
  with open(os.path.join(kept_dir, name, "manifest.json")) as f:
    return len(json.load(f)["model"]["points"])


class Runs:
  """The benchmark's runs of one measure set, each `python main.py` in a new process."""

  def __init__(self, folder: str, measures: str, names: list[str]):
    self.folder, self.measures, self.names = folder, measures, names
    self.kept_dir = os.path.join(folder, "kept")

  def job(self, names: list[str], workdir: str, *flags: str, fused: bool = False) -> tuple[float, float]:
    return _main_py(self.folder, "fused.py" if fused else "kept.py", f"{'+'.join(names)}:{self.measures}",
                    os.path.join(self.folder, workdir), *flags)

  def keep(self, name: str, kept_dir: str) -> float:
    """One model's pass alone (a job keeping it and nothing else)."""
    return self.job([name], f"pass_{name}_{os.path.basename(kept_dir)}", "--config.keep_only=True",
                    f"--config.kept_dir={kept_dir}")[0]

  def ninth(self, name: str, rounds: int) -> str:
    """`name` added to a finished comparison of eight others (their kept passes
    linked, its own run in the added job), against its pass alone: the medians
    of `rounds` alternating rounds (a job of seconds varies by as much as the
    fixed costs it is judged on), each round from no pass of `name`."""
    others = [n for n in self.names if n != name][:8]
    kept_dir = os.path.join(self.folder, f"kept_for_{name}")
    os.makedirs(kept_dir)
    for n in others:
      os.symlink(os.path.join(self.kept_dir, n), os.path.join(kept_dir, n))
    self.job(others, f"eight_{name}", f"--config.kept_dir={kept_dir}")
    alone, added = [], []
    for r in range(rounds):
      alone.append(self.keep(name, os.path.join(self.folder, f"alone_{name}_{r}")))
      shutil.rmtree(os.path.join(kept_dir, name), ignore_errors=True)  # the added job keeps it again
      for f in glob.glob(os.path.join(self.folder, f"eight_{name}", "pairs", f"*{name}*")):
        os.remove(f)  # and combines its pairs again
      added.append(self.job(others + [name], f"eight_{name}", f"--config.kept_dir={kept_dir}")[0])
    one, both = statistics.median(alone), statistics.median(added)
    pairs = _layers(self.kept_dir, name) * sum(_layers(self.kept_dir, n) for n in others)
    return (f"{name} added to a finished comparison of eight: {both:.1f} s; its pass alone {one:.1f} s "
            f"(medians of {rounds} alternating rounds: {', '.join(f'{x:.1f}' for x in added)} and "
            f"{', '.join(f'{x:.1f}' for x in alone)} s): {both / one:.2f}x (target <= 1.3x); {pairs} new layer "
            f"pairs: {1e3 * (both - one) / max(pairs, 1):+.2f} ms each beyond its pass (below 0: within the "
            "runs' variation)")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--measures", default="linear_cka", help="linear_cka, another measure's name, or every")
  parser.add_argument("--examples", type=int, default=512)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--memory_only", action="store_true", help="the passes, then the memory part alone")
  parser.add_argument("--rounds", type=int, default=3,
                      help="alternating rounds of a small model added and alone (the slowest: one)")
  args = parser.parse_args()
  from configs import many_models
  names = list(many_models.get_config("demo").models)
  folder = tempfile.mkdtemp(prefix="many_models_bench_")
  for fused in (False, True):
    with open(os.path.join(folder, "fused.py" if fused else "kept.py"), "w") as f:
      f.write(CONFIG.format(examples=args.examples, batch=args.batch, fused=fused))
  runs = Runs(folder, args.measures, names)
  print(f"{len(names)} models ({', '.join(names)}), each block's output, {args.examples} examples in "
        f"minibatches of {args.batch}, measures: {args.measures}; every run a new process, compile included:")
  passes = {name: runs.keep(name, runs.kept_dir) for name in names}
  for name, seconds in passes.items():
    print(f"  pass of {name:16s} {seconds:7.1f} s")
  if args.memory_only:
    print(memory(runs, passes))
    return
  compared = runs.job(names, "compared", f"--config.kept_dir={runs.kept_dir}")
  one_job = runs.job(names, "one_job")
  fused = runs.job(names, "fused", fused=True)
  print(f"  comparison of all {len(names)} from their kept passes {compared[0]:7.1f} s (peak {compared[1]:.2f} GiB)")
  print(f"fused CKA job: {fused[0]:.1f} s (peak {fused[1]:.2f} GiB)")
  print(f"one many_models job (every pass kept, then compared): {one_job[0]:.1f} s (peak {one_job[1]:.2f} GiB): "
        f"{one_job[0] / fused[0]:.2f}x the fused job (target <= 1.1x)")
  total = sum(passes.values()) + compared[0]
  print(f"a job per pass, then a comparing job: {total:.1f} s in all: {total / fused[0]:.2f}x the fused job")
  for name, rounds in ((names[-1], args.rounds), (max(passes, key=passes.get), 1)):  # a small model, the slowest
    print(runs.ninth(name, rounds))
  print(memory(runs, passes))


def memory(runs: Runs, passes: dict[str, float]) -> str:
  """The comparison's peak memory with 4 and with 8 models, both sets holding the
  two slowest models (so the same largest pair: a pair's two passes are what a
  comparison holds at once, however many models there are)."""
  big = sorted(passes, key=passes.get)[-2:]
  small = [n for n in runs.names if n not in big]
  four = runs.job(big + small[:2], "four", f"--config.kept_dir={runs.kept_dir}")
  eight = runs.job(big + small[:6], "eight", f"--config.kept_dir={runs.kept_dir}")
  return (f"comparison's peak memory (its process; both sets with {' and '.join(big)}): 4 models "
          f"{four[1]:.3f} GiB, 8 models {eight[1]:.3f} GiB: {eight[1] / four[1]:.3f}x (target <= 1.10x)")


if __name__ == "__main__":
  main()
