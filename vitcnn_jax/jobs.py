"""Every job, one path for `main.py`, the notebook API and the report.

`run(config, workdir)` checks and locks the workdir and runs the job named by
`config.analysis`: an analysis (`vitcnn_jax/analyses/`), `train`, `inspect` or
`report`. An analysis goes: config checks (no model, no data) -> the data
sources and their checks -> demo models resolved to files (trained once if the
cache lacks them) -> models loaded -> the analysis built -> the driver. Nothing
after the first step trains.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import jax
import ml_collections
import numpy as np

from vitcnn_jax import analyses
from vitcnn_jax import demos
from vitcnn_jax import describe
from vitcnn_jax import report
from vitcnn_jax import train
from vitcnn_jax.inputs import data
from vitcnn_jax.plotting import style
from vitcnn_jax.run import control
from vitcnn_jax.run import declaration
from vitcnn_jax.run import driver
from vitcnn_jax.run import loading
from vitcnn_jax.run import many
from vitcnn_jax.run import pipeline
from vitcnn_jax.run import programs
from vitcnn_jax.run import workdir as workdir_lib

OTHER_JOBS = ("inspect", "report", "train")
CONFIG_FILES = {"cka": "cka_vit_resnet", "reference_cka": "data_scale"}  # else configs/NAME.py


@dataclasses.dataclass
class Result:
  """An analysis's arrays (as in its npz), summary (its json) and figures."""
  analysis: str
  arrays: dict[str, np.ndarray]
  summary: dict
  workdir: str
  _plot: Callable = dataclasses.field(repr=False)

  def __getitem__(self, key: str) -> np.ndarray:
    return self.arrays[key]

  def __repr__(self) -> str:
    shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in self.arrays.items())
    return f"Result({self.analysis!r}, workdir={self.workdir!r}, arrays: {shapes})"

  @property
  def names(self) -> dict[str, list[str]]:
    """Layer names by model (the rows and columns of the CKA matrices)."""
    return {k[len("names_"):]: list(v) for k, v in self.arrays.items() if k.startswith("names_")}

  def plot(self, format: str = "png", vmin: float = 0.0, vmax: float = 1.0):
    """The analysis's figures (also written to the workdir): one Figure, or a list."""
    drawn = self._plot(self.arrays, self.summary, self.workdir, style.Figures(format, vmin, vmax))
    return drawn[0] if len(drawn) == 1 else drawn


def run(config: ml_collections.ConfigDict, workdir: str,
        sources: dict[str, data.Source] | None = None) -> Result | dict | None:
  """Runs the job of `config` in `workdir` (held by this run alone); an analysis
  may be given its `sources` (else those of `config.data`)."""
  name = config.get("analysis")
  if name not in (*analyses.names(), *OTHER_JOBS):
    raise ValueError(f"config.analysis={name!r} is not one of {analyses.names() + list(OTHER_JOBS)}.")
  programs.use_compilation_cache(control.compilation_cache(config, programs.users_compilation_cache()))
  if jax.process_index() != 0:  # process 0 alone writes, so it alone checks and locks
    return _dispatch(name, config, workdir, sources)
  workdir = workdir_lib.check(workdir)
  with workdir_lib.lock(workdir):
    return _dispatch(name, config, workdir, sources)


def _dispatch(name: str, config: ml_collections.ConfigDict, workdir: str, sources):
  try:
    if name == "train":
      return train.run(config, workdir)
    if name == "inspect":
      return describe.run(config, workdir)
    if name == "report":
      return run_report(config, workdir)
    return run_analysis(config, workdir, sources)
  except AttributeError as e:
    if isinstance(e.__context__, KeyError):  # how ConfigDict reports a missing field
      field = str(e.__context__.args[0]).strip("'\"")
      raise ValueError(f"The config has no field {field!r} that analysis {name!r} needs; start "
                       f"from configs/{CONFIG_FILES.get(name, name)}.py.") from e
    raise


def sources_of(config: ml_collections.ConfigDict,
               declared: declaration.Declaration) -> dict[str, data.Source]:
  """The configured data (source "data") and, for an analysis that reads it, its test split."""
  out = {"data": pipeline.make_source(config.data)}
  if declared.test_split:
    out["test"] = pipeline.make_source(config.data, config.data.test_split)
  return out


def run_analysis(config: ml_collections.ConfigDict, workdir: str,
                 sources: dict[str, data.Source] | None = None) -> Result | None:
  """The analysis of `config`, checked, loaded and run; None if `stop_after` stopped it."""
  declared = analyses.get(config.analysis)
  control.check_config(config, declared)
  if declared.kept and sources is None:  # many models: every missing one named before any pass
    _say_missing(missing_inputs({"--config": config}), f"The {declared.name} job")
  sources = sources or sources_of(config, declared)
  if "num_examples" in config and config.num_examples > len(sources["data"]):
    raise ValueError(f"config.num_examples={config.num_examples}, but the data ({sources['data'].name}) "
                     f"has {len(sources['data'])} examples, sampled without replacement; lower "
                     "config.num_examples.")
  config = demos.resolve(config)
  if declared.kept:  # each model loaded for its own pass, its parameters let go after it
    done = many.run(config, workdir, declared, sources)
    return None if done is None else Result(declared.name, *done[:2], workdir, done[2].plot)
  models = loading.load_models(config, declared.hint, declared.needs)
  analysis = declared.build(config, models)
  done = driver.run(config, workdir, declared.name, analysis, models, sources)
  return None if done is None else Result(declared.name, *done, workdir, analysis.plot)


DATA_FLAGS = {"tfds": "data_dir=DIR", "folder": "path=DIR", "idx": "path=DIR", "photos": "path=DIR",
              "synthetic": "num_examples=N"}


def missing_inputs(sections: dict[str, ml_collections.ConfigDict]) -> list[str]:
  """The flag to pass for each checkpoint and data split the configs lack (each
  config by the flag prefix of its fields: "--config" for a job's own, or the
  report's "--config.runs.NAME"), checked before anything runs: a long job
  must not stop at its ninth model or section."""
  flags = []
  for key, sub in sections.items():
    for m, spec in (sub.get("models") or {}).items():
      path = spec.get("checkpoint") or ""
      why = "" if spec.get("train") else ("empty" if not path else loading.unreachable(path))
      if why:
        why = why if not path or path in why else f"{path}: {why}"
        flags.append(f"{key}.models.{m}.checkpoint=FILE  ({_short(why)})")
    if "data" not in sub:
      continue
    splits = [None] + ([sub.data.test_split] if analyses.get(sub.analysis).test_split else [])
    for split in splits:
      try:
        pipeline.make_source(sub.data, split)
      except (OSError, ValueError, KeyError, ImportError) as e:
        flag = f"{key}.data.{DATA_FLAGS.get(sub.data.get('source'), 'source=...')}"
        flags.append(f"{flag}  ({_short(str(e).split('): ', 1)[-1])})")
        break
  return flags


def _say_missing(flags: list[str], what: str) -> None:
  """One error listing every missing input's flag (nothing has run)."""
  if flags:
    raise ValueError(f"{what} cannot run: {len(flags)} of its inputs are missing or unreachable. "
                     "Nothing was run; pass each of these (then run the same command again):\n  "
                     + "\n  ".join(flags)
                     + ("\nAn empty checkpoint is a model to train first (configs/train.py; the "
                        "config says which)." if any("(empty)" in f for f in flags) else ""))


def _short(why: str, width: int = 110) -> str:
  """The first clause of a reason, for one line per missing input."""
  why = why.splitlines()[0].split("; ")[0].removeprefix("FileNotFoundError: ")
  return why if len(why) <= width else why[:width].rsplit(" ", 1)[0] + " ..."


def run_report(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or reuses) each analysis of `config.runs` in WORKDIR/<section>, then the page."""
  order = list(config.get("order") or ())
  missing = [n for n in order if n not in config.runs]
  if missing:
    raise ValueError(f"config.order names {missing}, which config.runs does not have.")
  sections = {n: config.runs[n] for n in order + sorted(set(config.runs) - set(order))}
  if not sections:
    raise ValueError("config.runs is empty; give the report the analyses to run (configs/report.py).")
  if jax.process_index() == 0:
    _say_missing(missing_inputs({f"--config.runs.{n}": sub for n, sub in sections.items()}), "The report")
  for i, (name, sub) in enumerate(sections.items(), 1):
    if jax.process_index() == 0:
      print(f"[{i}/{len(sections)}] {name} ({sub.analysis}) in {os.path.join(workdir, name)}")
    run(sub, os.path.join(workdir, name))
  if jax.process_index() != 0:
    return {}
  path = report.write(workdir, sections, config.get("title") or "vitcnn_jax report")
  print(f"Wrote {path}")
  return {"report": path, "sections": list(sections)}
