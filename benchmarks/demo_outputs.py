r"""Every analysis's `:demo` output, run and compared across two checkouts.

  python -m benchmarks.demo_outputs run DIR            # each demo into DIR/<config>_<variant>
  python -m benchmarks.demo_outputs compare DIR_A DIR_B [--tol 1e-6] [--rename OLD=NEW[.T] ...]

For refactors that must not change results: run it in the old checkout and in
the new one (same demo-model cache, so the same trained models), then compare
every array of every npz. Prints one line per array and exits 1 if any differs
by more than `--tol` (absolute) or changes shape, dtype or presence. `--rename`
maps an array of DIR_A to its new name in DIR_B (`.T`: transposed there too).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every `:demo*` variant of every config (the demo models are trained once, cached).
DEMOS = (("cka_vit_resnet", "demo"), ("cka_vit_resnet", "demo3"), ("cka_vit_resnet", "demo_mixer"),
         ("attention_distance", "demo"), ("head_subsets", "demo"), ("receptive_field", "demo"),
         ("receptive_field", "demo_mixer"), ("skip_ratio", "demo"), ("skip_ratio", "demo_mixer"),
         ("localization", "demo"), ("localization", "demo_gap"), ("localization", "demo_mixer"),
         ("linear_probe", "demo"), ("linear_probe", "demo_tokens"), ("linear_probe", "demo_mixer"),
         ("skip_ablation", "demo"), ("data_scale", "demo"), ("data_scale", "demo_finetune"))


def run(out_dir: str) -> None:
  for config, variant in DEMOS:
    workdir = os.path.join(os.path.abspath(out_dir), f"{config}_{variant}")
    cmd = [sys.executable, os.path.join(ROOT, "main.py"),
           f"--config={ROOT}/configs/{config}.py:{variant}", f"--workdir={workdir}"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def compare(a: str, b: str, tol: float, rename: dict[str, str]) -> int:
  bad = 0
  for name in sorted(os.listdir(a)):
    files = sorted(f for f in os.listdir(os.path.join(a, name))
                   if f.endswith(".npz") and not f.endswith("_state.npz"))
    for f in files:
      pa, pb = os.path.join(a, name, f), os.path.join(b, name, f)
      if not os.path.exists(pb):
        print(f"MISSING {name}/{f} in {b}")
        bad += 1
        continue
      with np.load(pa) as za, np.load(pb) as zb:
        new = {k: rename.get(k, k) for k in za.files}
        gone = set(zb.files) - {n.removesuffix(".T") for n in new.values()}
        for key in sorted(set(za.files) | gone):
          target = new.get(key, key).removesuffix(".T")
          if key not in za.files or target not in zb.files:
            print(f"MISSING {name}/{f}:{key} in {'ab'[key in za.files]}")
            bad += 1
            continue
          x, y = za[key], zb[target]
          if new[key].endswith(".T"):
            y = y.T
          if x.shape != y.shape or x.dtype != y.dtype:
            print(f"DIFFERS {name}/{f}:{key} {x.shape} {x.dtype} vs {y.shape} {y.dtype}")
            bad += 1
          elif x.dtype.kind in "fc":
            finite = np.isfinite(x) & np.isfinite(y)
            same_inf = np.array_equal(np.isfinite(x), np.isfinite(y)) and np.array_equal(x[~finite], y[~finite])
            diff = float(np.abs(x[finite] - y[finite]).max()) if finite.any() else 0.0
            ok = same_inf and diff <= tol
            bad += not ok
            print(f"{'ok' if ok else 'DIFFERS':7s} {name}/{f}:{key} {x.shape} max |diff| = {diff:.2e}")
          else:
            ok = np.array_equal(x, y)
            bad += not ok
            print(f"{'ok' if ok else 'DIFFERS':7s} {name}/{f}:{key} {x.shape} (exact)")
  print(f"{bad} array(s) differ" if bad else "all arrays agree")
  return int(bad > 0)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="cmd", required=True)
  sub.add_parser("run").add_argument("dir")
  c = sub.add_parser("compare")
  c.add_argument("a")
  c.add_argument("b")
  c.add_argument("--tol", type=float, default=1e-6)
  c.add_argument("--rename", nargs="*", default=[], metavar="OLD=NEW[.T]")
  args = parser.parse_args()
  if args.cmd == "run":
    run(args.dir)
    return 0
  return compare(args.a, args.b, args.tol, dict(r.split("=", 1) for r in args.rename))


if __name__ == "__main__":
  sys.exit(main())
