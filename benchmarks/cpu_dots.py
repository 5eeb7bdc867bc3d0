r"""The dots our CPU runs depend on, as XLA:CPU runs them two ways and torch one, side by side.

  .venv/bin/python -m benchmarks.cpu_dots [--runs 20] [--rounds 2]

XLA:CPU gives a dot that stands alone to YNNPACK unless
`--xla_cpu_experimental_ynn_fusion_type=-individual_dot` (`vitcnn_jax.CPU_DOTS`,
which importing vitcnn_jax sets) leaves it to Eigen's contraction. The flag is
read once a process, so each way runs in a process of its own (`--rounds` times,
alternating; each shape's best time over them), and torch's matmul, a peer's, in
a third. The shapes: the Grams of W's layers (32 rows) and of 1,000-row
minibatches, the measures' all-pairs products of flattened Grams, and a ViT-B/16
block's attention logits and MLP dense at W's minibatch. Prints each one's best
time, its GFLOP/s, and YNNPACK's and torch's times over Eigen's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from benchmarks import clocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# label -> (einsum, operand shapes; a single operand is multiplied by itself, as a Gram)
SHAPES = {
    "Gram, ViT-B/16 layer at W's minibatch (32 x 150,528)": ("nd,md->nm", [(32, 150528)]),
    "Gram, BiT-R50 unit sublayer at W's minibatch (32 x 200,704)": ("nd,md->nm", [(32, 200704)]),
    "Gram, ResNet-18 layer at 1,000 rows (1,000 x 16,384)": ("nd,md->nm", [(1000, 16384)]),
    "Gram, 1,024 rows (1,024 x 4,096)": ("nd,md->nm", [(1024, 4096)]),
    "all pairs of 55 flattened Grams of 256 rows": ("ld,md->lm", [(55, 65536)]),
    "ViT-B/16 attention logits at W's minibatch": ("bhqd,bhkd->bhqk", [(32, 12, 197, 64)]),
    "ViT-B/16 MLP dense at W's minibatch": ("nd,de->ne", [(6304, 768), (768, 3072)]),
}
WAYS = ("xla YNNPACK", "xla Eigen", "torch")
_YNN = "--xla_cpu_experimental_ynn_fusion_type=+individual_dot"


def _operands(shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
  rng = np.random.default_rng(0)
  return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _flops(spec: str, shapes: list[tuple[int, ...]]) -> float:
  """2 x the product of every index's size (each appears in some operand)."""
  sizes = {}
  for term, shape in zip(spec.split("->")[0].split(","), shapes * 2):
    sizes.update(zip(term, shape))
  return 2.0 * float(np.prod(list(sizes.values())))


def part(way: str, runs: int) -> dict[str, float]:
  """Each shape's best seconds, the XLA ways through vitcnn_jax's import (which
  sets the flag unless the environment chose), torch's matmul otherwise."""
  out = {}
  if way == "torch":
    import torch
    for label, (spec, shapes) in SHAPES.items():
      xs = [torch.from_numpy(a) for a in _operands(shapes)]
      xs = xs * 2 if len(xs) == 1 else xs
      out[label] = clocks.best_seconds(lambda spec=spec, xs=xs: torch.einsum(spec, *xs), runs)
    return out
  import jax
  import jax.numpy as jnp

  import vitcnn_jax  # noqa: F401  (its import chooses the dots' library, before jax starts)
  for label, (spec, shapes) in SHAPES.items():
    xs = [jnp.asarray(a) for a in _operands(shapes)]
    f = jax.jit(lambda *xs, spec=spec: jnp.einsum(spec, *(xs * 2 if len(xs) == 1 else xs),
                                                  precision=jax.lax.Precision.HIGHEST))
    out[label] = clocks.best_seconds(lambda f=f, xs=xs: jax.block_until_ready(f(*xs)), runs)
  return out


def _run_part(way: str, runs: int) -> dict[str, float]:
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if "ynn_fusion_type" not in f]
  env["XLA_FLAGS"] = " ".join(flags + ([_YNN] if way == "xla YNNPACK" else []))
  done = subprocess.run([sys.executable, "-m", "benchmarks.cpu_dots", "--part", way, "--runs", str(runs)],
                        cwd=ROOT, env=env, capture_output=True, text=True)
  if done.returncode:
    raise SystemExit(f"{way} failed:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--runs", type=int, default=20, help="timed calls of each shape in a process")
  ap.add_argument("--rounds", type=int, default=2, help="processes of each way, alternating")
  ap.add_argument("--part", default="", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.part:
    print(json.dumps(part(args.part, args.runs)))
    return
  best = {w: {} for w in WAYS}
  for _ in range(args.rounds):
    for way in WAYS:
      for label, s in _run_part(way, args.runs).items():
        best[way][label] = min(s, best[way].get(label, float("inf")))
  print(f"best of {args.rounds} processes of each way, {args.runs} calls each; float32 (XLA at HIGHEST):")
  for label, (spec, shapes) in SHAPES.items():
    flops = _flops(spec, shapes)
    ynn, eigen, torch = (best[w][label] for w in WAYS)
    print(f"  {label}:\n    " + ", ".join(f"{w} {best[w][label] * 1e3:.2f} ms ({flops / best[w][label] / 1e9:.0f} "
                                          f"GFLOP/s)" for w in WAYS)
          + f"\n    YNNPACK / Eigen {ynn / eigen:.2f}x, torch / Eigen {torch / eigen:.2f}x")


if __name__ == "__main__":
  main()
