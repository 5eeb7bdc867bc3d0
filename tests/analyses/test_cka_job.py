"""The CKA job end to end: files, independent check, 8 devices, 2 processes, resume."""

from __future__ import annotations

import collections
import json
import re
import socket

import jax
import numpy as np
import pytest

from conftest import ROOT, device_env, run_main
from support import forked
from support import upstream_files as uf
from support.cka_ref import np_minibatch_cka
from support.numerics import assert_close, job_runs_bound
from vitcnn_jax import checkpoints
from vitcnn_jax.inputs import data
from vitcnn_jax.inputs import zoo
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import neighbours
from vitcnn_jax.similarity import subspaces

EXAMPLES, BATCH, REPEATS = 44, 8, 2  # 5 full minibatches and one of 4
RUNS_BOUND = job_runs_bound(BATCH)


def _flags(tiny_vit_bit, workdir, *extra):
  vit, bit = tiny_vit_bit
  return [f"--config={ROOT}/configs/cka_vit_resnet.py:examples={EXAMPLES},batch={BATCH},repeats={REPEATS}",
          f"--workdir={workdir}", f"--config.models.vit.checkpoint={vit}",
          f"--config.models.resnet.checkpoint={bit}", "--config.models.resnet.overrides.resolution=32",
          "--config.data.source=synthetic", "--config.data.num_examples=64", *extra]


def _run(args, devices=None, check=True):
  """In this process (8 devices) unless `devices` asks for a child process."""
  return run_main(*args, devices=devices, check=check)


# Every similarity measure, its null and bootstrap intervals, from one pass.
MEASURES = (f"--config.measures={measures.NAMES!r}".replace(" ", ""),
            "--config.null=True", "--config.knn_k=3", "--config.bootstrap=16")
# Each block's output only: for the runs that test how the work is spread, not the layers.
BLOCKS = ("--config.models.vit.capture=('blocks',)", "--config.models.resnet.capture=('blocks',)")
# Results only, for the runs whose figures are not under test (the job's are checked on
# `eight_devices`, and drawn from saved sums in test_results_only_then_the_figures_...).
NO_FIGURES = ("--config.plot.format=none",)


@pytest.fixture(scope="module")
def one_device(tiny_vit_bit, tmp_path_factory):
  """Every layer and every measure on one device (a child process): the reference
  for the float64 check, the files' layout and the intervals (results only)."""
  wd = tmp_path_factory.mktemp("one")
  _run(_flags(tiny_vit_bit, wd, *MEASURES, *NO_FIGURES), devices=1)
  return wd


@pytest.fixture(scope="module")
def blocks_one_device(tiny_vit_bit, tmp_path_factory):
  """Each block's output, every measure, on one device (a child process): the
  reference for the runs that spread minibatches over devices and processes (their
  linear CKA) and for `eight_devices` (every measure)."""
  wd = tmp_path_factory.mktemp("blocks")
  _run(_flags(tiny_vit_bit, wd, *BLOCKS, *MEASURES, *NO_FIGURES), devices=1)
  return wd


@pytest.fixture(scope="module")
def eight_devices(tiny_vit_bit, tmp_path_factory):
  """`blocks_one_device`'s job on this process's eight devices, with its figures
  (each block's output: how the rows are spread does not depend on the layers)."""
  wd = tmp_path_factory.mktemp("eight")
  _run(_flags(tiny_vit_bit, wd, *BLOCKS, *MEASURES))
  return wd


@pytest.fixture(scope="module")
def resumed(tiny_vit_bit, tmp_path_factory):
  """`blocks_one_device`'s job stopped after 4 steps, then resumed (child processes
  each): (its workdir, what the stopped run printed and left)."""
  wd = tmp_path_factory.mktemp("resumed")
  r = _run(_flags(tiny_vit_bit, wd, *BLOCKS, *MEASURES, *NO_FIGURES, "--config.stop_after=4"),
           devices=1)
  state = wd / "cka_state.npz"
  stopped = dict(stdout=r.stdout, state=state.exists(), result=(wd / "cka.npz").exists(),
                 position=tuple(np.load(state)["position"]) if state.exists() else None)
  _run(_flags(tiny_vit_bit, wd, *BLOCKS, *MEASURES, *NO_FIGURES), devices=1)
  return wd, stopped


def test_writes_results_and_figures(one_device, eight_devices):
  wd = one_device
  summary = json.loads((wd / "cka.json").read_text())
  assert summary["num_examples"] == EXAMPLES and summary["repeats"] == REPEATS
  assert summary["memory_plan"] == {"minibatch": BATCH, "devices_per_minibatch": 1, "peak_bytes": 0,
                                    "limit_bytes": None}  # a CPU: nothing to plan against
  z = np.load(wd / "cka.npz")
  nv, nr = len(z["names_vit"]), len(z["names_resnet"])
  assert nv == 12 and nr == 17  # 6 per ViT block; root 2 + 2 units x 7 + head
  # Models in name order: resnet, then vit.
  assert z["cka_vit_vit"].shape == (nv, nv) and z["cka_resnet_resnet"].shape == (nr, nr)
  assert z["cka_resnet_vit"].shape == (nr, nv)
  assert z["per_repeat"].shape == (REPEATS, nr + nv, nr + nv)
  np.testing.assert_allclose(np.diag(z["cka_vit_vit"]), 1, atol=1e-12)  # float64 HSIC / itself
  assert (z["std_resnet_vit"] > 0).any()  # repeats use different samples
  assert not list(wd.glob("*.png"))  # config.plot.format="none": results only
  for tag in ("vit_vit", "resnet_resnet", "resnet_vit"):
    assert (eight_devices / f"cka_{tag}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_findings_statistics_on_every_layer_the_block_outputs_and_each_replicate(one_device):
  """Figs 1 and 2's statistics from the job's own CKA matrix: on every captured
  (`paper`) layer, on each model's block outputs alone, and one per bootstrap replicate."""
  from vitcnn_jax import analyses
  s = json.loads((one_device / "cka.json").read_text())
  z = np.load(one_device / "cka.npz")
  names = {"resnet": list(z["names_resnet"]), "vit": list(z["names_vit"])}
  cka = z["per_repeat"].mean(axis=0)  # resnet's layers, then vit's
  start = {"resnet": 0, "vit": len(names["resnet"])}
  outputs = {"resnet": [i for i, n in enumerate(names["resnet"]) if re.fullmatch(r"block\d+/unit\d+/out", n)],
             "vit": [i for i, n in enumerate(names["vit"]) if re.fullmatch(r"block\d+/out", n)]}
  assert len(outputs["resnet"]) == 2 and len(outputs["vit"]) == 2

  def expect(keep):
    part = lambda a, b: cka[np.ix_(start[a] + np.asarray(keep[a]), start[b] + np.asarray(keep[b]))]
    off = {k: part(k, k)[~np.eye(len(keep[k]), dtype=bool)].mean() for k in keep}
    cross = part("resnet", "vit")
    best = cross[:max(1, len(cross) // 2)].argmax(axis=1) / (cross.shape[1] - 1)
    return off, best.mean()

  for got, keep in ((s, {k: range(len(v)) for k, v in names.items()}), (s["block_outputs"], outputs)):
    off, lower = expect(keep)
    for k in names:
      assert abs(got["mean_off_diagonal_cka"][k] - off[k]) <= 1e-12
    assert abs(got["lower_half_best_match"]["resnet_in_vit"] - lower) <= 1e-12
  assert s["layer_set"] == "paper" and s["block_outputs"]["layers"] == {"resnet": 2, "vit": 2}
  reps = s["bootstrap"]["findings"]["mean_off_diagonal_cka"]
  assert len(reps["vit"]) == s["bootstrap"]["replicates_with_a_value"] and np.ptp(reps["vit"]) > 0
  judged = analyses.get("cka").verdicts(s)[0][1]
  assert [k for k, _, _ in judged.variants] == ["layers=paper, sample=as drawn", "layers=blocks, sample=as drawn",
                                                "layers=paper, sample=bootstrap"]


def test_matches_an_independent_float64_computation(one_device, tiny_vit_bit):
  """Same samples through the models in-process, CKA in float64 NumPy."""
  z = np.load(one_device / "cka.npz")
  source = data.SyntheticSource(64, 32, 0)
  vit, bit = tiny_vit_bit
  mx, px = checkpoints.load_model(vit)
  my, py = checkpoints.load_model(bit, resolution=32)
  pairs = [("block00/ln1", "root/conv"), ("block01/out", "block2/unit01/conv2"),
           ("block01/mlp/hidden", "head/preact")]
  apply_x = jax.jit(lambda p, x: mx.apply({"params": p}, x, capture=[a for a, _ in pairs])[1])
  apply_y = jax.jit(lambda p, x: my.apply({"params": p}, x, capture=[b for _, b in pairs])[1])
  names_vit, names_resnet = list(z["names_vit"]), list(z["names_resnet"])
  imgs = (np.stack(source.images(np.arange(64))).astype(np.float32) - 127.5) / 127.5
  ox, oy = jax.device_get((apply_x(px, imgs), apply_y(py, imgs)))  # every image, one forward each
  for repeat in range(REPEATS):
    idx = data.sample(64, EXAMPLES, 0, repeat)
    xs, ys = {}, {}
    for start in range(0, EXAMPLES, BATCH):
      rows = idx[start:start + BATCH]
      for a, b in pairs:
        xs.setdefault(a, []).append(ox[a][rows])
        ys.setdefault(b, []).append(oy[b][rows])
    for a, b in pairs:
      ref = np_minibatch_cka(xs[a], ys[b])
      ours = z["per_repeat"][repeat, len(names_resnet) + names_vit.index(a), names_resnet.index(b)]
      assert_close(ours, ref, RUNS_BOUND, f"repeat {repeat}: {a} x {b}")


def test_eight_devices_equal_one_device(blocks_one_device, eight_devices):
  a, b = np.load(blocks_one_device / "cka.npz"), np.load(eight_devices / "cka.npz")
  assert_close(b["per_repeat"], a["per_repeat"], RUNS_BOUND, "8 devices vs 1")
  assert json.loads((eight_devices / "cka.json").read_text())["devices"] == 8


@pytest.mark.parametrize("group", [2, 8])
def test_minibatches_spread_over_devices_equal_one_device(blocks_one_device, tiny_vit_bit, tmp_path, group):
  """Each minibatch of 8 over `group` of the 8 devices (rows of 4 or 1; the last
  minibatch of 4 leaves devices with padding only)."""
  _run(_flags(tiny_vit_bit, tmp_path, *BLOCKS, f"--config.devices_per_minibatch={group}", *NO_FIGURES))
  a, b = np.load(blocks_one_device / "cka.npz"), np.load(tmp_path / "cka.npz")
  assert_close(b["per_repeat"], a["per_repeat"], RUNS_BOUND, f"{group} devices per minibatch vs 1")


def test_results_only_then_the_figures_from_the_saved_sums(blocks_one_device, tiny_vit_bit, tmp_path):
  """config.plot.format="none" writes the results and no figure; the same command
  with a figure format, in that workdir, draws them from the saved sums."""
  flags = _flags(tiny_vit_bit, tmp_path, *BLOCKS)
  r = _run([*flags, *NO_FIGURES])
  assert (tmp_path / "cka.npz").exists() and not list(tmp_path.glob("*.png")), r.stdout
  assert "and figures" not in r.stdout
  first = np.load(tmp_path / "cka.npz")["per_repeat"]
  r = _run([*flags, "--config.plot.format=svg"])
  assert "writing its results again from the saved sums" in r.stdout, r.stdout
  np.testing.assert_array_equal(np.load(tmp_path / "cka.npz")["per_repeat"], first)  # not recomputed
  for tag in ("vit_vit", "resnet_resnet", "resnet_vit"):
    assert (tmp_path / f"cka_{tag}.png").exists() and (tmp_path / f"cka_{tag}.svg").exists(), tag


def test_minibatches_with_a_layer_out_of_range_are_run_again_prescaled_to_the_same_cka(
    tiny_vit_bit, tmp_path, monkeypatch):
  """With `grams.GRAM_RANGE` narrowed so that every layer made as its features
  are is out of it, every step is run again with its layers prescaled (each by
  its largest |x|, then kept at that scale): the same CKA, to the bit, as the
  run in range, every scaling a power of two."""
  from vitcnn_jax.run import exported
  from vitcnn_jax.run import programs
  from vitcnn_jax.similarity import grams
  monkeypatch.setattr(exported, "path_for", lambda key, signature: None)  # each run traced anew
  flags = _flags(tiny_vit_bit, tmp_path / "in", *BLOCKS, *NO_FIGURES)
  monkeypatch.setattr(programs, "_COMPILED", collections.OrderedDict())
  _run(flags)
  monkeypatch.setattr(programs, "_COMPILED", collections.OrderedDict())
  monkeypatch.setattr(grams, "GRAM_RANGE", (2.0 ** 60, 2.0 ** 60))
  calls = collections.Counter()
  call = programs.Step.__call__
  monkeypatch.setattr(programs.Step, "__call__",
                      lambda self, *a, prescale=False: calls.update([prescale]) or call(self, *a, prescale=prescale))
  _run(_flags(tiny_vit_bit, tmp_path / "out", *BLOCKS, *NO_FIGURES))
  steps = REPEATS * -(-EXAMPLES // (BATCH * jax.device_count()))  # a minibatch a device each step
  assert calls == {False: steps, True: steps}, calls
  want, got = np.load(tmp_path / "in" / "cka.npz"), np.load(tmp_path / "out" / "cka.npz")
  np.testing.assert_array_equal(got["per_repeat"], want["per_repeat"])


@pytest.mark.parametrize("planned", [False, True])
def test_each_pass_is_compiled_and_the_compiler_s_memory_handed_back_before_it_runs(
    tiny_vit_bit, tmp_path, monkeypatch, planned):
  """The driver compiles a pass's step before its first minibatch and hands back
  the heap the compiler freed (`memory.release_freed`), once: after the pass's
  compile, or after the memory planner's (a device memory given), whose step it
  runs: the steps' buffers do not sit on top of it (on workload W, every measure,
  the process peak fell from 2.89 to 2.43 GiB)."""
  from vitcnn_jax.run import memory
  from vitcnn_jax.run import programs
  from vitcnn_jax.run import runstate
  released, ran = [], []
  monkeypatch.setattr(memory, "release_freed", lambda: released.append(len(ran)))
  monkeypatch.setattr(programs, "_COMPILED", collections.OrderedDict())  # none compiled before
  add = runstate.Steps.add
  monkeypatch.setattr(runstate.Steps, "add", lambda self, *a: (ran.append(1), add(self, *a))[1])
  limit = ("--config.device_memory_gib=64",) if planned else ()
  _run(_flags(tiny_vit_bit, tmp_path, *BLOCKS, *NO_FIGURES, "--config.stop_after=2", *limit))
  assert released == [0] and len(ran) == 2, (released, ran)
  # The same run again in this process: its step is the one compiled above, not compiled again.
  _run(_flags(tiny_vit_bit, tmp_path / "again", *BLOCKS, *NO_FIGURES, "--config.stop_after=2", *limit))
  assert released == [0] and len(ran) == 4, (released, ran)


class _Result:
  """A step's device result (its exponents) that finishes when the test says (or
  when waited for)."""

  def __init__(self, e: int = 0):
    self.ready, self.e = False, e

  def is_ready(self) -> bool:
    return self.ready

  def block_until_ready(self) -> "_Result":
    self.ready = True
    return self

  def __array__(self, dtype=None, copy=None) -> np.ndarray:
    return np.full(3, self.e, dtype)


class _Counted:
  """What `progress.Bar.update` is told: steps and examples."""
  n = examples = 0

  def update(self, steps: int, examples: int) -> None:
    self.n, self.examples = self.n + steps, self.examples + examples


def test_the_progress_bar_counts_finished_steps_not_dispatched_ones():
  """The bar (and its examples/s and ETA) advances as steps finish, in order,
  with at most `IN_FLIGHT` dispatched steps ahead of it (it sat at 28 of 30
  for minutes with every measure at batch 256): dispatched and unfinished
  steps are not counted, finished ones are."""
  from vitcnn_jax.run import runstate
  bar = _Counted()
  steps = runstate.Steps(None, {}, None, (0, 0), bar)
  results = [_Result() for _ in range(5)]
  add = lambda r: steps.add({"log2_scale": r}, 0, 7, _never)
  for r in results[:runstate.IN_FLIGHT]:
    add(r)
  assert bar.n == 0 and not any(r.ready for r in results)  # dispatched, none finished
  add(results[2])  # one too many in flight: the oldest is waited for
  assert bar.n == 1 and results[0].ready and not results[1].ready
  results[2].ready = True  # finished before the one ahead of it: counted after it, in order
  add(results[3])
  assert bar.n == 3 and results[1].ready and bar.examples == 21
  add(results[4])
  assert bar.n == 3 and not results[3].ready  # two in flight, neither finished
  results[4].ready = True
  add(_Result())
  assert bar.n == 5 and results[3].ready


def _never() -> None:
  raise AssertionError("a step whose layers were in range was run again")


def test_a_step_with_a_layer_out_of_range_is_run_again_prescaled_before_it_is_counted():
  """A finished step whose exponents say a layer left float32's range
  (`grams.UNFIT`) is replaced by its run with the layers prescaled, before the
  bar counts it and before its sums are fetched; each run again is let go once
  counted (it holds its minibatch), and a step in range is never run again."""
  from vitcnn_jax.run import runstate
  from vitcnn_jax.similarity import grams
  bar = _Counted()
  steps = runstate.Steps(None, {}, None, (0, 0), bar)
  again = _Result(e=5)
  steps.add({"log2_scale": _Result(e=grams.UNFIT)}, 0, 7, lambda: {"log2_scale": again})
  steps.add({"log2_scale": _Result()}, 0, 7, _never)
  steps.add({"log2_scale": _Result()}, 0, 7, _never)  # the first is waited for: run again, counted
  assert bar.n == 1 and again.ready
  assert steps.pending[0].result["log2_scale"] is again and steps.pending[0].again is None


def test_a_memory_limit_spreads_minibatches_or_is_a_clear_error(blocks_one_device, tiny_vit_bit, tmp_path,
                                                                monkeypatch):
  """A fake device memory (config.device_memory_gib) between the step's compiled
  peak on one device and on 8 makes the planner spread each minibatch; one too
  small for any group names the largest minibatch that fits. Each block's output
  only: the planner compiles a step per group it tries, so the smallest step."""
  from configs import cka_vit_resnet
  from vitcnn_jax.analyses import cka as cka_job
  from vitcnn_jax.run import driver
  from vitcnn_jax.run import loading
  from vitcnn_jax.run import memory
  config = cka_vit_resnet.get_config(f"examples={EXAMPLES},batch={BATCH},repeats={REPEATS}")
  config.models.vit.checkpoint, config.models.resnet.checkpoint = tiny_vit_bit
  config.models.resnet.overrides.resolution = 32
  config.models.vit.capture = config.models.resnet.capture = ("blocks",)
  models = loading.load_models(config)
  job = cka_job.CKA(config, models)
  peaks = {}
  for g in (1, 8):
    with config.unlocked():
      config.devices_per_minibatch, config.device_memory_gib = g, 1e3
    plan, _ = driver.plan_devices(config, job, models, jax.lax.Precision.HIGHEST)
    peaks[g] = plan.peak_bytes
  assert peaks[8] < peaks[1], peaks
  with config.unlocked():
    config.devices_per_minibatch = 0
    config.device_memory_gib = (peaks[1] + peaks[8]) / 2 / memory.GIB / memory.HEADROOM
  plan, compiled = driver.plan_devices(config, job, models, jax.lax.Precision.HIGHEST)
  assert plan.devices_per_minibatch > 1
  assert plan.peak_bytes <= memory.device_limit(config.device_memory_gib)
  assert (BATCH, plan.devices_per_minibatch) in compiled  # the steps it measured
  # The run as main.py runs it, in a fresh process that reads the steps the planner
  # wrote to the suite's persistent compilation cache (steps with collectives in a
  # loop came back broken from it: why hsic's group rings are unrolled).
  monkeypatch.setenv("JAX_LOG_COMPILES", "1")
  r = _run(_flags(tiny_vit_bit, tmp_path, f"--config.device_memory_gib={config.device_memory_gib}",
                  *BLOCKS, *NO_FIGURES), devices=8)
  assert f"Memory plan: minibatch 8 over {plan.devices_per_minibatch} devices" in r.stdout
  # The run steps with the last step the planner compiled: one compile per group tried
  # (a step of one device a minibatch through the program kept for later processes).
  tried = memory.groups(BATCH, 8).index(plan.devices_per_minibatch) + 1
  assert sum(r.stderr.count(f"Finished XLA compilation of jit({name})") for name in ("local", "kept_step")
             ) == tried, r.stderr[-3000:]
  assert json.loads((tmp_path / "cka.json").read_text())["memory_plan"] == {
      "minibatch": BATCH, "devices_per_minibatch": plan.devices_per_minibatch,
      "peak_bytes": plan.peak_bytes, "limit_bytes": plan.limit_bytes}  # the plan it ran with
  got = np.load(tmp_path / "cka.npz")["per_repeat"]
  assert got.shape[0] == REPEATS
  assert_close(got, np.load(blocks_one_device / "cka.npz")["per_repeat"], RUNS_BOUND, "planned vs 1 device")
  with config.unlocked():
    config.device_memory_gib = peaks[8] / 4 / memory.GIB
  with pytest.raises(MemoryError, match="does not fit in device memory: minibatch 8 over 8 devices"):
    driver.plan_devices(config, job, models, jax.lax.Precision.HIGHEST)


@pytest.mark.parametrize("group", [1, 8])
def test_two_processes_equal_one_process(blocks_one_device, tiny_vit_bit, tmp_path, group):
  """Two processes x 4 CPU devices over loopback (gloo), each loading its own rows;
  with group 8, each minibatch spans both processes."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = [forked.start(["main.py", *_flags(tiny_vit_bit, tmp_path, *BLOCKS, *NO_FIGURES),
                         f"--config.devices_per_minibatch={group}", "--distributed",
                         f"--coordinator=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}",
                         "--cpu_collectives=gloo"], device_env(4), ROOT) for i in range(2)]
  done = [p.wait(timeout=300) for p in procs]
  assert all(r.returncode == 0 for r in done), "\n".join(  # both: one's failure resets the other
      f"process {i}: exit {r.returncode}\n{r.stderr[-2500:]}" for i, r in enumerate(done))
  a, b = np.load(blocks_one_device / "cka.npz"), np.load(tmp_path / "cka.npz")
  assert_close(b["per_repeat"], a["per_repeat"], RUNS_BOUND, "2 processes vs 1")
  assert json.loads((tmp_path / "cka.json").read_text())["devices"] == 8


def test_interrupted_run_resumes_to_the_same_result(blocks_one_device, resumed):
  wd, stopped = resumed
  assert "Stopped after 4 steps" in stopped["stdout"]
  assert stopped["state"] and not stopped["result"]
  assert stopped["position"] == (0, 0, 4)  # pass 0, repeat 0, after step 4
  np.testing.assert_array_equal(np.load(wd / "cka.npz")["per_repeat"],
                                np.load(blocks_one_device / "cka.npz")["per_repeat"])


def test_bad_config_fields_are_named(tiny_vit_bit, tmp_path):
  r = _run(_flags(tiny_vit_bit, tmp_path, "--config.batch_size=3"), check=False)
  assert r.returncode != 0 and "config.batch_size=3" in r.stderr
  r = _run(_flags(tiny_vit_bit, tmp_path, "--config.num_examples=42"), check=False)
  assert r.returncode != 0 and "last minibatch of 2" in r.stderr
  r = _run(_flags(tiny_vit_bit, tmp_path, "--config.num_examples=100"), check=False)
  assert r.returncode != 0 and "config.num_examples=100, but the data" in r.stderr and "has 64 examples" in r.stderr
  r = _run(_flags(tiny_vit_bit, tmp_path, "--config.models.vit.capture=block*/nothing"), check=False)
  assert r.returncode != 0 and "capture: " in r.stderr and "match no representation point" in r.stderr
  r = _run(_flags(tiny_vit_bit, tmp_path, "--config.models.vit.checkpoint=gs://nowhere/x.npz"), check=False)
  assert r.returncode != 0 and "--config.models.vit.checkpoint=" in r.stderr
  r = _run(_flags(tiny_vit_bit, tmp_path, "--config.data.source=csv"), check=False)
  assert r.returncode != 0 and "config.data.source='csv'" in r.stderr
  r = _run(_flags(tiny_vit_bit, tmp_path, "--config.gram_precision=fp16"), check=False)
  assert r.returncode != 0 and "config.gram_precision: gram precision 'fp16' is not one of" in r.stderr
  r = _run(_flags(tiny_vit_bit, tmp_path, "--config.devices_per_minibatch=3"), check=False)
  assert r.returncode != 0 and "config.devices_per_minibatch=3 must divide both the 8 devices" in r.stderr


def test_four_models_as_a_mapping_two_of_one_architecture_as_one_loop(tiny_vit_bit, blocks_one_device, tmp_path,
                                                                      monkeypatch):
  """config.models = {name: spec}: every pair's block from one HSIC matrix, equal to
  the two-model run's blocks for the same two models (each block's output: the
  mapping, not the layers, is under test). Two models of one architecture (here
  one checkpoint twice) share one loop over their stacked parameters in the step:
  each of their points' Gram is traced once for both, not once per model."""
  import ml_collections
  from configs import cka_vit_resnet, common
  from vitcnn_jax import jobs
  from vitcnn_jax.run import protocol
  from vitcnn_jax.similarity import grams
  counts = collections.Counter()
  real_layer, real_sums = grams.layer_parts, protocol.Forward.measure_sums
  monkeypatch.setattr(grams, "layer_parts", lambda *a, **k: counts.update(["grams"]) or real_layer(*a, **k))
  monkeypatch.setattr(protocol.Forward, "measure_sums",
                      lambda *a, **k: counts.update(["steps"]) or real_sums(*a, **k))
  vit, bit = tiny_vit_bit
  third = uf.save(tmp_path / "gap.npz", uf.bv_vit(1, pool="gap", width=48, depth=2, heads=3, mlp=96, patch=8))
  config = cka_vit_resnet.get_config(f"b16_r50,examples={EXAMPLES},batch={BATCH},repeats={REPEATS}")
  config.models = ml_collections.ConfigDict({
      "a_vit": common.model(vit, "blocks", "ViT"),
      "b_bit": common.model(bit, "blocks", "BiT", resolution=32),
      "c_gap": common.model(third, "blocks", "ViT GAP"),
      "d_vit": common.model(vit, "blocks", "ViT again")})
  config.data = zoo.data_spec("synthetic", num_examples=64)
  jobs.run(config, str(tmp_path / "wd"))
  z = np.load(tmp_path / "wd" / "cka.npz")
  names = ["a_vit", "b_bit", "c_gap", "d_vit"]
  pairs = [f"{a}_{b}" for i, a in enumerate(names) for b in names[i:]]
  assert sorted(k[4:] for k in z.files if k.startswith("cka_")) == sorted(pairs)
  assert z["cka_a_vit_c_gap"].shape == (2, 2) and z["cka_b_bit_c_gap"].shape == (2, 2)
  for tag in pairs:
    assert (tmp_path / "wd" / f"cka_{tag}.png").exists()
  two = np.load(blocks_one_device / "cka.npz")
  for three_tag, two_tag in (("a_vit_a_vit", "vit_vit"), ("b_bit_b_bit", "resnet_resnet")):
    assert_close(z[f"cka_{three_tag}"], two[f"cka_{two_tag}"], RUNS_BOUND, three_tag)
  assert_close(z["cka_a_vit_b_bit"], two["cka_resnet_vit"].T, RUNS_BOUND, "a_vit_b_bit")
  for tag in ("a_vit_d_vit", "d_vit_d_vit"):  # one checkpoint twice: its self-CKA
    assert_close(z[f"cka_{tag}"], z["cka_a_vit_a_vit"], RUNS_BOUND, tag)
  one_loop = sum(len(z[f"cka_{n}_{n}"]) for n in names[:3])  # d_vit's points traced with a_vit's
  assert counts["steps"] >= 1 and counts["grams"] == one_loop * counts["steps"], (counts, one_loop)


def test_every_measure_and_its_null_on_eight_devices_equal_one_device(blocks_one_device, eight_devices):
  """Each measure and its null from the one sharded pass: 8 devices as 1 (the same
  minibatches, the same permutations: a minibatch's key does not depend on the
  device count), every array of every measure and the side-by-side figures."""
  a, b = np.load(blocks_one_device / "cka.npz"), np.load(eight_devices / "cka.npz")
  for name in measures.NAMES:
    m = "cka" if name == "linear_cka" else name
    per = "per_repeat" if m == "cka" else f"{m}_per_repeat"
    # Two compiles of the models: CKA-type measures move within the job's bound; a
    # neighbour set changes only at a near-tie, each moving mutual k-NN by 1/(k N)
    # (and CKNNA by its share of one neighbour; the other k-NN measures by at most one
    # example's share): one per cell is allowed. Distances in the layers' units move by
    # the features' relative difference of them.
    slack = ({"mutual_knn": 1 / (3 * EXAMPLES), "cknna": 1 / (3 * EXAMPLES)}.get(m, 0.0)
             + (1 / EXAMPLES if m in neighbours.NAMES else 0.0))
    units = max(1.0, np.abs(a[per]).max()) if m in ("rsm_difference", "magnitude_difference") else 1.0
    assert_close(b[per], a[per], RUNS_BOUND * units + slack, f"{m}: 8 devices vs 1")
    if not measures.REGISTRY[name].null:  # the examples' order does not enter (descriptive)
      assert f"null_{m}_resnet_vit" not in a, m
      continue
    assert_close(b[f"null_{m}_resnet_vit"], a[f"null_{m}_resnet_vit"], RUNS_BOUND * units + slack,
                 f"null {m}")
    # The null differs (the subspace measures of these random networks, one component per
    # layer in minibatches of 4 to 8, sit nearer theirs).
    apart = 0.01 if name in subspaces.FAMILY.names else 0.05
    assert np.abs(a[f"{m}_resnet_vit"] - a[f"null_{m}_resnet_vit"]).max() > apart, m
  summary = json.loads((eight_devices / "cka.json").read_text())
  assert set(summary["measures"]) == set(measures.NAMES)
  score = summary["measures"]["svcca"]["matching"]["score"]["resnet_vit"]
  assert score["interval"][0] <= score["value"] <= score["interval"][1], score
  assert score["interval_method"].startswith("95% percentile interval of the bootstrap")
  assert len(b["monotone_svcca_resnet_vit"]) == len(b["names_resnet"])
  assert np.all(np.diff(b["monotone_svcca_resnet_vit"]) >= 0)
  assert summary["measures"]["mean_cca"]["components"] >= 1  # half the smallest minibatch
  assert summary["measures"]["mean_cca"]["reduced_layers"]  # the blocks are wider than that
  kept = summary["measures"]["mean_cca"]["variance_kept"]  # by the top cca_dims: under all of it
  assert set(kept) == set(b["names_resnet"]) | set(b["names_vit"]) and 0 < min(kept.values()) < 1
  wide = summary["measures"]["procrustes"]  # subspace_dims (32) covers these minibatches: all of it
  assert wide["components"] == measures.SUBSPACE_DIMS and min(wide["variance_kept"].values()) > 1 - 1e-5
  assert "unbiased" in summary["measures"]["linear_cka"]["estimator"]
  cells = len(b["names_resnet"]) * len(b["names_vit"])
  assert summary["measures"]["rsa"]["null"]["cells"]["resnet_vit"] == cells
  for tag in ("vit_vit", "resnet_resnet", "resnet_vit"):
    assert (eight_devices / f"measures_{tag}.png").read_bytes()[:4] == b"\x89PNG"


def test_a_reduction_of_the_layers_variance_is_said_with_the_field_that_sets_it(capsys):
  from vitcnn_jax.analyses import cka
  spec = measures.Spec(("procrustes", "mean_cca"), cca_dims=5, subspace_dims=32)
  cka._say_reduced(["a", "b"], spec, ["mean_cca", "procrustes"],
                   {"shape_kept": np.array([1.0, 0.7]), "subspace_kept": np.array([1.0, 1.0])})
  out = capsys.readouterr().out
  assert out == ("procrustes: each layer's top 32 principal components, keeping a mean 85.0% of its "
                 "variance (least 70.0%, b); config.subspace_dims sets how many (json: "
                 "measures.M.variance_kept).\n")  # mean_cca's components kept all of it: no line


def test_bootstrap_intervals_on_any_device_count_and_across_a_resume(one_device, blocks_one_device,
                                                                    eight_devices, resumed):
  """The Poisson weights belong to minibatches, not devices: 1 device, 8 devices
  and a run stopped and resumed give the same intervals; each holds its estimate."""
  a, want = np.load(one_device / "cka.npz"), np.load(blocks_one_device / "cka.npz")
  for other in (eight_devices, resumed[0]):
    b = np.load(other / "cka.npz")
    for key in ("rbf_cka_ci_low_resnet_vit", "cka_ci_high_vit_vit", "rsa_ci_low_resnet_resnet"):
      assert_close(b[key], want[key], RUNS_BOUND, f"{key}: {other.name}")
  for p in ("cka", "rbf_cka", "rsa"):
    for t in ("resnet_vit", "vit_vit"):
      low, high = a[f"{p}_ci_low_{t}"], a[f"{p}_ci_high_{t}"]
      assert np.all(low <= high) and np.mean((low <= a[f"{p}_{t}"] + 1e-9) & (a[f"{p}_{t}"] <= high + 1e-9)) > 0.9
  summary = json.loads((one_device / "cka.json").read_text())
  assert summary["bootstrap"]["replicates"] == 16
  assert summary["measures"]["rsa"]["null"]["like_null_method"].startswith("bootstrap")
