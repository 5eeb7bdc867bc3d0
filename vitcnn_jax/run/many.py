"""The many-model job: each model's pass kept once, every pair combined once.

`run` keeps each model's pass under KEPT/NAME (`config.kept_dir`, by default
WORKDIR/passes; `keeping`: run only if not finished; `config.keep_only` stops
there, as a cluster's job per model would), then combines every pair of models (`combining`) whose sums are
not yet kept under WORKDIR/pairs/ for this program (measures, bootstrap, draws,
seed) and these two passes (the processes of a job share the new pairs, each
writing its own), and hands the pairs to the analysis. A longer model list in
the same workdir runs the new models' passes and the new pairs only.
"""

from __future__ import annotations

import dataclasses
import io
import os
import zipfile
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils as multihost

from vitcnn_jax import fileio
from vitcnn_jax.inputs import data
from vitcnn_jax.run import combining
from vitcnn_jax.run import control
from vitcnn_jax.run import driver
from vitcnn_jax.run import kept
from vitcnn_jax.run import keeping
from vitcnn_jax.run import loading
from vitcnn_jax.run import results
from vitcnn_jax.similarity import grams


def _pair_path(workdir: str, a: kept.Pass, b: kept.Pass, program) -> str:
  """The pair's sums file: keyed by both passes' manifests and the program."""
  key = results.fingerprint([a.manifest, b.manifest, repr(program)])
  return os.path.join(workdir, "pairs", f"{a.name}__{b.name}_{key}.npz")


def _save(path: str, got: combining.Combined) -> None:
  arrays = {f"sums/{r}/{k}": v for r, s in enumerate(got.sums) for k, v in s.items()}
  arrays.update({f"draws/{r}/{k}": v for r, s in enumerate(got.draws) for k, v in s.items()})
  arrays.update({f"pooled/{k}": v for k, v in got.pooled.items()})
  results.write_npz(path, repeats=np.asarray(len(got.sums)), **arrays)


def _load(path: str) -> combining.Combined | None:
  """A pair's kept sums, or None where there are none (or only a damaged file)."""
  if not fileio.exists(path):
    return None
  try:
    with np.load(io.BytesIO(fileio.read_bytes(path)), allow_pickle=False) as z:
      got = {k: z[k] for k in z.files}
  except (OSError, ValueError, EOFError, zipfile.BadZipFile):
    return None
  out = combining.Combined([{} for _ in range(int(got.pop("repeats")))], {}, [])
  out.draws = [{} for _ in out.sums]
  for key, v in got.items():
    kind, *rest = key.split("/")
    if kind == "pooled":
      out.pooled["/".join(rest)] = v
    else:
      (out.sums if kind == "sums" else out.draws)[int(rest[0])]["/".join(rest[1:])] = v
  return out


def _kept_passes(config: ml_collections.ConfigDict, declared, sources: dict[str, data.Source],
                 workdir: str, precision: grams.Precision) -> tuple[dict[str, loading.Loaded], dict]:
  """The models' passes kept. A model whose pass is finished and was kept from
  its request and checkpoint bytes is not loaded (`keeping.reuse`: its manifest
  holds what the comparison reads of it); the others are loaded and their
  passes run (or resumed), `config.models_per_pass` of them at a time in
  lockstep (each step's images read once for them all; 0: every model), their
  parameters let go after: memory holds that many models' parameters, whatever
  their number."""
  how = keeping.Protocol(config.num_examples, config.batch_size, config.repeats, config.seed,
                         config.get("gram_precision", "auto"))
  root = config.kept_dir or os.path.join(workdir, "passes")
  needs = lambda n: [c for m, c in declared.needs if m in (n, "*")]
  models = {}
  for n in config.models:
    got = None if needs(n) else keeping.reuse(n, config.models[n], sources["data"], how, os.path.join(root, n))
    if got is not None:
      models[n] = got
  if models and jax.process_index() == 0:
    print(f"Reusing the finished kept passes of {list(models)} in {root} (their models not loaded).")
  run = [n for n in config.models if n not in models]
  size = config.models_per_pass or len(run) or 1
  for start in range(0, len(run), size):
    group = [loading.load_model(config, n, declared.hint, needs(n)) for n in run[start:start + size]]
    keeping.keep_together(group, sources["data"], how, [os.path.join(root, m.name) for m in group], precision)
    models.update({m.name: dataclasses.replace(m, model=None, params=None) for m in group})
  return {n: models[n] for n in config.models}, {n: os.path.join(root, n) for n in config.models}


def run(config: ml_collections.ConfigDict, workdir: str, declared, sources: dict[str, data.Source]
        ) -> tuple[dict[str, np.ndarray], dict, Any] | None:
  """Runs the many-model analysis `declared` (its `pairs`, `pair`, `finalize` and
  `plot`): passes kept, pairs combined, NAME.{npz,json} and figures written.
  Returns (arrays, summary, the analysis), or None where only passes were kept."""
  declared.build(config, dict.fromkeys(config.models))  # its config checked before any model loads
  figures = control.plot_options(config)
  precision = driver.precision_of(config)
  models, folders = _kept_passes(config, declared, sources, workdir, precision)
  if config.keep_only:
    if jax.process_index() == 0:
      root = os.path.dirname(next(iter(folders.values())))
      print(f"Kept the passes of {list(folders)} in {root} (config.keep_only): compare them with "
            f"config.kept_dir={root} and the full model list.")
    return None
  analysis = declared.build(config, models)
  opened = {k: kept.open_pass(f) for k, f in folders.items()}
  kept.check_shared([p for p, _ in opened.values()])
  paths = {(a, b): _pair_path(workdir, opened[a][0], opened[b][0], analysis.program()) for a, b in analysis.pairs()}
  combine = lambda a, b: combining.combine(
      [opened[a][0], opened[b][0]], [opened[a][1], opened[b][1]], analysis.spec, config.seed,
      config.get("bootstrap", 0), precision, config.calibration.draws)
  todo = [k for k, path in paths.items() if not fileio.exists(path)]
  for a, b in todo[jax.process_index()::jax.process_count()]:  # the processes share the new pairs
    _save(paths[a, b], combine(a, b))
  multihost.sync_global_devices(f"many_models pairs {workdir}")  # every new pair's sums written
  pairs = {}
  for (a, b), path in paths.items():
    got = _load(path)
    if got is None:  # a damaged file, or a workdir the processes do not share
      got = combine(a, b)
      if jax.process_index() == 0:
        _save(path, got)
    pairs[a, b] = analysis.pair(a, b, got)
  arrays, summary = analysis.finalize(pairs)
  summary["passes"] = {k: {"folder": p.folder, "bytes": p.manifest["bytes"],
                           "size": kept.describe_size(p.manifest["bytes"])} for k, (p, _) in opened.items()}
  summary.update(driver.inputs(models, sources))
  driver.write(workdir, declared.name, summary, arrays, analysis.plot, figures)
  return arrays, summary, analysis
