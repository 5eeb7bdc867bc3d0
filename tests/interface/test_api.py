"""The notebook API: a line per analysis, the same results as main.py's configs."""

from __future__ import annotations

import json
import os

import matplotlib.figure
import numpy as np
import pytest

from conftest import NO_FIGURES, ROOT, run_main
from support import upstream_files as uf
from support.idx_files import write_idx
from support.numerics import assert_close, job_runs_bound
import vitcnn_jax as vj
from vitcnn_jax import api as vj_api, checkpoints
from vitcnn_jax.inputs import folders
from vitcnn_jax.models.formats import in_memory
from vitcnn_jax.models.formats.base import CheckpointError

N, BATCH = 48, 16
RUNS_BOUND = job_runs_bound(BATCH)  # the job compiled twice


def test_the_package_shows_its_api_alone():
  """A notebook's completion lists the analyses, `Result` and `zoo` (each a working
  name), not the modules the package imports for itself nor names of old layouts."""
  from vitcnn_jax.run import declaration
  assert vj.__all__ == sorted([*declaration.names(), "Result", "zoo"]) == dir(vj)
  assert all(callable(getattr(vj, name)) for name in declaration.names())
  assert vj.Result.__name__ == "Result" and "ZOO" in dir(vj.zoo)
  for gone in ("hsic", "os", "importlib", "annotations"):
    assert gone not in dir(vj)
  assert not hasattr(vj, "hsic")  # moved to vitcnn_jax.similarity in a 0.x release: no alias


@pytest.fixture(scope="module")
def images():
  rng = np.random.default_rng(0)
  base = rng.integers(0, 256, (N, 4, 4)).astype(np.uint8)
  grey = np.kron(base, np.ones((1, 8, 8), np.uint8))  # structure the layers can tell apart
  return np.clip(grey + rng.integers(0, 30, grey.shape), 0, 255).astype(np.uint8), rng.integers(0, 10, N)


def test_cka_is_the_config_job(tiny_vit_bit, images, tmp_path):
  vit, bit = tiny_vit_bit
  grey, labels = images
  write_idx(tmp_path / "idx", "t10k", grey, labels)
  wd = tmp_path / "job"
  run_main(f"--config={ROOT}/configs/cka_vit_resnet.py:examples={N},batch={BATCH},repeats=1",
           f"--workdir={wd}", f"--config.models.vit.checkpoint={vit}",
           f"--config.models.resnet.checkpoint={bit}", "--config.models.resnet.overrides.resolution=32",
           "--config.data.source=idx", f"--config.data.path={tmp_path / 'idx'}",
           "--config.data.split=t10k", "--config.plot.format=none")
  job = np.load(wd / "cka.npz")

  r = vj.cka({"vit": vit, "resnet": {"checkpoint": bit, "resolution": 32}}, grey, batch_size=BATCH,
             repeats=1, workdir=str(tmp_path / "api"), **NO_FIGURES)

  for key in ("cka_resnet_resnet", "cka_resnet_vit", "cka_vit_vit"):
    assert_close(r[key], job[key], RUNS_BOUND, key)  # same models, examples and sample
  assert r.names == {"vit": list(job["names_vit"]), "resnet": list(job["names_resnet"])}
  assert r.summary["num_examples"] == json.loads((wd / "cka.json").read_text())["num_examples"]


def test_a_finished_workdir_is_reused_and_says_so(tiny_vit_bit, images, tmp_path, capsys):
  vit, _ = tiny_vit_bit
  first = vj.cka({"v": vit}, images[0][:16], layers="blocks", batch_size=8, repeats=1,
                 workdir=str(tmp_path))
  assert "holds a finished" not in capsys.readouterr().out
  again = vj.cka({"v": vit}, images[0][:16], layers="blocks", batch_size=8, repeats=1,
                 workdir=str(tmp_path))
  out = capsys.readouterr().out
  assert "holds a finished cka run of this config" in out and "delete cka_state.npz" in out
  np.testing.assert_array_equal(first["cka_v_v"], again["cka_v_v"])


def test_in_memory_model_and_labels(tiny_vit_bit, images):
  vit, _ = tiny_vit_bit
  grey, _ = images
  model, params = checkpoints.load_model(vit)
  from_file = vj.cka({"ViT-B/8": vit}, grey, layers="blocks", batch_size=BATCH, repeats=1)
  handed = vj.cka({"ViT-B/8": (model, params)}, grey, layers="blocks", batch_size=BATCH, repeats=1)
  np.testing.assert_array_equal(from_file["cka_vit_b_8_vit_b_8"], handed["cka_vit_b_8_vit_b_8"])
  assert handed.names["vit_b_8"] == ["block00/out", "block01/out"]
  assert handed.summary["models"]["vit_b_8"]["checkpoint"].startswith(in_memory.IN_MEMORY)
  assert handed.summary["models"]["vit_b_8"]["label"] == "ViT-B/8"
  with pytest.raises(CheckpointError, match="no model was handed over in memory"):  # not kept after the call
    checkpoints.load_model(handed.summary["models"]["vit_b_8"]["checkpoint"])


def test_plot_returns_the_figures_it_writes(tiny_vit_bit, images, tmp_path):
  vit, bit = tiny_vit_bit
  r = vj.cka({"ViT": vit, "BiT": {"checkpoint": bit, "resolution": 32}}, images[0][:32],
             batch_size=BATCH, repeats=1, workdir=str(tmp_path), **NO_FIGURES)
  assert not list(tmp_path.glob("*.png"))  # results only, until asked
  figs = r.plot(format="pdf", vmin=0.2)
  assert len(figs) == 3 and all(isinstance(f, matplotlib.figure.Figure) for f in figs)
  assert {f.axes[0].get_title().split("\n")[0] for f in figs} == {
      "CKA within ViT", "CKA within BiT", "CKA: BiT vs ViT"}
  assert figs[0].axes[0].images[0].get_clim() == (0.2, 1.0)
  for suffix in ("pdf", "png"):
    assert sorted(p.name for p in tmp_path.glob(f"cka_*.{suffix}")) == [
        f"cka_bit_bit.{suffix}", f"cka_bit_vit.{suffix}", f"cka_vit_vit.{suffix}"]
  assert "cka_bit_vit[" in repr(r)


def test_attention_distance_and_skip_ratio(tiny_vit_bit, images):
  vit, bit = tiny_vit_bit
  grey = images[0][:16]
  r = vj.attention_distance({"vit": {"checkpoint": vit, "label": "tiny ViT"}}, grey, batch_size=8,
                            **NO_FIGURES)
  assert r["mean_distance"].shape == (2, 3)  # blocks x heads
  assert np.all((r["mean_distance"] > 0) & (r["mean_distance"] < 32 * np.sqrt(2)))
  assert r.summary["label"] == "tiny ViT"
  np.testing.assert_array_equal(vj.attention_distance(vit, grey, batch_size=8, **NO_FIGURES)["mean_distance"],
                                r["mean_distance"])  # one model alone: the name it reads
  # One model's own dict, alone, is that model (not two models named by its keys).
  alone = vj.attention_distance({"checkpoint": vit, "label": "tiny ViT"}, grey, batch_size=8, **NO_FIGURES)
  np.testing.assert_array_equal(alone["mean_distance"], r["mean_distance"])
  assert alone.summary["label"] == "tiny ViT"
  r = vj.skip_ratio({"vit": vit, "resnet": {"checkpoint": bit, "resolution": 32}}, grey, batch_size=8,
                    **NO_FIGURES)
  assert r["vit_ratio"].shape[:2] == (2, 2) and np.isfinite(r["resnet_ratio"]).all()


def test_mistakes_are_named(tiny_vit_bit, images, tmp_path):
  vit, _ = tiny_vit_bit
  grey = images[0]
  from PIL import Image
  (tmp_path / "photos").mkdir()
  Image.fromarray(np.zeros((3, 3, 3), np.uint8)).save(tmp_path / "photos" / "tiny.png")
  with pytest.raises(ValueError, match=r"tiny\.png: a photograph of 3x3 px"):
    vj.cka({"v": vit}, folders.PhotoCrops(str(tmp_path / "photos"), 8, size=32), batch_size=4)
  with pytest.raises(TypeError, match="float32.*uint8"):
    vj.cka({"v": vit}, grey.astype(np.float32))
  with pytest.raises(ValueError, match=r"block\*/nope"):
    vj.cka({"v": vit}, grey, layers=["block*/nope"])
  with pytest.raises(ValueError, match="same name twice"):
    vj.cka({"a b": vit, "a-b": vit}, grey)
  with pytest.raises(FileNotFoundError, match="missing.npz"):
    vj.cka({"v": str(tmp_path / "missing.npz")}, grey)
  with pytest.raises(TypeError, match="a list"):
    vj.cka({"v": [vit]}, grey)


def test_the_other_analyses_run_from_one_line(tiny_vit_bit, images):
  vit, bit = tiny_vit_bit
  grey, labels = images
  vit2 = uf.save(os.path.join(os.path.dirname(vit), "vit2.npz"),
                 uf.vt_vit(1, width=48, depth=2, heads=3, mlp=96, patch=8))
  bit32 = {"checkpoint": bit, "resolution": 32}

  r = vj.receptive_field({"ViT": vit, "BiT": bit32}, grey[:8], batch_size=4, **NO_FIGURES)
  assert r["vit_maps"].shape == (4, 32, 32) and r["bit_maps"].shape == (3, 32, 32)
  assert r["bit_grid"][-1].tolist() == [4, 4]  # the second stage at 32 px: 4x4

  r = vj.localization(vit, grey, layer="block01/out", batch_size=BATCH, **NO_FIGURES)
  assert r["cka"].shape == (16, 16)  # tokens x patches of the 4x4 grid
  assert vj.localization({"ViT": vit}, grey, batch_size=BATCH, **NO_FIGURES).summary["layer"] == "block01/out"

  r = vj.head_subsets({"vit": vit, "resnet": {**bit32, "capture": ["block1/unit01/out"]}}, grey,
                      subset_size=1, batch_size=BATCH, **NO_FIGURES)
  assert r["cka"].shape == (3, 1) and np.all(np.diff(r["subset_distance"]) >= 0)

  r = vj.reference_cka({"A": vit, "B": vit2}, grey, reference="A", layers="blocks",
                       labels=labels % 7, accuracy=True, batch_size=BATCH, repeats=1, **NO_FIGURES)
  np.testing.assert_allclose(r["same_layer_a"], 1.0, atol=1e-6)  # the reference with itself
  assert r.summary["accuracy_examples"] == N and set(r.summary["accuracy"]) == {"a", "b"}

  r = vj.linear_probe({"ViT": vit}, grey[:32], labels=labels[:32], test=(grey[32:], labels[32:]),
                      features=("cls", "mean"), shots=0, seeds=1, batch_size=BATCH, **NO_FIGURES)
  acc = r.summary["models"]["vit"]
  assert set(acc) == {"cls", "mean"} and len(acc["cls"]["accuracy"]) == 2
  assert all(0 <= a <= 1 for a in acc["mean"]["accuracy"])


def test_measures_from_one_line(tiny_vit_bit, images):
  """vj.cka(..., measures=...) returns one array set per measure, nulls and intervals."""
  vit, _ = tiny_vit_bit
  r = vj.cka({"ViT": vit}, images[0][:32], layers="blocks", batch_size=16, repeats=1,
             measures=("linear_cka", "rsa"), null=True, bootstrap=8, **NO_FIGURES)
  for key in ("cka_vit_vit", "rsa_vit_vit", "null_rsa_vit_vit", "rsa_ci_low_vit_vit", "cka_like_null_vit_vit"):
    assert r[key].shape == (2, 2), key
  assert r.summary["bootstrap"]["replicates"] == 8 and set(r.summary["measures"]) == {"linear_cka", "rsa"}
  with pytest.raises(ValueError, match=r"^measures=\['cka'\]") as e:
    vj.cka({"ViT": vit}, images[0][:32], measures=("cka",))
  assert "config." not in str(e.value)  # the keyword, not main.py's flag


def test_notices_and_errors_speak_the_notebook_s_words(tiny_vit_bit, images, caplog, capsys):
  """Under the notebook API a notice names the model's dict and its key, an error
  the keyword argument, a printed line too: never main.py's flags."""
  vit, _ = tiny_vit_bit
  with caplog.at_level("WARNING", logger="vitcnn_jax"):
    r = vj.cka({"My ViT": vit}, images[0][:16], layers="blocks", batch_size=8, repeats=1, **NO_FIGURES)
  assert r.summary["data"] == {"data": {"source": "array(16, 32x32)", "labels": "classes"}}  # what a label is
  notice = [m for m in caplog.messages if "preprocessing" in m]
  assert notice and "set models['My ViT']['policy']=... if it was trained otherwise" in notice[0], notice
  assert not [m for m in caplog.messages if "--config" in m or "config.models" in m], caplog.messages
  with pytest.raises(ValueError, match=r"num_examples=64, but the data .* has 16") as e:
    vj.cka({"My ViT": vit}, images[0][:16], num_examples=64)
  assert "config." not in str(e.value)
  capsys.readouterr()
  with vj_api.in_notebook_words({"vit": "ViT"}):
    print("config.subspace_dims sets how many;", end=" ")
    print("set --config.models.vit.policy=X")
  assert capsys.readouterr().out == "subspace_dims sets how many; set models['ViT']['policy']=X\n"


def test_a_second_call_traces_and_compiles_nothing(tiny_vit_bit, images, caplog):
  """A notebook's next call with the same models, layers and measures runs the step
  the first call compiled (`programs.Step`; kept for later processes as
  `kept_step`, `run/exported`): its step is neither traced nor compiled again,
  nor read from the persistent cache. Another measure is another program."""
  import jax
  vit, bit = tiny_vit_bit
  grey = images[0][:16]
  models = {"vit": vit, "resnet": {"checkpoint": bit, "resolution": 32}}
  kw = dict(layers="blocks", batch_size=8, repeats=1, **NO_FIGURES)

  def step_events(**more) -> tuple[list[str], object]:
    caplog.clear()
    with jax.log_compiles(), caplog.at_level("DEBUG"):
      r = vj.cka(models, grey, **kw, **more)
    return [m for m in caplog.messages if any(s in m for s in (
        "jit(local)", "local for pjit", "'jit_local'", "jit(kept_step)", "kept_step for pjit"))], r

  first, r1 = step_events()
  assert any(f"Finished XLA compilation of jit({name})" in m for m in first for name in ("local", "kept_step")
             ), first
  again, r2 = step_events()
  assert again == [], again
  np.testing.assert_array_equal(r1["cka_resnet_vit"], r2["cka_resnet_vit"])
  other, _ = step_events(measures=("linear_cka", "rbf_cka"))
  assert other, "another measure ran the first call's program"


def test_a_group_of_fields_given_in_part_keeps_the_rest_and_refuses_a_stranger():
  from vitcnn_jax import analyses
  declared = analyses.get("many_models")
  config = vj_api.config_of(declared, {"a": "a.npz", "b": "b.npz"}, 100, calibration={"draws": 7})
  assert dict(config.calibration) == {**declared.defaults["calibration"], "draws": 7}
  with pytest.raises(TypeError, match=r"many_models\(\) got calibration with \['drows'\]; its fields are "
                                      r"\['aggregate', 'alpha', 'draws'\]"):
    vj_api.config_of(declared, {"a": "a.npz", "b": "b.npz"}, 100, calibration={"drows": 7})
