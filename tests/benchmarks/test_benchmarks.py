"""The benchmarks at a small scale on CPU: benchmarks.accelerator runs the job once
per Gram precision and prints the table a GPU or TPU session records;
benchmarks.forward_profile accounts for a forward's time by op class;
benchmarks.measures_cost finds the measures' step's LAPACK calls in its trace and
reads a run's phases from its progress bar; benchmarks/gpu.sh gives each benchmark
only flags it takes."""

from __future__ import annotations

import re

from conftest import ROOT, device_env
from support import forked


def run_benchmark(name: str, *args: str) -> str:
  """The stdout of `python -m benchmarks.NAME ARGS` on one CPU device, which must succeed."""
  r = forked.start(["-m", f"benchmarks.{name}", *args], device_env(1), ROOT).wait(600)
  assert r.returncode == 0, r.stderr[-3000:]
  return r.stdout


def test_accelerator_benchmark_runs_and_reports_each_precision():
  out = run_benchmark("accelerator", "--pair", "tiny", "--examples", "64", "--batch", "32",
                      "--precisions", "bf16_6x,highest")
  assert re.search(r"device: 1 x \S+ \(cpu\), jax \S+; pair tiny, 64 examples in minibatches of 32", out)
  bound = re.search(r"FLOP bound: ([\d.]+) s = \(([\d.]+) forward \+ ([\d.]+) Gram TFLOP\) / "
                    r"([\d.]+) TFLOP/s", out)
  assert bound and float(bound[4]) > 0, out
  rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("highest |", "bf16_6x |"))]
  assert [row[0] for row in rows] == ["highest", "bf16_6x"]  # the reference first
  highest = rows[0]
  assert float(highest[1]) > float(highest[2]) > 0 and highest[3].endswith("x")
  assert highest[6] == "0.00e+00"
  assert highest[4] == "n/a (not planned)" and highest[5] == "n/a (not reported)"  # a CPU: no memory
  assert rows[1][1].startswith("not run") or float(rows[1][6]) < 1e-3


def test_forward_profile_accounts_for_the_whole_forward_by_op_class():
  out = run_benchmark("forward_profile", "--model", "tiny_bit", "--batch", "64", "--size", "32",
                      "--runs", "2")
  head = re.search(r"tiny_bit forward, batch 64 at 32 px on cpu: ([\d.]+) s, ([\d.]+) GFLOP -> "
                   r"([\d.]+) GFLOP/s = ([\d.]+) of the fp32 matmul rate \(([\d.]+) GFLOP/s", out)
  assert head, out
  idle = float(re.search(r"traced: [\d.]+ s per forward, of which no instruction ran [\d.]+ s "
                         r"\(([\d.]+)%\)", out)[1])
  section = out.split("by class")[1].split("convolutions and dots")[0]
  classes = {m[1]: (float(m[2]), float(m[3])) for m in
             re.finditer(r"^  (\S+) +([\d.]+) ms +([\d.]+)%", section, re.M)}
  assert {"convolution", "dot", "reduce", "elementwise"} <= set(classes), section
  # Every instruction's time goes to one class: with the idle time, the shares make the span.
  assert abs(sum(s for _, s in classes.values()) + idle - 100) < 0.5, section
  # The convolutions' and dots' FLOPs, each instruction's times its calls (a scan's body once
  # per turn), are the forward's: three numbers printed to 0.05 GFLOP each.
  flops = [float(f) for f in re.findall(r"^  (?:convolution|dot) .* ([\d.]+) GFLOP ", section, re.M)]
  assert len(flops) == 2 and abs(sum(flops) - float(head[2])) <= 0.15, (head[2], section)
  shapes = out.split("convolutions and dots by shape")[1].split("the rest by role")[0]
  assert re.search(r"conv 7x7/2 3->32 out 16x16 .* x1$", shapes, re.M), shapes  # the root, read from HLO
  convs = re.findall(r"conv \S+ \d+->\d+ out \S+ .* x(\d+)$", shapes, re.M)
  # The root and the 3x3s of the first two stages; the last two stages' (2x2 and 1x1
  # outputs) are dots over their windows (`layers.conv`): 64 x 2 x 2 rows, 9 taps of 128,
  # in each of the third stage's 4 units (the last 3 a scan, its body run once a turn).
  assert sum(int(c) for c in convs) == 3, shapes
  assert re.search(r"dot 256x128 K=1152 .* x4$", shapes, re.M), shapes


def test_forward_profile_gives_a_dot_the_idle_time_until_its_result_is_read():
  """XLA:CPU's dot events end when Eigen's pool takes the work: the dot also
  takes the stretches in which nothing ran until the first instruction that
  reads it (past those that run no code) starts, in the same call."""
  from benchmarks import forward_profile as fp
  ops = {"dot.1": fp.Op("dot", "", "", 1.0), "bitcast.2": fp.Op("elementwise", "", "", 0.0, ("dot.1",)),
         "add.3": fp.Op("elementwise", "", "", 0.0, ("bitcast.2",)),
         "neg.4": fp.Op("elementwise", "", "", 0.0)}
  events = [(0, 2, "dot.1"), (3, 4, "neg.4"), (10, 11, "add.3"),  # call 1: add reads the dot at 10
            (20, 22, "dot.1"), (23, 24, "neg.4")]  # call 2: its add not traced
  done = fp.completed(events, ops)
  assert sorted(done) == sorted(events + [(2, 3, "dot.1"), (4, 10, "dot.1")])
  share, idle = fp.wall_shares(done)
  ns = [round(v * 1e9) for v in (share["dot.1"], share["neg.4"], share["add.3"], idle)]
  assert ns == [11, 2, 1, 10]  # call 2's dot, its read not traced, keeps its event: 22 to 23 idle


def test_measures_cost_times_the_steps_lapack_calls_within_it():
  out = run_benchmark("measures_cost", "--layers", "3", "--batch", "16", "--repeats", "1")
  assert re.search(r"^  every measure: [\d.]+ s \([\d.]+x linear CKA alone", out, re.M), out
  got = re.search(r"LAPACK's decompositions \(eigh, SVD\), traced: (\S+) s of (\S+) s a call", out)
  assert got, out
  lapack, traced = float(got[1]), float(got[2])
  assert 0 < lapack < traced, out  # the eigh and SVD calls found by name in the trace, within the call


def test_measures_cost_settings_each_give_up_the_null_or_components():
  import ml_collections
  from benchmarks import measures_cost
  from vitcnn_jax.similarity import measures

  def spec(**fields):
    return measures.spec_of(ml_collections.ConfigDict(dict(measures=measures.NAMES, batch_size=256,
                                                           num_examples=256, **fields)))
  default = spec(**measures_cost.setting_fields(*measures_cost.DEFAULTS))
  got = [spec(**measures_cost.setting_fields(*s)) for s in measures_cost.SETTINGS]
  kinds = {(g.null, g.cca_dims, g.subspace_dims) for g in [default, *got]}
  assert len(kinds) == len(got) + 1, kinds  # each setting a program of its own, none the defaults
  for g in got:  # each reads fewer components per pair (both families), or drops the null
    assert not g.null or (g.subspace_dims < default.subspace_dims and g.cca_dims < default.cca_dims), g


def test_measures_cost_families_add_each_measure_to_linear_cka_once():
  import ml_collections
  from benchmarks import measures_cost
  from vitcnn_jax.similarity import measures
  sets = measures_cost.family_sets()
  assert sets[0] == ("linear_cka",) and all(s[0] == "linear_cka" for s in sets)  # the ratio's own first
  added = [m for s in sets for m in s[1:]]
  assert sorted(added) == sorted(measures.NAMES[1:]), added  # every other measure, in one run only
  for s in sets:  # each a config the demo's flag takes
    measures.spec_of(ml_collections.ConfigDict(dict(measures=s, null=True, batch_size=256, num_examples=2560)))


def test_measures_cost_reads_a_runs_phases_from_its_progress_bar():
  from benchmarks import measures_cost
  bar = lambda n, elapsed, left: f"cka:  {25 * n}%|##  | {n}/4 [{elapsed}<{left},  1.50s/step, 99.5 examples/s]"
  log = "\r".join(["cka:   0%|    | 0/4 [00:00<?, ?step/s]", bar(1, "00:11", "00:30"),
                   bar(2, "00:13", "00:04"), bar(3, "00:15", "00:02"), bar(4, "01:17", "00:00")]) + "\n"
  assert measures_cost.bar_phases(log) == (11, 66, 3)  # the first step; the 3 after it, to the last
  assert measures_cost.midpoint_eta(log) == (2, 4, 4, 64)  # at step 2: ETA 4 s, really 77 - 13 s left


def test_the_flop_count_runs_a_scans_body_once_per_turn():
  """The FLOP bound's count: a scanned ViT's forward has the FLOPs of its blocks
  applied one by one (training applies them so), and a scan of a dot its
  body's FLOPs times its length."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from benchmarks import clocks
  from vitcnn_jax.models import ViT, param_trees
  body = lambda c, w: (c @ w, None)
  scanned = jax.make_jaxpr(lambda a, w: jax.lax.scan(body, a, w)[0])(jnp.ones((4, 5)), jnp.ones((3, 5, 5)))
  assert clocks.matmul_flops(scanned.jaxpr) == 3 * (2 * 4 * 5 * 5)
  model = ViT(num_classes=10, image_size=32, patch_size=8, width=32, depth=4, mlp_dim=64, num_heads=2)
  x = np.zeros((2, 32, 32, 3), np.float32)
  params = param_trees.random_params(model, x)
  count = lambda train: clocks.matmul_flops(jax.make_jaxpr(
      lambda p: model.apply({"params": p}, x, train=train, rngs={"dropout": jax.random.key(0)})[0])(params).jaxpr)
  assert count(False) == count(True) > 0


def test_gpu_script_passes_each_benchmark_only_flags_it_takes():
  """benchmarks/gpu.sh runs on a lent machine, where a renamed flag costs a call:
  every `--flag` it gives this checkout's benchmark modules (not the revision
  before's, run from its own folder) is in that module's --help."""
  import os
  with open(os.path.join(ROOT, "benchmarks", "gpu.sh")) as f:
    script = "\n".join(line for line in f.read().splitlines()
                       if not line.lstrip().startswith("#") and "cd $base" not in line)
  module = dict(re.findall(r"^(\w+)=(benchmarks\.\w+)$", script, re.M))
  calls = [(module.get(name.lstrip("$"), name), line) for name, line in
           re.findall(r"-m (\$\w+|benchmarks\.\w+|pytest)\b(.*(?:\\\n.*)*)", script)]
  arrays: dict[str, list[str]] = {}  # an array's flags, over all its definitions
  for name, items in re.findall(r"\b(\w+)=\(([^)]*)\)", script):
    arrays.setdefault(name, []).extend(re.findall(r"--\w+", items))
  flags = lambda line: re.findall(r"--\w+", line) + [
      f for name in re.findall(r"\$\{(\w+)\[@\]\}", line) for f in arrays[name]]
  calls = [(m, flags(line)) for m, line in calls if m.startswith("benchmarks.")]
  assert {m for m, _ in calls} == {"benchmarks.cka_benchmark", "benchmarks.measures_cost",
                                   "benchmarks.accelerator"}, calls
  for m in {m for m, _ in calls}:
    takes = set(re.findall(r"--\w+", run_benchmark(m.split(".")[1], "--help")))
    for name, given in calls:
      if name == m:
        assert set(given) <= takes, (m, sorted(set(given) - takes))
