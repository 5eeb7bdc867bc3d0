"""The many-model job's config: its variants, its checks, and the paper variant's
missing inputs listed before anything runs (the runs themselves: tests/run/test_kept_passes.py)."""

from __future__ import annotations

import os
import re

import pytest

from configs import many_models as many_config
from vitcnn_jax import jobs


def test_the_paper_variant_lists_every_missing_input_before_any_work(tmp_path):
  config = many_config.get_config("paper")
  with config.unlocked():
    config.data.data_dir = str(tmp_path / "tfds")
  with pytest.raises(ValueError, match="The many_models job cannot run: 7 of its inputs") as e:
    jobs.run(config, str(tmp_path / "wd"))
  flags = re.findall(r"^  (--config\.\S+)", str(e.value), re.M)
  assert sorted(flags) == sorted([f"--config.models.{m}.checkpoint=FILE" for m in many_config.PAPER]
                                 + ["--config.data.data_dir=DIR"])
  assert os.listdir(tmp_path / "wd") == []  # nothing ran


@pytest.mark.parametrize("field, value, message", [
    ("models_per_pass", -1, r"config\.models_per_pass=-1 must be >= 1, or 0 for every model at once"),
    ("draws", -1, r"config\.calibration\.draws=-1 must be an integer >= 0"),
    ("alpha", 1.5, r"config\.calibration\.alpha=1\.5 must be strictly between 0 and 1"),
    ("aggregate", "top", r"config\.calibration\.aggregate='top' is not one of \['matched', 'best', 'mean', 'last'\]"),
])
def test_each_field_is_checked_by_name(field, value, message):
  from vitcnn_jax.analyses import many_models
  config = many_config.get_config("demo")
  with config.unlocked():
    if field == "models_per_pass":
      config.models_per_pass = value
    else:
      config.calibration[field] = value
  with pytest.raises(ValueError, match=message):
    many_models.ManyModels(config, dict(config.models))


def test_one_model_is_refused_unless_only_its_pass_is_kept():
  from vitcnn_jax.analyses import many_models
  config = many_config.get_config("demo")
  one = {"vit_demo": config.models.vit_demo}
  with pytest.raises(ValueError, match=r"many_models compares at least two \(or keeps one model's pass with "
                                       r"config\.keep_only=True\)"):
    many_models.ManyModels(config, one)
  with config.unlocked():
    config.keep_only = True
  many_models.ManyModels(config, one)


def test_the_variants():
  demo, prh = many_config.get_config("demo"), many_config.get_config("prh")
  assert len(demo.models) == 10 and sum(k.endswith("_init") for k in demo.models) == 4
  assert (demo.num_examples, demo.batch_size, demo.repeats) == (512, 256, 1)
  assert (prh.num_examples, prh.batch_size, prh.measures, prh.knn_k) == (1024, 1024, ("mutual_knn",), 10)
  assert prh.calibration.aggregate == "last" and all(m.capture == ("pre_logits",) for m in prh.models.values())
  with pytest.raises(ValueError, match="Unknown variant 'b16'; expected demo, paper or prh"):
    many_config.get_config("b16")
