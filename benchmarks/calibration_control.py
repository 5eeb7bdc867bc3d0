r"""The calibration's analytic control: representations independent of each other
at widths from well below to well above the minibatch size.

  python -m benchmarks.calibration_control [--repeats 20] [--draws 99] [--figure docs/figures/calibration_control.png]

Two "models" of two layers each, every layer Gaussian random features of one
width, model A's independent of model B's (not functions of the same images:
two untrained networks fed the same images share the images' own structure).
For each width and measure: the mean raw pair score (depth-monotone matching)
over the repeats, the mean calibrated score, and how many repeats had p <= 0.05
(under a valid null, Binomial(repeats, 0.05)). Prints one table and draws the
figure the docs show.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import style
from vitcnn_jax.similarity import layer_search
from vitcnn_jax.similarity import measures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS, MINIBATCHES, WIDTHS = 32, 2, (4, 16, 32, 64, 256, 1024)


def control(repeats: int, draws: int) -> dict[str, dict[int, list]]:
  """{measure: {width: [Calibrated of each repeat]}} (biased estimators: their width bias shows)."""
  names = tuple(m for m in measures.NAMES if measures.REGISTRY[m].null)
  spec = measures.Spec(names, estimator="biased", knn_k=5, cca_dims=4, subspace_dims=8)
  out: dict[str, dict[int, list]] = {m: {} for m in names}
  for d in WIDTHS:
    for r in range(repeats):
      g = np.random.default_rng((d, r))
      xs, ys = ([g.standard_normal((ROWS * MINIBATCHES, d)) for _ in range(2)] for _ in range(2))
      for m, c in layer_search.calibrate_layers(xs, ys, spec, num_null=draws, batch_size=ROWS, seed=r).items():
        out[m].setdefault(d, []).append(c)
  return out


@axes.styled
def figure(got: dict[str, dict[int, list]], path: str) -> axes.Figure:
  """Raw and calibrated pair scores against width, a line per measure."""
  fig = axes.Figure(figsize=(11, 4.4), layout="constrained")
  raw_ax, cal_ax = fig.subplots(1, 2)
  for i, (m, by_width) in enumerate(got.items()):
    label, style_ = measures.REGISTRY[m].label, ("-", "--", ":")[i // 10]
    raw = [np.mean([c.raw for c in by_width[d]]) for d in WIDTHS]
    cal = [np.mean([c.score for c in by_width[d]]) for d in WIDTHS]
    raw_ax.plot(WIDTHS, raw, style_, marker="o", ms=3, label=label)
    cal_ax.plot(WIDTHS, cal, style_, marker="o", ms=3, label=label)
  for ax in (raw_ax, cal_ax):
    ax.set_xscale("log", base=2)
    ax.axvline(ROWS, color="0.6", lw=0.8)
    ax.set_xlabel(f"features per layer (minibatch of {ROWS}: grey line)")
  raw_ax.set_ylabel("raw pair score (distances in their units)")
  raw_ax.set_title("raw: moves with width")
  cal_ax.set_ylabel("calibrated score")
  cal_ax.set_ylim(-0.02, 1.0)
  cal_ax.set_title("calibrated: 0 at every width")
  cal_ax.legend(fontsize=8, ncol=2, loc="upper right")
  n = len(next(iter(got.values()))[WIDTHS[0]])
  fig.suptitle(f"Independent random features, two layers a model: the mean of {n} repeats per width")
  return style.save_figure(fig, path, style.Figures())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--draws", type=int, default=99)
  parser.add_argument("--figure", default=os.path.join(ROOT, "docs", "figures", "calibration_control.png"))
  args = parser.parse_args()
  start = time.perf_counter()
  got = control(args.repeats, args.draws)
  print(f"{args.repeats} repeats x {len(WIDTHS)} widths, {args.draws} draws each, minibatches of {ROWS} "
        f"({MINIBATCHES} per repeat), biased estimators; p <= 0.05 expected in "
        f"{0.05 * args.repeats:.1f} of {args.repeats} repeats under a valid null:")
  print(f"{'measure':26s}" + "".join(f"{f'width {d}':>22s}" for d in WIDTHS))
  print(f"{'':26s}" + f"{'raw  cal  p<=.05':>22s}" * len(WIDTHS))
  for m, by_width in got.items():
    cells = "".join(f"{np.mean([c.raw for c in cs]):8.3f} {np.mean([c.score for c in cs]):5.3f} "
                    f"{sum(c.p_value <= 0.05 for c in cs):4d}   " for cs in by_width.values())
    print(f"{m:26s}{cells}")
  figure(got, args.figure)
  print(f"Figure: {os.path.relpath(args.figure, ROOT)}; {time.perf_counter() - start:.0f} s.")


if __name__ == "__main__":
  main()
