"""benchmarks/accelerator.py at a small scale on CPU: it runs the job once per
Gram precision and prints the table a GPU or TPU session records."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import ROOT, device_env


def test_accelerator_benchmark_runs_and_reports_each_precision():
  r = subprocess.run([sys.executable, f"{ROOT}/benchmarks/accelerator.py", "--pair", "tiny",
                      "--examples", "64", "--batch", "32", "--precisions", "bf16_6x,highest"],
                     cwd=ROOT, env=device_env(1), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  out = r.stdout
  assert re.search(r"device: 1 x \S+ \(cpu\); pair tiny, 64 examples in minibatches of 32", out)
  bound = re.search(r"FLOP bound: ([\d.]+) s = \(([\d.]+) forward \+ ([\d.]+) Gram TFLOP\) / "
                    r"([\d.]+) TFLOP/s", out)
  assert bound and float(bound[4]) > 0, out
  rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("highest |", "bf16_6x |"))]
  assert [row[0] for row in rows] == ["highest", "bf16_6x"]  # the reference first
  highest = rows[0]
  assert float(highest[1]) > 0 and highest[2].endswith("x") and highest[5] == "0.00e+00"
  assert highest[4] == "n/a (not reported)"  # a CPU reports no device memory
  assert rows[1][1].startswith("not run") or float(rows[1][5]) < 1e-3
