"""configs/report.py: sections run into the workdir, one report.html, checked in a
real headless browser (Debian's chromium): every figure loads; a missing one shows."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from vitcnn_jax import jobs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
  if CHROMIUM is None:
    if os.environ.get("CI"):
      pytest.fail("chromium is not installed; `make test` installs Debian's chromium.")
    pytest.skip("chromium is not installed (apt-get install chromium)")
  return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                        capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def report(tmp_path_factory, tiny_vit_bit):
  from configs import report as report_config
  d = tmp_path_factory.mktemp("report")
  vit, bit = tiny_vit_bit
  config = report_config.get_config("demo,only=cka+attention_distance")
  with config.unlocked():
    for sub in config.runs.values():
      sub.data.source, sub.data.num_examples, sub.num_examples, sub.batch_size = "synthetic", 64, 32, 16
      for name, spec in sub.models.items():
        spec.checkpoint = str(vit if name.startswith("vit") else bit)
    config.runs.cka.repeats = 1
  wd = d / "wd"
  jobs.run(config, str(wd))
  return wd


def test_report_page_has_every_section_and_number(report, tiny_vit_bit):
  page = (report / "report.html").read_text()
  assert page.index('id="cka"') < page.index('id="attention_distance"')  # the paper's order
  for fig in ("cka/cka_resnet_resnet.png", "cka/cka_resnet_vit.png", "cka/cka_vit_vit.png",
              "attention_distance/attention_distance.png"):
    assert f'src="{fig}"' in page and (report / fig).exists()
  assert "Figs 1, 2, B.1" in page and "Figs 3, 4, C.5, C.6" in page
  assert "mean CKA resnet_vit" in page and "uniform-attention distance (px)" in page
  assert tiny_vit_bit[0] in page and tiny_vit_bit[1] in page  # the checkpoints used
  assert page.count("<svg class=hover") == 3  # a hover map per CKA matrix
  assert "<title>root/conv / root/conv: 1.000</title>" in page
  assert "<title>block00/ln1 / block00/ln1: 1.000</title>" in page
  # Each of the paper's findings (cka 2, attention distance 1) with this run's verdict and
  # numbers, and under it the verdict of each variant: the CKA findings on the block outputs
  # too, the attention distance under both CLS conventions.
  verdicts = re.findall(r"<tr><td>[^<]+</td><td><span class=(yes|no|na)>([^<]+)</span></td>", page)
  assert len(verdicts) == 3 and all(v[1] != "does not apply" for v in verdicts), verdicts
  assert all(v[1] in ("shown", "not shown") or v[1].startswith("depends on ") for v in verdicts), verdicts
  variants = re.findall(r"<li>([^:<]+): <span class=(?:yes|no)>(shown|not shown)</span>", page)
  assert {k for k, _ in variants} >= {"layers=paper, sample=as drawn", "layers=blocks, sample=as drawn",
                                      "cls=drop, blocks=two lowest and highest",
                                      "cls=renormalize, blocks=two lowest and highest"}, variants
  # Within-model CKA; the demo specs were given other files, so their labels are those files' names.
  assert re.search(r"vit \d\.\d{3}, bit \d\.\d{3}", page)
  assert re.search(r"block 0: \d+\.\d-\d+\.\d px \(uniform \d+\.\d\)", page)  # the heads' range
  assert "NaN or inf in the results" not in page


def test_a_section_whose_results_hold_nan_says_where(report, tmp_path):
  import json
  from configs import report as report_config
  from vitcnn_jax import report as report_lib
  wd = tmp_path / "wd"
  shutil.copytree(report, wd)
  summary = json.loads((wd / "cka" / "cka.json").read_text())
  summary["non_finite"] = {"npz:cka_resnet_vit": 3}  # as `driver.write` flags it
  (wd / "cka" / "cka.json").write_text(json.dumps(summary))
  runs = report_config.get_config("demo,only=cka+attention_distance").runs
  page = open(report_lib.write(str(wd), dict(runs.items()), "t")).read()
  assert re.search(r'NaN or inf in the results</td><td class="no">npz:cka_resnet_vit</td>', page)


def test_report_in_a_headless_browser(report, tmp_path):
  dom = _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom",
                  (report / "report.html").as_uri())
  title = re.search(r"<title>(.*?)</title>", dom.stdout)
  assert title, dom.stderr[-2000:]
  assert title.group(1).endswith("(4 figures, 0 missing)"), title.group(1)

  shot = report / "report_screenshot.png"
  _chromium(tmp_path, "--window-size=1200,2400", f"--screenshot={shot}", (report / "report.html").as_uri())
  import matplotlib.image
  pixels = matplotlib.image.imread(shot)
  assert pixels.shape[:2] == (2400, 1200) and float(np.std(pixels)) > 0.05  # not a blank page

  os.rename(report / "cka" / "cka_vit_vit.png", tmp_path / "moved.png")
  try:
    dom = _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom",
                    (report / "report.html").as_uri())
    assert "(4 figures, 1 missing)" in dom.stdout and "missing: cka_vit_vit.png" in dom.stdout
  finally:
    os.rename(tmp_path / "moved.png", report / "cka" / "cka_vit_vit.png")


def test_the_paper_report_lists_every_missing_input_before_any_work(tmp_path, tiny_vit_bit):
  """`configs/report.py:paper` without its inputs: one flag per missing checkpoint
  and data split, every section's, and nothing run; with them given, nothing is
  missing (the demo report, trained models and Fashion-MNIST, needs none)."""
  from configs import report as report_config
  config = report_config.get_config("paper,only=cka+skip_ablation+layerwise_probe")
  with config.unlocked():
    config.runs.cka.models.vit.checkpoint = str(tmp_path / "no_such.npz")
    for sub in config.runs.values():
      sub.data.data_dir = str(tmp_path / "tfds")  # no dataset prepared there
  with pytest.raises(ValueError, match="The report cannot run") as e:
    jobs.run(config, str(tmp_path / "wd"))
  flags = re.findall(r"^  (--config\.\S+)", str(e.value), re.M)
  assert "--config.runs.cka.models.vit.checkpoint=FILE" in flags
  assert "--config.runs.skip_ablation.models.no_skip05.checkpoint=FILE" in flags
  for section in ("cka", "skip_ablation", "layerwise_probe"):
    assert f"--config.runs.{section}.data.data_dir=DIR" in flags
  assert "no_such.npz: no such file" in str(e.value) and "configs/train.py" in str(e.value)
  assert len(flags) == len(set(flags)) and os.listdir(tmp_path / "wd") == []  # nothing ran
  with config.unlocked():
    for sub in config.runs.values():
      sub.data.source, sub.data.num_examples = "synthetic", 64
      for spec in sub.models.values():
        spec.checkpoint = tiny_vit_bit[0]
  assert jobs.missing_inputs(dict(config.runs)) == []
  assert jobs.missing_inputs(dict(report_config.get_config("demo").runs)) == []


def test_the_real_report_runs_each_configs_real_variant_on_the_real_pair():
  """`configs/report.py:real`: the sections whose configs declare a `:real` variant
  (the analyses that need no training), each on the two packaged networks and the
  photo crops, every input in place (`make real` fetched them)."""
  from configs import common
  from configs import report as report_config
  config = report_config.get_config("real")
  assert config.order == ("cka", "measures", "pc_share", "attention_distance", "head_subsets",
                          "receptive_field", "skip_ratio", "localization", "linear_probe",
                          "layerwise_probe")
  for name, sub in config.runs.items():
    assert sub.data.source == "photos", name
    assert {s.checkpoint for s in sub.models.values()} <= set(common.REAL_MODELS.values()), name
  assert set(config.runs.cka.models) == {"vit", "resnet"}
  assert jobs.missing_inputs(dict(config.runs)) == []
