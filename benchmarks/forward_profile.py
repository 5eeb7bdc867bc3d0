r"""Where a model's forward spends its time on this machine, op class by op class.

  .venv/bin/python -m benchmarks.forward_profile [--model bit_r50] [--batch 32] [--size 224]

One jit-compiled forward (logits, nothing captured) at random init, traced with
JAX's profiler (XLA:CPU's per-thunk events, or the device's kernels elsewhere).
Each executed HLO instruction is put in a class (convolution, dot, reduce,
reduce-window, elementwise) and, from its op name, a role (the module path with
block and unit numbers dropped, e.g. `gn1/reduce_sum`, `conv2/sub` for a
weight-standardisation pass). Time is wall-clock time: where several thunks ran
at once, each gets an equal share of it, so the shares add up to the span of a
forward. A dot or convolution also takes the time in which nothing ran until
the first instruction that reads it starts (`completed`), and a scanned block's
instructions count once per turn, their FLOPs too. Prints:
  - the forward's best wall time, its GFLOP/s and the fraction of the fp32
    (HIGHEST) matmul rate, measured before and after, best of the two;
  - per class: share of the time, GFLOP, GFLOP/s and fraction of the matmul rate;
  - per convolution and dot shape: count, time and GFLOP/s against that rate;
  - the roles that take the most time outside convolutions and dots.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import glob
import os
import re
import tempfile
import time

import numpy as np

from benchmarks import clocks

MODELS = {  # name -> (its class in vitcnn_jax.models, the fields it is built with)
    "bit_r50": ("BiT", dict(width=1, depth=50)),
    "bit_r152x2": ("BiT", dict(width=2, depth=152)),
    "vit_b16": ("ViT", dict(variant="B/16")),
    "tiny_bit": ("BiT", dict(width=0.5, depth=(1, 1, 4, 1))),  # its third stage a scan
    "tiny_vit": ("ViT", dict(patch_size=8, width=32, depth=2, mlp_dim=64, num_heads=2)),
}


@dataclasses.dataclass
class Op:
  """One HLO instruction of the entry computation, as the profile names it."""
  kind: str  # convolution, dot, reduce, reduce-window, elementwise
  role: str  # its op name without the model, block and unit prefixes
  shape: str  # what it computes, for convolutions and dots
  flops: float
  reads: tuple[str, ...] = ()  # the instructions of its computation it takes as operands


def _model(name: str, size: int):
  from vitcnn_jax import models
  from vitcnn_jax.models import param_trees
  from vitcnn_jax.models.vit import model as vit
  cls, fields = MODELS[name]
  if "variant" in fields:
    fields = vit.decode_variant(fields["variant"])
  model = getattr(models, cls)(num_classes=1000, image_size=size, **fields)
  params = param_trees.random_params(model, np.zeros((1, size, size, 3), np.float32))
  return model.for_inference(params)  # as the driver runs it


def _dims(shape: str) -> list[int]:
  inner = re.search(r"\[([\d,]*)\]", shape)[1]
  return [int(d) for d in inner.split(",") if d]


def _role(line: str) -> str:
  op = re.search(r'op_name="([^"]+)"', line)
  if not op:
    return "(no op name)"
  parts = [p for p in op[1].split("/")[1:] if not re.fullmatch(r"(block|unit|encoderblock_)\d+", p)]
  parts = [re.sub(r"^jit\((\w+)\)$", r"\1", p) for p in parts if p not in ("BiT", "ViT", "Transformer")]
  return "/".join(parts[-2:])


def _types(text: str) -> dict[str, str]:
  return dict(re.findall(r"%([\w.\-]+) = (\w+\[[\d,]*\])", text))


def _conv_or_dot(text: str, types: dict[str, str]) -> tuple[str, str, float] | None:
  """(kind, shape, FLOPs) of the convolution or dot in `text` (an instruction
  with its fused computation), None if it has neither; `types` has the entry's
  instructions, which a convolution outside a fusion takes as operands."""
  types = {**types, **_types(text)}
  conv = re.search(r"= (\w+\[[\d,]*\])\S* convolution\(%([\w.\-]+), %([\w.\-]+)\), window=\{size=(\S+)"
                   r"(?: stride=(\S+))?[^}]*\}, dim_labels=(\w+)_(\w+)->(\w+)", text)
  if conv:
    out, lhs, rhs = _dims(conv[1]), _dims(types[conv[2]]), _dims(types[conv[3]])
    window = [int(w) for w in conv[4].split("x")]
    stride = conv[5] or "1"
    cin = lhs[conv[6].index("f")]
    cout = out[conv[8].index("f")]
    flops = 2.0 * np.prod(out) * np.prod(window) * rhs[conv[7].index("i")]
    spatial = "x".join(str(out[i]) for i, c in enumerate(conv[8]) if c not in "bf")
    return ("convolution", f"{conv[4]}/{stride.split('x')[0]} {cin}->{cout} out {spatial}", flops)
  dot = re.search(r"= (\w+\[[\d,]*\])\S* dot\(%([\w.\-]+), %([\w.\-]+)\)(?:, lhs_batch_dims=\{[\d,]*\})?"
                  r", lhs_contracting_dims=\{([\d,]+)\}", text)
  if dot:
    out, lhs = _dims(dot[1]), _dims(types[dot[2]])
    k = int(np.prod([lhs[int(i)] for i in dot[4].split(",")]))
    return ("dot", f"{'x'.join(map(str, out))} K={k}", 2.0 * np.prod(out) * k)
  return None


def _computations(hlo: str) -> dict[str, str]:
  """Each computation's instruction lines by name ("ENTRY" for the entry's)."""
  out = {}
  for m in re.finditer(r"\n(ENTRY )?%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S):
    out["ENTRY" if m[1] else m[2]] = m[3]
  return out


def ops_of(hlo: str) -> dict[str, Op]:
  """Every instruction that runs as its own thunk by name, classified: the entry
  computation's and those of the loops and branches it runs (a scan over
  identical blocks is a while loop; its body's instructions have events of
  their own, once per turn), not those inside fusions."""
  computations = _computations(hlo)
  out: dict[str, Op] = {}
  todo, seen = ["ENTRY"], set()
  while todo:
    name = todo.pop()
    if name in seen or name not in computations:
      continue
    seen.add(name)
    text = computations[name]
    types = _types(text)
    for line in text.splitlines():
      m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = ", line)
      if not m:
        continue
      todo += re.findall(r"(?:body|condition)=%([\w.\-]+)", line)
      todo += re.findall(r"%([\w.\-]+)", (re.search(r"branch_computations=\{([^}]*)\}", line) or ["", ""])[1])
      calls = re.search(r"calls=%([\w.\-]+)", line)
      body = (computations.get(calls[1], "") if calls else "")
      found = _conv_or_dot(line + "\n" + body, types)
      if found:
        kind, shape, flops = found
      else:
        kind = next((k for k in ("reduce-window", "reduce") if f" {k}(" in line + body), "elementwise")
        shape, flops = "", 0.0
      reads = tuple(re.findall(r"%([\w.\-]+)", line.split(" = ", 1)[1].split("calls=")[0]))
      out[m[1]] = Op(kind, _role(line), shape, flops, reads)
  return out


def completed(events: list[tuple[int, int, str]], ops: dict[str, Op]) -> list[tuple[int, int, str]]:
  """`events` and, for each dot and convolution, one more for each stretch in
  which no instruction ran between its event's end and the first start of an
  instruction that reads its result (through any that run no code, such as
  bitcasts and tuples). XLA:CPU hands those to Eigen's pool, and their events
  end when the work is handed out: the rest showed as time in which nothing ran
  (a BiT-R50 forward: dots at 7x the matmul rate, half the forward idle). Only
  such stretches: where other instructions ran until the read (a program that
  runs several at once), the dot may have been done long before. A read in a
  later call does not count."""
  users: dict[str, list[str]] = collections.defaultdict(list)
  for name, op in ops.items():
    for read in op.reads:
      users[read].append(name)
  starts: dict[str, list[int]] = collections.defaultdict(list)
  for start, _, name in events:
    starts[name].append(start)
  for times in starts.values():
    times.sort()

  def after(name: str, t: int) -> int | None:
    times = starts[name]
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else None

  def first_read(name: str, start: int) -> int | None:
    again = after(name, start + 1)  # this instruction's next call: reads past it are a later call's
    found, todo, seen = None, list(users[name]), set()
    while todo:
      user = todo.pop()
      if user in seen:
        continue
      seen.add(user)
      if user not in starts:
        todo += users[user]
        continue
      t = after(user, start)
      if t is not None and (again is None or t < again) and (found is None or t < found):
        found = t
    return found

  busy: list[list[int]] = []  # the union of the events' spans, in order
  for start, end, _ in sorted(events):
    if busy and start <= busy[-1][1]:
      busy[-1][1] = max(busy[-1][1], end)
    else:
      busy.append([start, end])
  gaps = [(busy[i][1], busy[i + 1][0]) for i in range(len(busy) - 1)]
  ends = [g[1] for g in gaps]
  out = list(events)
  for start, end, name in events:
    read = first_read(name, start) if ops[name].kind in ("dot", "convolution") else None
    if read is None or read <= end:
      continue
    for lo, hi in gaps[bisect.bisect_right(ends, end):]:
      if lo >= read:
        break
      out.append((max(lo, end), min(hi, read), name))
  return out


def wall_shares(events: list[tuple[int, int, str]]) -> tuple[dict[str, float], float]:
  """Seconds of wall time per event name (concurrent events share an instant
  equally) and the seconds in which none ran."""
  edges = sorted([(s, 1, n) for s, e, n in events] + [(e, -1, n) for s, e, n in events],
                 key=lambda x: (x[0], x[1]))
  share: dict[str, float] = collections.Counter()
  running: dict[str, int] = collections.Counter()
  idle, prev = 0.0, edges[0][0]
  for t, step, name in edges:
    total = sum(running.values())
    if total == 0:
      idle += t - prev
    for n, c in running.items():
      if c:
        share[n] += (t - prev) * c / total
    running[name] += step
    prev = t
  return {k: v / 1e9 for k, v in share.items()}, idle / 1e9


def trace_events_on() -> None:
  """XLA:CPU's per-thunk trace events, which `trace` reads; must precede the
  backend's start (a run without a trace takes the same time with them on)."""
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true"


def trace(fn, args, runs: int) -> list[tuple[int, int, str]]:
  """(start ns, end ns, name) of every event but Python's in `runs` calls (the
  caller keeps those naming an instruction)."""
  import jax
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      for _ in range(runs):
        jax.block_until_ready(fn(*args))
    data = jax.profiler.ProfileData.from_file(glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0])
  events = []
  for plane in data.planes:
    for line in plane.lines:
      if line.name != "python":  # XLA:CPU runs a program's first instruction on the client's thread
        events += [(e.start_ns, e.start_ns + e.duration_ns, e.name) for e in line.events]
  return events


def profile(name: str, batch: int, size: int, runs: int = 3) -> dict:
  import jax
  model, params = _model(name, size)
  x = jax.numpy.asarray(np.random.default_rng(0).normal(size=(batch, size, size, 3)), np.float32)
  fn = jax.jit(lambda p, x: model.apply({"params": p}, x, capture=())[0])
  compiled = fn.lower(params, x).compile()
  flops = clocks.matmul_flops(jax.make_jaxpr(fn)(params, x).jaxpr)  # a scan's body once per turn
  ops = ops_of(compiled.as_text())
  rates = [clocks.matmul_rate(2048)]
  jax.block_until_ready(compiled(params, x))
  times = []
  for _ in range(runs):
    t = time.perf_counter()
    jax.block_until_ready(compiled(params, x))
    times.append(time.perf_counter() - t)
  rates.append(clocks.matmul_rate(2048))
  events = [e for e in trace(compiled, (params, x), runs) if e[2] in ops]
  share, idle = wall_shares(completed(events, ops))
  calls = collections.Counter(name for _, _, name in events)
  return dict(model=name, batch=batch, size=size, seconds=min(times), flops=flops,
              rate=max(rates), ops=ops, share={k: v / runs for k, v in share.items()},
              calls={k: v / runs for k, v in calls.items()},  # a scanned block's, once per turn
              idle=idle / runs, device=str(jax.devices()[0].device_kind))


def report(p: dict) -> None:
  rate, ops, share, calls = p["rate"], p["ops"], p["share"], p["calls"]
  traced = sum(share.values()) + p["idle"]
  print(f"{p['model']} forward, batch {p['batch']} at {p['size']} px on {p['device']}: "
        f"{p['seconds']:.3f} s, {p['flops'] / 1e9:.1f} GFLOP -> {p['flops'] / p['seconds'] / 1e9:.1f} "
        f"GFLOP/s = {p['flops'] / p['seconds'] / rate:.2f} of the fp32 matmul rate "
        f"({rate / 1e9:.1f} GFLOP/s, best measured)")
  print(f"traced: {traced:.3f} s per forward, of which no instruction ran {p['idle']:.3f} s "
        f"({p['idle'] / traced:.1%})")

  def rows(key) -> dict:
    out: dict = {}
    for n, s in share.items():
      k = key(ops[n])
      t, f, c = out.get(k, (0.0, 0.0, 0))
      out[k] = (t + s, f + calls[n] * ops[n].flops, c + round(calls[n]))
    return dict(sorted(out.items(), key=lambda kv: -kv[1][0]))

  def line(label: str, t: float, f: float, extra: str = "") -> str:
    speed = (f"{f / 1e9:8.1f} GFLOP {f / t / 1e9:7.1f} GFLOP/s {f / t / rate:5.2f} of matmul"
             if f else " " * 55)
    return f"  {label:44s} {t * 1e3:8.1f} ms {t / traced:6.1%} {speed}{extra}"

  print("by class (time, share of the traced forward, FLOPs and rate where it computes any):")
  for k, (t, f, _) in rows(lambda o: o.kind).items():
    print(line(k, t, f))
  print("convolutions and dots by shape (window/stride in->out, output size; or output K=):")
  for k, (t, f, c) in rows(lambda o: f"{o.kind[:4]} {o.shape}" if o.flops else None).items():
    if k is not None:
      print(line(k, t, f, f"  x{c}"))
  print("the rest by role (op name without block and unit):")
  rest = [(k, v) for k, v in rows(lambda o: None if o.flops else f"{o.kind} {o.role}").items() if k]
  for k, (t, _, c) in rest[:15]:
    print(line(k, t, 0.0, f"  x{c}"))


def main():
  trace_events_on()  # jax is first imported below, in `profile`
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="bit_r50", choices=sorted(MODELS))
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--size", type=int, default=224)
  ap.add_argument("--runs", type=int, default=3)
  args = ap.parse_args()
  report(profile(args.model, args.batch, args.size, args.runs))


if __name__ == "__main__":
  main()
