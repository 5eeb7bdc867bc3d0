r"""The paper's CKA protocol at its scale: memory plans from the compiled step.

  .venv/bin/python -m benchmarks.paper_scale [--pairs b16_r50,l16_r152,h14_r152]
                                                 [--device_gib 16,80] [--table]

Compile-only (any machine, no accelerator): the CKA step of each model pair,
with the paper's layer sets at 224 px and the paper's minibatch of 1,024, is
compiled for `--devices` fake CPU devices and XLA's memory analysis of one
device's program is read. For each pair and device memory, the planner picks
the smallest group of devices sharing a minibatch whose step fits in the limit
the job itself would use (`memory.device_limit`: 90% of the memory), printed as

  PLAN pair=b16_r50 device_gib=16 limit_gib=14.40 minibatch=1024 devices_per_minibatch=K
       micro_batch=M peak_gib=X fits=yes

(one line; micro_batch: rows per device; the forward is not split further). `--table`
also prints the peak of the whole step and of the forward alone (logits, no
representation captured) for minibatches of 32, 256 and 1,024 on one device
(b16_r50). `--groups 1,2,4,8,16` instead compiles the first pair's step over
each group size and prints `GROUP ... peak_gib=X compile_s=T`, with the peak of one
device holding the same rows (`one_device_same_rows_gib`) and their ratio. XLA's CPU compiler fuses and
schedules differently from the GPU and TPU ones, so the figures are estimates
of what the planner will read on those devices, where it plans before the run;
the Grams are compiled as those devices make them (`grams.SLICED_BACKENDS`).
"""

from __future__ import annotations

import argparse
import os
import time

DEVICES = 64
if __name__ == "__main__":
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={DEVICES}")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

PAIRS = {"b16_r50": ("B/16", 1, 50), "l16_r152": ("L/16", 2, 152), "h14_r152": ("H/14", 2, 152)}
MINIBATCH = 1024


def _models(pair: str) -> dict:
  """Loaded models of a pair with abstract parameters (shapes only)."""
  import jax
  import numpy as np
  from vitcnn_jax.models import BiT, ViT
  from vitcnn_jax.models.vit import model as vit
  from vitcnn_jax.run import loading
  variant, width, depth = PAIRS[pair]
  out = {}
  for name, model in (("vit", ViT(num_classes=1000, **vit.decode_variant(variant))),
                      ("resnet", BiT(num_classes=1000, width=width, depth=depth))):
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                            np.zeros((1, 224, 224, 3), np.float32))["params"]
    out[name] = loading.loaded(name, "<random init>", name, model, params, "paper")
  return out


def _job(models: dict, minibatch: int, devices_per_minibatch: int = 0, gib: float = 0.0):
  import ml_collections
  from vitcnn_jax.analyses import cka as cka_job
  config = ml_collections.ConfigDict(dict(
      num_examples=10 * minibatch, batch_size=minibatch, repeats=20,
      devices_per_minibatch=devices_per_minibatch, device_memory_gib=gib))
  return config, cka_job.CKA(config, models)


def plan_lines(pair: str, gibs: list[float]) -> None:
  import jax
  from vitcnn_jax.run import driver
  from vitcnn_jax.run import memory
  models = _models(pair)
  print(f"{pair}: {sum(len(m.names) for m in models.values())} layers "
        f"({len(models['vit'].names)} ViT, {len(models['resnet'].names)} ResNet)", flush=True)
  peaks: dict[int, int] = {}

  def peak(minibatch: int, group: int) -> int:  # compiled once per (minibatch, group)
    if (minibatch, group) not in peaks:
      t = time.perf_counter()
      config, job = _job(models, minibatch, group, 1e6)
      plan, _ = driver.plan_devices(config, job, models, jax.lax.Precision.HIGHEST)
      peaks[minibatch, group] = plan.peak_bytes
      print(f"  compiled minibatch {minibatch} over {group} device(s): "
            f"{plan.peak_bytes / memory.GIB:.2f} GiB per device ({time.perf_counter() - t:.0f} s)",
            flush=True)
    return peaks[minibatch, group]

  for gib in gibs:
    try:
      plan = plan_for(gib, peak)
      print(f"PLAN pair={pair} device_gib={gib:g} limit_gib={plan.limit_bytes / memory.GIB:.2f} "
            f"minibatch={plan.minibatch} devices_per_minibatch={plan.devices_per_minibatch} "
            f"micro_batch={plan.rows} peak_gib={plan.peak_bytes / memory.GIB:.2f} fits=yes",
            flush=True)
    except MemoryError as e:
      print(f"PLAN pair={pair} device_gib={gib:g} minibatch={MINIBATCH} fits=no ({e})", flush=True)


def plan_for(gib: float, peak):
  """The planner's choice on `gib` GiB devices: the limit the job itself uses
  (`memory.device_limit`, with its headroom), not the full figure."""
  import jax
  from vitcnn_jax.run import memory
  return memory.choose(MINIBATCH, jax.device_count(), peak, memory.device_limit(gib))


def groups(pair: str, sizes: list[int]) -> None:
  """The step of the paper's minibatch over each group size: compile time and peak,
  against one device holding the same rows (a minibatch of that many rows)."""
  import jax
  from vitcnn_jax.run import driver
  from vitcnn_jax.run import memory
  models = _models(pair)

  def compiled(minibatch: int, group: int) -> tuple[int, float]:
    t = time.perf_counter()
    config, job = _job(models, minibatch, group, 1e6)
    plan, _ = driver.plan_devices(config, job, models, jax.lax.Precision.HIGHEST)
    return plan.peak_bytes, time.perf_counter() - t

  for group in sizes:
    peak, seconds = compiled(MINIBATCH, group)
    alone = peak if group == 1 else compiled(MINIBATCH // group, 1)[0]
    print(f"GROUP pair={pair} minibatch={MINIBATCH} devices_per_minibatch={group} "
          f"peak_gib={peak / memory.GIB:.2f} compile_s={seconds:.0f} one_device_same_rows_gib="
          f"{alone / memory.GIB:.2f} ratio={peak / alone:.2f}", flush=True)


def table() -> None:
  """Peak of the step and of the forward alone on one device, b16_r50."""
  import jax
  import jax.numpy as jnp
  from vitcnn_jax.inputs import preprocess
  from vitcnn_jax.run import driver
  from vitcnn_jax.run import memory
  models = _models("b16_r50")
  print("per-device minibatch | peak of the CKA step | forward alone")
  for n in (32, 256, 1024):
    config, job = _job(models, n, 1, 1e6)
    plan, _ = driver.plan_devices(config, job, models, jax.lax.Precision.HIGHEST)

    def forward(params, images):
      x = preprocess.normalize(images)
      return [m.model.apply({"params": p}, x, capture=())[0] for m, p in zip(models.values(), params)]

    fwd = jax.jit(forward).lower([m.params for m in models.values()],
                                 jax.ShapeDtypeStruct((n, 224, 224, 3), jnp.uint8)).compile()
    print(f"{n:>20,} | {plan.peak_bytes / memory.GIB:>17.2f} GiB | "
          f"{memory.step_bytes(fwd) / memory.GIB:.2f} GiB", flush=True)


def main():
  from vitcnn_jax.similarity import grams
  # Plans are for GPUs and TPUs: compile their formulation of a layer's Gram (one
  # dot over a centred copy), not the CPU's cache-sized slices.
  grams.SLICED_BACKENDS = ()
  ap = argparse.ArgumentParser()
  ap.add_argument("--pairs", default=",".join(PAIRS))
  ap.add_argument("--device_gib", default="16,80")
  ap.add_argument("--table", action="store_true")
  ap.add_argument("--groups", default="", help="e.g. 1,2,4,8,16: compile time and peak per group "
                  "size of the first pair, instead of the plans")
  args = ap.parse_args()
  if args.groups:
    groups(args.pairs.split(",")[0], [int(g) for g in args.groups.split(",")])
    return
  if args.table:
    table()
  for pair in args.pairs.split(","):
    plan_lines(pair, [float(g) for g in args.device_gib.split(",")])


if __name__ == "__main__":
  main()
