"""Every part of a CKA benchmark run by name, each run in a fresh process (so its
peak memory is its own), in this checkout or in another revision's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks import ours
from benchmarks import peers
from benchmarks import references
from benchmarks import torch_side
from benchmarks import workload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name -> the part: `python -m benchmarks.cka_benchmark --part NAME` prints its json.
PARTS = {"ours": ours.part_ours, "gram_dots": ours.part_gram_dots, "reference": references.part_reference,
         "torch_reference": references.part_torch_reference, "weights": torch_side.part_weights,
         "linear": ours.part_step, "measures": lambda s: ours.part_step(s, ours.MEASURED, True),
         **{t: lambda s, t=t: peers.part_peer(s, t) for t in peers.PEERS},
         "torch_cka": lambda s: peers.part_peer(s, "torch-cka")}


def run_part(name: str, s: workload.Setup, root: str = ROOT) -> dict:
  """Part `name` in a fresh process. Another checkout's copy of the benchmark (at
  an older revision) is given only the arguments every revision takes (and, for
  workload resnet18, those of the revisions that have it)."""
  cmd = [sys.executable, "-m", "benchmarks.cka_benchmark", "--part", name,
         "--images", str(s.images), "--batch", str(s.batch)]
  if root != ROOT and s.workload != "W":
    cmd += ["--workload", s.workload, "--size", str(s.size), "--work", s.work]
  if root == ROOT:
    cmd += ["--workload", s.workload, "--size", str(s.size), "--work", s.work, "--cache", s.cache,
            "--device", s.device] + ["--second"] * s.second
  r = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
  if r.returncode:
    raise RuntimeError(f"part {name} failed in {root}:\n{r.stderr[-4000:]}")
  return json.loads(r.stdout.strip().splitlines()[-1])
