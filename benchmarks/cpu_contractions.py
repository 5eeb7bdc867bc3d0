r"""The dots and convolutions our CPU runs depend on, as XLA:CPU runs them two
ways and torch one, side by side.

  .venv/bin/python -m benchmarks.cpu_contractions [--runs 20] [--rounds 2]

XLA:CPU gives a dot or a convolution that stands alone to YNNPACK unless
`--xla_cpu_experimental_ynn_fusion_type=-individual_dot,-individual_convolution`
(`vitcnn_jax.CPU_CONTRACTIONS`, which importing vitcnn_jax sets) leaves it to
Eigen. The flag is read once a process, so each way runs in a process of its own
(`--rounds` times, alternating; each shape's best time over them), and torch, a
peer's, in a third. The shapes: the Grams of W's layers (32 rows) and of
1,000-row minibatches, the measures' all-pairs products of flattened Grams, a
ViT-B/16 block's attention logits and MLP dense at W's minibatch; and the k x k
convolutions of BiT-R50x1 and ViT-B/16 at W's minibatch and of ResNet-18 at the
peers' 1,000 images of 32 px (torch's in its own NCHW layout). Prints each one's
best time, its GFLOP/s, and YNNPACK's and torch's times over Eigen's.
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
# label -> (images, input size, in channels, out channels, kernel, stride, padding per side)
CONVS = {
    "conv 3x3/1 64->64, BiT-R50 stage 1 at W's minibatch (32 x 56 x 56)": (32, 56, 64, 64, 3, 1, 1),
    "conv 3x3/2 128->128, BiT-R50 stage 2's first at W's minibatch (32 x 56 x 56 in)": (32, 56, 128, 128, 3, 2, 1),
    "conv 3x3/1 256->256, BiT-R50 stage 3 at W's minibatch (32 x 14 x 14)": (32, 14, 256, 256, 3, 1, 1),
    "conv 7x7/2 3->64, BiT-R50 root at W's minibatch (32 x 224 x 224 in)": (32, 224, 3, 64, 7, 2, 3),
    "conv 16x16/16 3->768, ViT-B/16 patches at W's minibatch": (32, 224, 3, 768, 16, 16, 0),
    "conv 3x3/1 64->64, ResNet-18 layer1 at 1,000 images (1,000 x 32 x 32)": (1000, 32, 64, 64, 3, 1, 1),
    "conv 3x3/1 128->128, ResNet-18 layer2 at 1,000 images (1,000 x 16 x 16)": (1000, 16, 128, 128, 3, 1, 1),
}
WAYS = ("xla YNNPACK", "xla Eigen", "torch")
_YNN = "--xla_cpu_experimental_ynn_fusion_type=+individual_dot,+individual_convolution"


def _operands(shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
  rng = np.random.default_rng(0)
  return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def part(way: str, runs: int) -> dict[str, dict[str, float]]:
  """Each shape's best seconds, the XLA ways through vitcnn_jax's import (which
  sets the flag unless the environment chose), torch's otherwise; the XLA ways
  also each shape's FLOPs (`clocks.matmul_flops` of its jaxpr)."""
  out = {}
  if way == "torch":
    import torch
    import torch.nn.functional as F
    for label, (spec, shapes) in SHAPES.items():
      xs = [torch.from_numpy(a) for a in _operands(shapes)]
      xs = xs * 2 if len(xs) == 1 else xs
      out[label] = clocks.best_seconds(lambda spec=spec, xs=xs: torch.einsum(spec, *xs), runs)
    for label, (n, size, cin, cout, k, stride, pad) in CONVS.items():
      x, w = (torch.from_numpy(a) for a in _operands([(n, cin, size, size), (cout, cin, k, k)]))
      out[label] = clocks.best_seconds(lambda x=x, w=w, s=stride, p=pad: F.conv2d(x, w, stride=s, padding=p), runs)
    return {"seconds": out}
  import jax
  import jax.numpy as jnp

  import vitcnn_jax  # noqa: F401  (its import chooses the contractions' library, before jax starts)
  calls = {}
  for label, (spec, shapes) in SHAPES.items():
    xs = [jnp.asarray(a) for a in _operands(shapes)]
    calls[label] = (jax.jit(lambda *xs, spec=spec: jnp.einsum(spec, *(xs * 2 if len(xs) == 1 else xs),
                                                              precision=jax.lax.Precision.HIGHEST)), xs)
  for label, (n, size, cin, cout, k, stride, pad) in CONVS.items():
    xs = [jnp.asarray(a) for a in _operands([(n, size, size, cin), (k, k, cin, cout)])]
    calls[label] = (jax.jit(lambda x, w, s=stride, p=pad: jax.lax.conv_general_dilated(
        x, w, (s, s), [(p, p)] * 2, dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=jax.lax.Precision.HIGHEST)), xs)
  flops = {}
  for label, (f, xs) in calls.items():
    out[label] = clocks.best_seconds(lambda f=f, xs=xs: jax.block_until_ready(f(*xs)), runs)
    flops[label] = clocks.matmul_flops(jax.make_jaxpr(f)(*xs).jaxpr)
  return {"seconds": out, "flops": flops}


def _run_part(way: str, runs: int) -> dict[str, dict[str, float]]:
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if "ynn_fusion_type" not in f]
  env["XLA_FLAGS"] = " ".join(flags + ([_YNN] if way == "xla YNNPACK" else []))
  done = subprocess.run([sys.executable, "-m", "benchmarks.cpu_contractions", "--part", way, "--runs", str(runs)],
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
  best, flops = {w: {} for w in WAYS}, {}
  for _ in range(args.rounds):
    for way in WAYS:
      got = _run_part(way, args.runs)
      flops.update(got.get("flops", {}))  # the XLA ways' count, the same either way
      for label, s in got["seconds"].items():
        best[way][label] = min(s, best[way].get(label, float("inf")))
  print(f"best of {args.rounds} processes of each way, {args.runs} calls each; float32 (XLA at HIGHEST):")
  for label, f in flops.items():
    ynn, eigen, torch = (best[w][label] for w in WAYS)
    print(f"  {label}:\n    " + ", ".join(f"{w} {best[w][label] * 1e3:.2f} ms ({f / best[w][label] / 1e9:.0f} "
                                          f"GFLOP/s)" for w in WAYS)
          + f"\n    YNNPACK / Eigen {ynn / eigen:.2f}x, torch / Eigen {torch / eigen:.2f}x")


if __name__ == "__main__":
  main()
