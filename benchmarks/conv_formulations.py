r"""Each convolution shape of BiT-R50x1 and R152x2, three ways, side by side.

  .venv/bin/python -m benchmarks.conv_formulations [--model r50,r152x2] [--batch 32]

For every distinct k x k convolution of the model at 224 px (the 7x7/2 root,
the 3x3 of each stage, the strided 3x3 opening stages 2-4; 1x1 convolutions
are dots already), the time of:
  - xla:     `lax.conv_general_dilated`, what `bit.StdConv` runs;
  - rows:    per kernel row, one dot over (columns, input channels) of the
             column-shifted input concatenated on channels (K = k * Cin), the
             output rows summed from row-shifted products (strided: rows by parity);
  - patches: `conv_general_dilated_patches` then one dot (K = k * k * Cin).
Each is printed as its best time and fraction of the fp32 matmul rate (best
of measurements taken before, between and after), with its largest difference
from xla's output relative to the output's largest value.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks import clocks

WIDTHS = {"r50": 1, "r152x2": 2}


def shapes(model: str, size: int = 224) -> list[tuple[str, int, int, int, int, int]]:
  """(label, input size, Cin, Cout, kernel, stride) of each distinct k x k conv."""
  w = 64 * WIDTHS[model]
  out = [("root 7x7/2", size, 3, w, 7, 2)]
  at = size // 4
  for stage in range(4):
    c = w * 2 ** stage
    if stage:
      out.append((f"stage {stage + 1} 3x3/2", at, c, c, 3, 2))
      at //= 2
    out.append((f"stage {stage + 1} 3x3/1", at, c, c, 3, 1))
  return out


def conv_xla(x, w, stride):
  import jax
  pad = (w.shape[0] - 1) // 2
  return jax.lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad)] * 2,
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))


def conv_rows(x, w, stride):
  import jax.numpy as jnp
  k, cin, cout = w.shape[0], w.shape[2], w.shape[3]
  pad = (k - 1) // 2
  n, h, wd, _ = x.shape
  ho, wo = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
  xp = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  cols = jnp.concatenate([xp[:, :, dx:dx + stride * (wo - 1) + 1:stride] for dx in range(k)], -1)
  by_row = w.reshape(k, k * cin, cout)  # (dy, dx * Cin, Cout), as `cols` orders its channels
  out = 0.0
  for parity in range(stride):  # padded rows parity + stride * i serve kernel rows parity + stride * j
    dys = list(range(parity, k, stride))
    z = jnp.einsum("nhwc,cd->nhwd", cols[:, parity::stride], jnp.concatenate([by_row[d] for d in dys], -1))
    z = z.reshape(*z.shape[:3], len(dys), cout)
    for j in range(len(dys)):
      out = out + z[:, j:j + ho, :, j]
  return out


def conv_patches(x, w, stride):
  import jax
  import jax.numpy as jnp
  pad = (w.shape[0] - 1) // 2
  patches = jax.lax.conv_general_dilated_patches(x, w.shape[:2], (stride, stride), [(pad, pad)] * 2,
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
  return jnp.einsum("nhwc,cd->nhwd", patches, w.transpose(2, 0, 1, 3).reshape(-1, w.shape[-1]))


FORMULATIONS = {"xla": conv_xla, "rows": conv_rows, "patches": conv_patches}


def main():
  import jax
  import jax.numpy as jnp
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="r50,r152x2")
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--size", type=int, default=224)
  ap.add_argument("--runs", type=int, default=4)
  args = ap.parse_args()
  rng = np.random.default_rng(0)
  rates, rows = [clocks.matmul_rate(2048)], []
  for model in args.model.split(","):
    for label, size, cin, cout, k, stride in shapes(model, args.size):
      x = jnp.asarray(rng.normal(size=(args.batch, size, size, cin)), jnp.float32)
      w = jnp.asarray(rng.normal(size=(k, k, cin, cout)) / np.sqrt(k * k * cin), jnp.float32)
      ref = None
      row = [f"{model} {label} {cin}->{cout} at {size}x{size}"]
      for name, fn in FORMULATIONS.items():
        f = jax.jit(lambda x, w, fn=fn, stride=stride: fn(x, w, stride))
        y = np.asarray(f(x, w))
        ref = y if ref is None else ref
        flops = 2.0 * y.size * k * k * cin
        row.append((name, clocks.best_seconds(lambda f=f, x=x, w=w: jax.block_until_ready(f(x, w)), args.runs), flops,
                    float(np.abs(y - ref).max() / np.abs(ref).max())))
      rows.append(row)
    rates.append(clocks.matmul_rate(2048))
  rate = max(rates)
  print(f"fp32 matmul rate {rate / 1e9:.1f} GFLOP/s (best of {len(rates)} measurements); batch {args.batch}")
  for label, *cells in rows:
    print(f"{label:38s}" + "".join(f" | {n} {t * 1e3:7.1f} ms {f / t / rate:4.2f} of matmul (diff {d:.0e})"
                                   for n, t, f, d in cells), flush=True)
    fastest = min(cells, key=lambda c: c[1])
    print(f"{'':38s} -> fastest: {fastest[0]}")


if __name__ == "__main__":
  main()
