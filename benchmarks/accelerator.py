r"""The paper's CKA protocol on whatever accelerator this is, in one command.

  .venv/bin/python -m benchmarks.accelerator [--pair b16_r50] [--examples 10240]
      [--batch 1024] [--repeats 1] [--precisions highest,bf16_6x,bf16_3x,tf32_3x,bf16_9x]
      [--json PATH]

ViT-B/16 and BiT-R50x1 at random init (the paper's layer sets, 224 px) on
synthetic images, through the same job as `configs/cka_vit_resnet.py` (planning,
pipeline, sharded step, resumable state), once per Gram precision. Prints per
precision: the wall time of the whole run and the part of it spent tracing and
compiling (JAX's monitoring events), the FLOP bound (the forward's dot and
convolution FLOPs counted from its jaxpr plus the Gram and HSIC FLOPs, over the
device's fp32 matmul rate, the best of measurements taken before and after the
runs) and the ratio of the rest of the time to it; the memory plan's peak
against the device's measured peak (where the device reports one; the process's
running peak); and the largest CKA difference from `highest`. `--json PATH`
also writes the record (device, jax, settings, rows) there, for
`python -m benchmarks.readme_numbers device`.
A precision the backend cannot run is reported as such. `--pair tiny` runs a
small ViT and ResNet at 32 px (the CPU test, `tests/benchmarks/test_benchmarks.py`).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time

import numpy as np

from benchmarks import clocks
from benchmarks import parts
from benchmarks import peaks
from benchmarks import workload

PAIRS = {  # name -> (ViT fields, BiT fields, input size)
    "b16_r50": (dict(variant="B/16"), dict(width=1, depth=50), 224),
    "tiny": (dict(patch_size=8, width=32, depth=2, mlp_dim=64, num_heads=2),
             dict(width=0.5, depth=(1, 1)), 32),
}


def _models(pair: str) -> dict:
  """name -> (model, params) at random init."""
  from vitcnn_jax.models import BiT, ViT, param_trees
  from vitcnn_jax.models.vit import model as vit
  vit_fields, bit_fields, size = PAIRS[pair]
  if "variant" in vit_fields:
    vit_fields = vit.decode_variant(vit_fields["variant"])
  out = {}
  for i, (name, model) in enumerate((
      ("vit", ViT(num_classes=1000, image_size=size, **vit_fields)),
      ("resnet", BiT(num_classes=1000, image_size=size, **bit_fields)))):
    x = np.zeros((1, size, size, 3), np.float32)
    out[name] = (model, param_trees.random_params(model, x, seed=i))
  return out


def flop_bound_parts(models: dict, batch: int) -> tuple[float, float]:
  """(forward FLOPs, Gram + HSIC FLOPs) of one minibatch of `batch` examples."""
  import jax
  import jax.numpy as jnp
  from vitcnn_jax.inputs import preprocess
  from vitcnn_jax.models import representations
  from vitcnn_jax.run import loading
  loaded = {k: loading.loaded(k, "<random init>", k, m, p, "paper") for k, (m, p) in models.items()}

  def forward(ps, x):
    x = preprocess.normalize(x)
    return [m.model.apply({"params": p}, x, capture=())[0] for m, p in zip(loaded.values(), ps)]

  size = next(iter(loaded.values())).size
  x = jax.ShapeDtypeStruct((batch, size, size, 3), jnp.uint8)
  fwd = clocks.matmul_flops(jax.make_jaxpr(forward)([m.params for m in loaded.values()], x).jaxpr)
  dims = [int(np.prod(s.shape[1:])) for m in loaded.values()
          for s in representations.point_shapes(m.model, m.params, m.names, batch).values()]
  gram = sum(2 * batch * batch * d for d in dims) + 2 * len(dims) ** 2 * batch * batch
  return fwd, float(gram)


def precision_rates(precisions: list[str], n: int) -> dict[str, float]:
  """name -> the measured matmul rate of each Gram precision the backend runs
  (`auto` as the one it stands for), and "default": float32 at JAX's default
  precision, as the forward runs (TF32 on a GPU that has it)."""
  import jax
  from vitcnn_jax.similarity import grams
  rates = {"default": clocks.matmul_rate(n, precision=jax.lax.Precision.DEFAULT)}
  for name in precisions:
    try:
      rates[name] = clocks.matmul_rate(n, precision=grams.gram_precision(name))
    except Exception:  # reported by the run's row
      pass
  return rates


def run(pair: str, examples: int, batch: int, repeats: int, precisions: list[str]) -> list[dict]:
  import jax
  import vitcnn_jax as vj
  models = _models(pair)
  size = PAIRS[pair][2]
  images = np.random.default_rng(0).integers(0, 256, (examples, size, size, 3), dtype=np.uint8)
  rate = clocks.matmul_rate(4096 if jax.default_backend() != "cpu" else 1024)
  fwd, gram = flop_bound_parts(models, batch)
  steps = repeats * (examples // batch)
  rows, reference, clock = [], None, clocks.CompileClock()
  for name in precisions:
    row = {"precision": name}
    rows.append(row)
    try:
      with tempfile.TemporaryDirectory() as wd:
        t, compiling = time.perf_counter(), clock.seconds
        r = vj.cka(models, images, layers="paper", num_examples=examples, batch_size=batch,
                   repeats=repeats, gram_precision=name, workdir=wd)
        row["seconds"] = time.perf_counter() - t
        row["compile_seconds"] = clock.seconds - compiling
    except Exception as e:  # a dot algorithm the backend lacks
      row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
      continue
    cka = {k: np.asarray(v) for k, v in r.arrays.items() if k.startswith("cka_")}
    reference = reference or (cka if name == "highest" else None)
    row["max_diff"] = (max(float(np.abs(v - reference[k]).max()) for k, v in cka.items())
                       if reference else None)
    row["plan_peak"] = r.summary["memory_plan"]["peak_bytes"] or None  # 0: not planned (CPU)
    row["device_peak"] = peaks.device_peak()
    print(f"  {name}: {row['seconds']:.1f} s, {row}", flush=True)  # a cut-off run still shows it
  rate = max(rate, clocks.matmul_rate(4096 if jax.default_backend() != "cpu" else 1024))
  bound = steps * (fwd + gram) / rate
  rates = precision_rates(precisions, 4096 if jax.default_backend() != "cpu" else 1024)
  for row in rows:
    row.update(bound=bound, rate=rate, fwd_flops=fwd * steps, gram_flops=gram * steps)
    if row["precision"] in rates:  # the forward at the default rate, the Grams at their own
      row.update(own_rate=rates[row["precision"]], default_rate=rates["default"],
                 own_bound=steps * (fwd / rates["default"] + gram / rates[row["precision"]]))
  return rows


def report_lines(record: dict) -> list[str]:
  """The table of a run's record (what `--json` writes), one line a row."""
  rows, r0, gib = record["rows"], record["rows"][0], 2**30
  lines = [f"device: {record['devices']} x {record['device']} ({record['backend']}), jax "
           f"{record['jax']}; pair {record['pair']}, {record['examples']:,} examples in minibatches "
           f"of {record['batch']:,}, {record['repeats']} repeat(s)",
           f"FLOP bound: {r0['bound']:.1f} s = ({r0['fwd_flops'] / 1e12:.2f} forward + "
           f"{r0['gram_flops'] / 1e12:.2f} Gram TFLOP) / {r0['rate'] / 1e12:.2f} TFLOP/s (fp32 "
           "matmul, best measured)",
           "precision | time (s, incl. compile) | of which compiling (s) | rest / bound | "
           "plan peak (GiB) | device peak so far (GiB) | max |CKA - highest| | own bound (s) | rest / own bound"]
  for r in rows:
    if "error" in r:
      lines.append(f"{r['precision']} | not run here: {r['error']}")
      continue
    dev = f"{r['device_peak'] / gib:.2f}" if r["device_peak"] else "n/a (not reported)"
    plan = f"{r['plan_peak'] / gib:.2f}" if r["plan_peak"] else "n/a (not planned)"
    diff = f"{r['max_diff']:.2e}" if r["max_diff"] is not None else "n/a (no highest run)"
    rest = r["seconds"] - r["compile_seconds"]
    own = (f" | {r['own_bound']:.1f} | {rest / r['own_bound']:.2f}x" if "own_bound" in r else " | - | -")
    lines.append(f"{r['precision']} | {r['seconds']:.1f} | {r['compile_seconds']:.1f} | "
                 f"{rest / r['bound']:.2f}x | {plan} | {dev} | {diff}" + own)
  rates = {r["precision"]: r["own_rate"] for r in rows if "own_rate" in r}
  if rates:
    default = next(r["default_rate"] for r in rows if "default_rate" in r)
    lines.append("own bound: the forward's FLOPs at float32's default-precision rate "
                 f"({default / 1e12:.1f} TFLOP/s) plus the Grams' at each precision's own, measured here: "
                 + ", ".join(f"{k} {v / 1e12:.1f}" for k, v in rates.items()) + " TFLOP/s")
  if record.get("note"):
    lines.append(record["note"])
  peer = record.get("peer")
  if peer:
    lines.append(f"{peer['tool']} on torch's {peer['device']}, the same layers and images: "
                 + (f"not run: {peer['error']}" if "error" in peer else
                    f"{peer['total_s']:.1f} s end to end (its forward alone {peer['forward_s']:.1f} s)"
                    + (f", peak device memory {peer['device_peak_gib']:.2f} GiB"
                       if peer.get("device_peak_gib") is not None else "")))
  return lines


def _peer(args) -> dict:
  """A PyTorch CKA package on timm's ViT-B/16 and BiT-R50x1 with the paper's
  layers (the CKA benchmark's part): its time, or why it did not run (an
  out-of-memory error says what it asked for)."""
  if args.pair != "b16_r50":
    raise SystemExit("--peer: the peers run pair b16_r50 (timm's networks).")
  with tempfile.TemporaryDirectory() as work:
    s = workload.Setup("W", args.examples, args.batch, 224, work, device=args.peer_device)
    try:
      got = parts.run_part(args.peer, s)
    except RuntimeError as e:
      lines = [x for x in str(e).splitlines() if x.strip()]
      return dict(tool=args.peer, device=args.peer_device, error=lines[-1][:300] if lines else "failed")
  return dict(got, tool=args.peer, device=args.peer_device)


def main():
  logging.getLogger("vitcnn_jax").setLevel(logging.ERROR)  # random-init models: no files to doubt
  ap = argparse.ArgumentParser()
  ap.add_argument("--pair", default="b16_r50", choices=sorted(PAIRS))
  ap.add_argument("--examples", type=int, default=10240)
  ap.add_argument("--batch", type=int, default=1024)
  ap.add_argument("--repeats", type=int, default=1)
  ap.add_argument("--precisions", default="highest,bf16_6x,bf16_3x,tf32_3x,bf16_9x")
  ap.add_argument("--json", help="also write the rows, device and settings here")
  ap.add_argument("--peer", default="", help="also run this PyTorch CKA package (cka_benchmark's "
                  "names; pair b16_r50) on torch's --peer_device first, in its own process")
  ap.add_argument("--peer_device", default="cuda")
  args = ap.parse_args()
  peer = _peer(args) if args.peer else None  # before JAX takes the device's memory
  precisions = args.precisions.split(",")
  if "highest" in precisions:  # the reference runs first
    precisions = ["highest"] + [p for p in precisions if p != "highest"]
  rows = run(args.pair, args.examples, args.batch, args.repeats, precisions)
  import jax
  record = dict(device=jax.devices()[0].device_kind, backend=jax.default_backend(),
                devices=jax.device_count(), jax=jax.__version__, pair=args.pair,
                examples=args.examples, batch=args.batch, repeats=args.repeats, rows=rows, peer=peer)
  print("\n".join(report_lines(record)))
  if args.json:  # for `python -m benchmarks.readme_numbers device`, where the run was elsewhere
    with open(args.json, "w") as f:
      json.dump(record, f, indent=1)


if __name__ == "__main__":
  main()
