"""Kept passes (`run/kept.py`, `keeping.py`, `combining.py`): three models of
different families kept one by one and combined give the fused run's numbers;
every mismatch and every damaged pass is refused by name; a stopped pass resumes."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil


import numpy as np
import pytest

from conftest import ROOT, run_main
from support import upstream_files as uf
from support.numerics import BIT_ROUNDINGS, MIXER_ROUNDINGS, VIT_ROUNDINGS, assert_close, cka_bound, network
from vitcnn_jax.analyses import cka
from vitcnn_jax.inputs import data
from vitcnn_jax.run import combining
from vitcnn_jax.run import kept
from vitcnn_jax.run import keeping
from vitcnn_jax.run import loading
from vitcnn_jax.run import pipeline
from vitcnn_jax.similarity import comparison
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import neighbours

EXAMPLES, BATCH, REPEATS = 20, 8, 2  # two full minibatches and one of 4, twice
FLAGS = ("--config.models.vit.capture=('blocks',)", "--config.models.resnet.capture=('blocks',)",
         "--config.models.mixer.capture=('blocks',)", "--config.knn_k=3", "--config.null=True",
         "--config.plot.format=none", "--config.data.source=synthetic", "--config.data.num_examples=24",
         "--config.models.resnet.overrides.resolution=32")
EVERY = (f"--config.measures={measures.NAMES!r}".replace(" ", ""), "--config.bootstrap=8")
BIASED = ("--config.measures=('linear_cka','rbf_cka','distance_correlation')", "--config.estimator=biased")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
  d = tmp_path_factory.mktemp("three")
  return dict(vit=uf.save(d / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8)),
              resnet=uf.save(d / "bit.npz", uf.bt_bit(0, depth=(1, 1))),
              mixer=uf.save(d / "mixer.npz", uf.mixer(3)))


def _args(files: dict[str, str], workdir, *extra: str) -> list[str]:
  return [f"--config={ROOT}/configs/cka_vit_resnet.py:demo_mixer,examples={EXAMPLES},batch={BATCH},"
          f"repeats={REPEATS}", f"--workdir={workdir}",
          *[f"--config.models.{k}.checkpoint={v}" for k, v in files.items()], *FLAGS, *extra]


def _config(args: list[str]):
  """The config main.py runs for `args` (its flags applied)."""
  from absl import flags

  import main
  main.parse(["main.py", *args])
  return flags.FLAGS.config


def _kept_run(files, root, extra: tuple[str, ...]):
  """The fused run's config, its models' passes kept under `root` and combined."""
  config = _config(_args(files, root, *extra))
  models = loading.load_models(config)
  source = pipeline.make_source(config.data)
  how = keeping.Protocol(config.num_examples, config.batch_size, config.repeats, config.seed, "auto")
  passes = keeping.passes_of(list(models.values()), source, how, str(root / "passes"))
  opened = [kept.open_pass(p.folder) for p in passes]
  spec = measures.spec_of(config)
  got = combining.combine([p for p, _ in opened], [d for _, d in opened], spec, config.seed,
                          config.get("bootstrap", 0))
  analysis = cka.CKA(config, models)
  analysis.replicates = [got.pooled]
  return analysis.finalize([got.sums])


@pytest.mark.parametrize("extra", [EVERY, BIASED], ids=["every measure", "biased"])
def test_kept_passes_combine_to_the_fused_run(files, tmp_path, extra):
  """Every array of every measure, its null and its bootstrap intervals, kept
  and combined as the fused run (8 devices) makes them. Bound: as for two runs
  of one job (`test_cka_job`'s 8 devices against 1): the models compiled apart
  move each Gram by their networks' rounding, which moves a CKA-type measure
  within twice its own bound plus 4x that; a neighbour set changes only at a
  near-tie (one neighbour's share per cell); distances move in their units.
  (On one device, this machine gives the same bits.)"""
  run_main(*_args(files, tmp_path / "fused", *extra))
  fused = np.load(tmp_path / "fused" / "cka.npz")
  arrays, _ = _kept_run(files, tmp_path, extra)
  assert sorted(arrays) == sorted(fused.files)
  bound = 2 * cka_bound(BATCH, 16 * 16 * 32) + 4 * network(VIT_ROUNDINGS + BIT_ROUNDINGS + MIXER_ROUNDINGS)
  for m in [n for n in measures.NAMES if n in extra[0]]:
    p = comparison.prefix(m)
    slack = ({"mutual_knn": 1 / (3 * EXAMPLES), "cknna": 1 / (3 * EXAMPLES)}.get(m, 0.0)
             + (1 / EXAMPLES if m in neighbours.NAMES else 0.0))
    keys = [k for k in fused.files if k == "per_repeat" and p == "cka" or k.startswith(f"{p}_")
            or k.startswith(f"null_{p}_") or p == "cka" and k.startswith("std_")]
    keys = [k for k in keys if fused[k].dtype.kind == "f"]
    assert keys, m
    units = max(1.0, np.abs(fused[keys[0]]).max()) if m in ("rsm_difference", "magnitude_difference") else 1.0
    for k in keys:
      assert_close(arrays[k], fused[k], bound * units + slack, f"{m}: {k}, kept vs fused")
  for k in fused.files:
    if fused[k].dtype.kind in "US":
      assert np.array_equal(arrays[k], fused[k]), k


class _Counting:
  """A source that counts the images it gives and can fail after `fail_after`
  (a pass killed midway), or give other pixels under the same identity (`shift`)."""

  def __init__(self, inner, fail_after: int | None = None, shift: int = 0):
    self.inner, self.fail_after, self.shift, self.given = inner, fail_after, shift, 0
    self.name, self.identity, self.num_classes = inner.name, inner.identity, inner.num_classes

  def __len__(self) -> int:
    return len(self.inner)

  def images(self, indices):
    if self.fail_after is not None and self.given >= self.fail_after:
      raise KeyboardInterrupt("killed")
    self.given += len(indices)
    return [np.clip(img.astype(int) + self.shift, 0, 255).astype(np.uint8) for img in self.inner.images(indices)]

  def labels(self, indices):
    return self.inner.labels(indices)


@pytest.fixture(scope="module")
def vit_kept(files, tmp_path_factory):
  """The tiny ViT, its source and protocol, and its finished kept pass."""
  root = tmp_path_factory.mktemp("kept")
  config = _config(_args(files, root))
  model = loading.load_model(config, "vit")
  source = pipeline.make_source(config.data)
  how = keeping.Protocol(EXAMPLES, BATCH, 1, 0, "auto")
  return model, source, how, keeping.keep(model, source, how, str(root / "vit"))


def _combine(*passes: kept.Pass):
  opened = [kept.open_pass(p.folder) for p in passes]
  return combining.combine([p for p, _ in opened], [d for _, d in opened], measures.Spec(), 0).sums


def test_each_mismatch_is_refused_by_name(vit_kept, tmp_path):
  model, source, how, base = vit_kept
  other = lambda name, src=source, **kw: keeping.keep(model, src, dataclasses.replace(how, **kw), str(tmp_path / name))
  cases = [
      (other("batch", batch_size=4), r"protocol\.batch_size \(another protocol\)"),
      (other("examples", src=data.SyntheticSource(30, 32, 0)),
       r"sample\.repeats\[0\]\.examples \(other examples\); sample\.source \(other examples\)\."),
  ]
  for bad, message in cases:
    with pytest.raises(kept.KeptError, match=message):
      _combine(base, bad)
  every = data.SyntheticSource(EXAMPLES, 32, 0)  # every example of it, by two seeds: another order
  with pytest.raises(kept.KeptError, match=r"protocol\.seed \(another protocol\); sample\.repeats\[0\]\.order "
                                           r"\(the examples in another order\)\."):
    _combine(other("order0", src=every), other("order1", src=every, seed=1))
  shifted = other("pixels", src=_Counting(source, shift=1))  # the same identity, other pixels
  with pytest.raises(kept.KeptError, match=r"minibatch 0 of repeat 0: .*other source pixels for the same examples"):
    _combine(base, shifted)
  with pytest.raises(kept.KeptError, match=r"holds a kept pass of another run: its model\.policy"):
    keeping.keep(dataclasses.replace(model, policy="imagenet"), source, how, base.folder)


def test_a_damaged_or_foreign_pass_is_refused(vit_kept, tmp_path):
  model, source, how, base = vit_kept
  copy = tmp_path / "copy"
  shutil.copytree(base.folder, copy)
  victim = copy / kept.minibatch_file(0, 1)
  victim.write_bytes(victim.read_bytes()[:100])  # truncated
  with pytest.raises(kept.KeptError, match=rf"{victim}: its bytes differ from those recorded"):
    _combine(base, kept.Pass(str(copy), base.manifest))
  manifest = json.loads((copy / kept.MANIFEST).read_text())
  manifest["version"] = kept.VERSION + 1
  (copy / kept.MANIFEST).write_text(json.dumps(manifest))
  with pytest.raises(kept.KeptError, match=rf"version {kept.VERSION + 1}, where this version of vitcnn_jax "
                                           rf"reads 'vitcnn_jax kept pass' version {kept.VERSION}"):
    kept.open_pass(str(copy))


def test_a_finished_pass_is_reused_only_for_its_model_and_run(files, vit_kept, tmp_path, monkeypatch):
  """`keeping.reuse` gives the model as its finished pass recorded it (what a
  comparison reads, no parameters) for the same request, checkpoint bytes,
  sample and protocol, and nothing for any other."""
  from vitcnn_jax.models.formats import arrays
  model, source, how, base = vit_kept
  spec = _config(_args(files, tmp_path)).models.vit
  got = keeping.reuse("vit", spec, source, how, base.folder)
  assert got.params is None and got.model is None
  for field in ("path", "label", "names", "policy", "setup", "capture", "outline", "request"):
    assert getattr(got, field) == getattr(model, field), field
  assert keeping.reuse("vit", spec, source, dataclasses.replace(how, seed=1), base.folder) is None
  assert keeping.reuse("vit", spec, data.SyntheticSource(30, 32, 0), how, base.folder) is None
  other = spec.copy_and_resolve_references()
  other.policy = "imagenet"
  assert keeping.reuse("vit", other, source, how, base.folder) is None
  copy = tmp_path / "vit_copy.npz"
  shutil.copyfile(files["vit"], copy)
  mine = spec.copy_and_resolve_references()
  mine.checkpoint = str(copy)
  config = _config(_args({**files, "vit": str(copy)}, tmp_path))
  keeping.keep(loading.load_model(config, "vit"), source, how, str(tmp_path / "copy"))
  assert keeping.reuse("vit", mine, source, how, str(tmp_path / "copy")) is not None
  monkeypatch.setattr(arrays, "_DIGESTS", {})  # as a later process, which has read nothing yet
  with monkeypatch.context() as m:  # files of the recorded sizes and times are not read again
    m.setattr(arrays, "digest", lambda path: pytest.fail(f"{path} read again"))
    assert keeping.reuse("vit", mine, source, how, str(tmp_path / "copy")) is not None
  flipped = bytearray(copy.read_bytes())
  flipped[-1] ^= 1
  copy.write_bytes(bytes(flipped))  # the same path and size, other bytes (and a later time)
  monkeypatch.setattr(arrays, "_DIGESTS", {})  # each check below as a later process
  assert keeping.reuse("vit", mine, source, how, str(tmp_path / "copy")) is None
  copy.write_bytes(open(files["vit"], "rb").read())
  monkeypatch.setattr(arrays, "_DIGESTS", {})
  assert keeping.reuse("vit", mine, source, how, str(tmp_path / "copy")) is not None  # touched only
  copy.write_bytes(open(files["mixer"], "rb").read())  # the same path, other bytes
  monkeypatch.setattr(arrays, "_DIGESTS", {})
  assert keeping.reuse("vit", mine, source, how, str(tmp_path / "copy")) is None


def test_a_pass_killed_midway_resumes_and_is_never_read_half(vit_kept, tmp_path):
  """Nine minibatches over the 8 devices: two steps; killed while the second loads."""
  model, _, _, _ = vit_kept
  source, how = data.SyntheticSource(80, 32, 0), keeping.Protocol(9 * BATCH, BATCH, 1, 0, "auto")
  folder = str(tmp_path / "killed")
  with pytest.raises(KeyboardInterrupt):
    keeping.keep(model, _Counting(source, fail_after=8 * BATCH), how, folder)
  with pytest.raises(kept.KeptError, match=r"the kept pass of 'vit' is unfinished \(8 of 9 minibatches written\); "
                                           "run it again to resume it"):
    kept.open_pass(folder)
  first = os.path.join(folder, kept.minibatch_file(0, 0))
  written = os.stat(first).st_mtime_ns
  again = _Counting(source)
  resumed = keeping.keep(model, again, how, folder)
  assert again.given == BATCH and os.stat(first).st_mtime_ns == written  # the last minibatch only
  clean = keeping.keep(model, source, how, str(tmp_path / "clean"))
  for b in range(9):
    got, want = (np.load(p.path(0, b)) for p in (resumed, clean))
    for k in want.files:
      np.testing.assert_array_equal(got[k], want[k], err_msg=f"minibatch {b}: {k}")


def test_a_minibatch_with_a_layer_out_of_range_is_kept_prescaled(vit_kept, tmp_path, monkeypatch):
  """With `grams.GRAM_RANGE` narrowed so that every layer made as its features
  are is out of it, each step is run again with its layers prescaled: no
  exponent kept is `UNFIT`, and every array kept, at its own exponent, is the
  in-range pass's to the bit (every scaling a power of two)."""
  from vitcnn_jax.similarity import grams
  model, source, how, base = vit_kept
  monkeypatch.setattr(grams, "GRAM_RANGE", (2.0 ** 60, 2.0 ** 60))
  made = []
  step = keeping._step.__wrapped__
  monkeypatch.setattr(keeping, "_step", lambda *a: made.append(a[-1]) or step(*a))
  out = keeping.keep(model, source, how, str(tmp_path / "prescaled"))
  assert made.count(True) == made.count(False) >= 1, made
  powers = {"gram": 2, "proj": 2, "rowmean": 1, "mean_sq": 2, "mean_4th": 4, "features": 0}
  for b in range(out.minibatches(0)):
    got, want = (np.load(p.path(0, b)) for p in (out, base))
    assert not grams.needs_prescaling(got["e"]) and not np.array_equal(got["e"], want["e"])
    for k, c in powers.items():
      unscaled = [np.ldexp(v[k].astype(np.float64), c * v["e"].reshape((-1,) + (1,) * (v[k].ndim - 1)))
                  for v in (got, want)]
      np.testing.assert_array_equal(*unscaled, err_msg=f"minibatch {b}: {k}")


def _many_config(files: dict[str, str], names: tuple[str, ...]):
  """configs/many_models.py:demo on the tiny models `names` and synthetic images."""
  import ml_collections

  from configs import common
  from configs import many_models
  config = many_models.get_config(f"demo,examples={EXAMPLES},batch={BATCH},draws=19")
  config.models = ml_collections.ConfigDict({k: common.model(files[k], "blocks", k) for k in names})
  if "resnet" in names:
    config.models.resnet.overrides.resolution = 32
  config.data = ml_collections.ConfigDict({**config.data.to_dict(), "source": "synthetic", "num_examples": 24})
  config.measures, config.knn_k, config.plot.format = ("linear_cka", "mutual_knn"), 3, "png"
  return config


def test_a_model_added_costs_its_own_pass_and_its_pairs(files, tmp_path, monkeypatch):
  """Two models, then a third in the same workdir: only the third is loaded and
  only its pass and its two pairs run; the matrices then hold every pair, the
  first pair as it was, and the first two models as their manifests recorded
  them; a model whose config now asks for other layers is loaded and refused."""
  from vitcnn_jax import jobs
  calls, loaded = [], []
  combine, load = combining.combine, loading.load_model
  monkeypatch.setattr(combining, "combine", lambda passes, *a, **k: (calls.append(tuple(p.name for p in passes)),
                                                                     combine(passes, *a, **k))[1])
  monkeypatch.setattr(loading, "load_model", lambda config, name, *a: (loaded.append(name),
                                                                       load(config, name, *a))[1])
  first = jobs.run(_many_config(files, ("vit", "resnet")), str(tmp_path))
  assert first.arrays["cka_scores"].shape == (2, 2) and sorted(loaded) == ["resnet", "vit"]
  kept_files = sorted((tmp_path / "passes").rglob("*.npz"))
  stamps = [f.stat().st_mtime_ns for f in kept_files]
  calls.clear()
  loaded.clear()
  config = _many_config(files, ("vit", "resnet", "mixer"))
  config.models_per_pass = 1  # one model's parameters at a time
  second = jobs.run(config, str(tmp_path))
  assert loaded == ["mixer"], loaded  # the others' finished passes say what the comparison reads of them
  assert sorted(calls) == [("mixer", "resnet"), ("mixer", "vit")], calls  # resnet x vit read back
  assert [f.stat().st_mtime_ns for f in kept_files] == stamps  # the old passes untouched
  for name in ("vit", "resnet"):
    assert second.summary["models"][name] == first.summary["models"][name]
    assert second.summary["models loaded"][name] == first.summary["models loaded"][name]
  assert {k: v["kind"] for k, v in second.summary["models"].items()} == {"vit": "ViT", "resnet": "CNN",
                                                                         "mixer": "other"}
  names = list(second.summary["models"])
  i, j = names.index("resnet"), names.index("vit")
  assert second.arrays["cka_scores"][i, j] == first.arrays["cka_scores"][0, 1] or \
      second.arrays["cka_scores"][i, j] == first.arrays["cka_scores"][1, 0]
  for m in ("cka", "mutual_knn"):
    cal, p = second.arrays[f"{m}_calibrated"], second.arrays[f"{m}_p_values"]
    assert cal.shape == (3, 3) and np.all((cal >= 0) & (cal <= 1)) and np.all(np.diag(cal) == 1)
    assert np.all(p[~np.eye(3, dtype=bool)] >= 1 / 20), p  # 19 draws: p >= 1 / 20
  assert (tmp_path / "models_cka.png").exists() and (tmp_path / "many_models.json").exists()
  config.models.vit.capture = ("all",)
  with pytest.raises(kept.KeptError, match=r"passes/vit holds a kept pass of another run: its model\.capture"):
    jobs.run(config, str(tmp_path))


CONFIG_FILE = '''"""The many-model demo config on the tiny models {files}: `:NAME+NAME...`."""
import ml_collections

from configs import common
from configs import many_models


def get_config(arg):
  config = many_models.get_config("demo,examples={examples},batch={batch},draws=9")
  config.models = ml_collections.ConfigDict(
      {{k: common.model(v, "blocks", k) for k, v in {files}.items() if k in arg.split("+")}})
  if "resnet" in config.models:
    config.models.resnet.overrides.resolution = 32
  config.data = ml_collections.ConfigDict({{**config.data.to_dict(), "source": "synthetic",
                                           "num_examples": {examples}}})
  config.measures, config.knn_k = ("linear_cka", "mutual_knn"), 3
  return config
'''


def test_passes_kept_by_separate_jobs_combine_as_one_process(files, tmp_path):
  """As two jobs of a cluster would: one job keeps a model's pass
  (`config.keep_only`); a job of two processes (4 CPU devices each, gloo over
  loopback) keeps the other two models' passes, each process loading and writing
  its own devices' minibatches, reads the first back without loading its model,
  and compares the three, the processes sharing the pairs: it gives what one
  process gives alone."""
  import socket

  from support import forked

  from conftest import device_env
  cfg = tmp_path / "three.py"
  # Nine minibatches: each process's devices hold some (4 and 4, then 1 on process 0's).
  cfg.write_text(CONFIG_FILE.format(files=files, examples=9 * BATCH, batch=BATCH))
  shared = tmp_path / "kept"
  run_main(f"--config={cfg}:mixer", f"--workdir={tmp_path / 'mixer'}", "--config.keep_only=True",
           f"--config.kept_dir={shared}")
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
  jobs = [forked.start(["main.py", f"--config={cfg}:vit+resnet+mixer", f"--workdir={tmp_path / 'compare'}",
                        f"--config.kept_dir={shared}", "--distributed", f"--coordinator=127.0.0.1:{port}",
                        "--num_processes=2", f"--process_id={i}", "--cpu_collectives=gloo"], device_env(4), ROOT)
          for i in range(2)]
  done = [p.wait(timeout=300) for p in jobs]
  assert all(r.returncode == 0 for r in done), "\n".join(r.stderr[-2500:] for r in done)
  assert "Reusing the finished kept passes of ['mixer']" in done[0].stdout and "Keeping vit's pass" in done[0].stdout
  assert len(list((tmp_path / "compare" / "pairs").iterdir())) == 3
  run_main(f"--config={cfg}:vit+resnet+mixer", f"--workdir={tmp_path / 'alone'}")
  a, b = np.load(tmp_path / "alone" / "many_models.npz"), np.load(tmp_path / "compare" / "many_models.npz")
  assert sorted(a.files) == sorted(b.files)
  bound = 2 * cka_bound(BATCH, 16 * 16 * 32) + 4 * network(VIT_ROUNDINGS + BIT_ROUNDINGS + MIXER_ROUNDINGS)
  for k in a.files:
    if a[k].dtype.kind == "f":  # k-NN counts move by one neighbour's share at a near-tie
      assert_close(b[k], a[k], bound + (2 / (9 * BATCH) if "knn" in k else 0.0), f"{k}: separate jobs vs one")
