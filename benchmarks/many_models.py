r"""Many models from kept passes against one fused run, side by side, end to end.

  python -m benchmarks.many_models [--measures linear_cka|every] [--examples 512] [--batch 256]

On `configs/many_models.py:demo`'s models (each block's output, 512 photo crops
in minibatches of 256, one repeat, no calibration draws: the fused run has
none), each step a fresh process (`python main.py`, compile included):

- each model's pass alone (`keep_only`), the comparison of all of them from the
  kept passes, their total, and the fused CKA job on the same models, measures
  and images: the ratio kept / fused;
- a ninth model added to a finished comparison of eight (its pass and its eight
  pairs) against its pass alone, and the comparison's cost per new layer pair;
- the comparison's peak memory (the process's) with 4 and with 8 models.
"""

from __future__ import annotations

import argparse
import os
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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--measures", default="linear_cka", help="linear_cka, another measure's name, or every")
  parser.add_argument("--examples", type=int, default=512)
  parser.add_argument("--batch", type=int, default=256)
  args = parser.parse_args()
  from configs import many_models
  names = list(many_models.get_config("demo").models)
  folder = tempfile.mkdtemp(prefix="many_models_bench_")
  for fused in (False, True):
    with open(os.path.join(folder, "fused.py" if fused else "kept.py"), "w") as f:
      f.write(CONFIG.format(examples=args.examples, batch=args.batch, fused=fused))
  kept_dir = os.path.join(folder, "kept")
  m = args.measures
  print(f"{len(names)} models ({', '.join(names)}), each block's output, {args.examples} examples in "
        f"minibatches of {args.batch}, measures: {m}; every step a new process, compile included:")
  passes = {}
  for name in names[:8] + names[9:]:
    passes[name] = _main_py(folder, "kept.py", f"{name}:{m}", os.path.join(folder, f"pass_{name}"),
                            "--config.keep_only=True", f"--config.kept_dir={kept_dir}")[0]
    print(f"  pass of {name:16s} {passes[name]:7.1f} s")
  four = _main_py(folder, "kept.py", f"{'+'.join(names[:4])}:{m}", os.path.join(folder, "four"),
                  f"--config.kept_dir={kept_dir}")
  eight = _main_py(folder, "kept.py", f"{'+'.join(names[:8])}:{m}", os.path.join(folder, "eight"),
                   f"--config.kept_dir={kept_dir}")
  added = _main_py(folder, "kept.py", f"{'+'.join(names[:9])}:{m}", os.path.join(folder, "eight"),
                   f"--config.kept_dir={kept_dir}")
  alone = _main_py(folder, "kept.py", f"{names[8]}:{m}", os.path.join(folder, "ninth_alone"),
                   "--config.keep_only=True", f"--config.kept_dir={os.path.join(folder, 'kept_ninth')}")[0]
  passes[names[8]] = alone
  every = _main_py(folder, "kept.py", f"{'+'.join(names)}:{m}", os.path.join(folder, "all"),
                   f"--config.kept_dir={kept_dir}")
  fused = _main_py(folder, "fused.py", f"{'+'.join(names)}:{m}", os.path.join(folder, "fused"))
  total = sum(passes.values()) + every[0]
  print(f"  comparison of all {len(names)} from their kept passes {every[0]:7.1f} s "
        f"(peak {every[1]:.2f} GiB)")
  print(f"kept passes in all: {total:.1f} s; fused CKA job: {fused[0]:.1f} s (peak {fused[1]:.2f} GiB): "
        f"kept / fused = {total / fused[0]:.2f}x (target <= 1.1x)")
  new_pairs = _layers(kept_dir, names[8]) * sum(_layers(kept_dir, n) for n in names[:8])
  print(f"ninth model ({names[8]}) added to eight: {added[0]:.1f} s; its pass alone {alone:.1f} s: "
        f"{added[0] / alone:.2f}x (target <= 1.3x); {new_pairs} new layer pairs: "
        f"{1e3 * max(added[0] - alone, 0.0) / max(new_pairs, 1):.2f} ms each beyond its pass")
  print(f"comparison's peak memory (its process): 4 models {four[1]:.3f} GiB, 8 models {eight[1]:.3f} GiB: "
        f"{eight[1] / four[1]:.3f}x (target <= 1.10x)")


if __name__ == "__main__":
  main()
