"""The analyses from a notebook, in a line each, through the same driver as main.py.

  import vitcnn_jax as vj
  r = vj.cka({"ViT-B/16": "ViT-B_16.npz", "R50": "BiT-M-R50x1.npz"}, images)
  r["cka_r50_vit_b_16"], r.names["vit_b_16"]; r.plot()

A model is a checkpoint path (local or gs://), a name of `zoo.CHECKPOINTS`, a dict
`{"checkpoint": path, **overrides}` (`checkpoints.load_model`'s, e.g. `resolution`:
a ResNet's npz does not record its input size), or a `(model, params)` pair; images are a uint8 array (N, H, W[, 3]) or a
`data.Source`. Each call builds the config its `configs/*.py` would, runs the
analysis (resumable, in `workdir`: a new temporary one unless given) and returns
a `Result`: the arrays of its npz, its json summary, and `plot()`.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import re
import tempfile
from typing import Any, Callable, Mapping, Sequence

import ml_collections
import numpy as np

from vitcnn_jax import analyses
from vitcnn_jax import checkpoints
from vitcnn_jax import data
from vitcnn_jax import driver
from vitcnn_jax import fileio
from vitcnn_jax import loading
from vitcnn_jax import plotting
from vitcnn_jax import probe
from vitcnn_jax import results
from vitcnn_jax import workdir as workdir_lib
from vitcnn_jax import zoo

ModelSpec = Any  # str (path or zoo name) | dict (checkpoint + overrides) | (module, params)
Images = Any  # np.ndarray of uint8 | data.Source


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

  def plot(self, format: str = "png", vmin: float = 0.0, vmax: float = 1.0):  # pylint: disable=redefined-builtin
    """The analysis's figures (also written to the workdir): one Figure, or a list."""
    with plotting.options(format, vmin, vmax, keep=True) as figures:
      self._plot(self.arrays, self.summary, self.workdir)
    return figures[0] if len(figures) == 1 else figures


def key(label: str) -> str:
  """The name arrays and files use for a model labelled `label`: "ViT-B/16" -> "vit_b_16"."""
  out = re.sub(r"[^0-9a-z]+", "_", label.lower()).strip("_")
  if not out:
    raise ValueError(f"model label {label!r} needs at least one letter or digit.")
  return out


def load(name: str, spec: ModelSpec, layers, label: str | None = None) -> loading.Loaded:
  """Model `spec` under `name`, capturing `layers` (a `zoo.LAYERS` preset or patterns)."""
  if isinstance(spec, tuple) and len(spec) == 2:
    (model, params), path = spec, checkpoints.params_digest(spec[1])
  elif isinstance(spec, (str, dict)):
    overrides = dict(spec) if isinstance(spec, dict) else {"checkpoint": spec}
    path = zoo.checkpoint(overrides.pop("checkpoint", ""))
    if why := loading.unreachable(checkpoints.split_tower(path)[0]):
      raise FileNotFoundError(f"model {label or name!r}: checkpoint {path!r} is not reachable "
                              f"({why}); pass a local copy.")
    model, params = checkpoints.load_model(path, **overrides)
  else:
    raise TypeError(f"model {label or name!r} is a {type(spec).__name__}; pass a checkpoint "
                    "path, a name in vitcnn_jax.zoo.CHECKPOINTS, a dict of a checkpoint and "
                    "load_model overrides, or a (model, params) pair.")
  label = label or (spec if isinstance(spec, str) and spec in zoo.CHECKPOINTS else model.family)
  try:
    return loading.loaded(name, path, label, model, params, zoo.layers(layers, model.family))
  except ValueError as e:
    raise ValueError(f"model {label!r}: {e}") from e


def source(images: Images, labels: Sequence[int] | None = None) -> data.Source:
  if isinstance(images, np.ndarray) or isinstance(images, list):
    return data.ArraySource(np.asarray(images), labels)
  if all(hasattr(images, a) for a in ("images", "labels", "identity")):
    return images
  raise TypeError(f"images are a {type(images).__name__}; pass a uint8 array (N, H, W[, 3]) or a "
                  "vitcnn_jax.data source.")


def run(analysis: str, loaded: dict[str, loading.Loaded], sources: dict[str, data.Source],
        workdir: str | None, **fields) -> Result:
  """Runs `analysis` on loaded models through `driver.run`; `fields` are its config
  (`models`: per-model fields an analysis reads, e.g. a probe's `features`)."""
  if analysis not in analyses.ANALYSES:
    raise ValueError(f"analysis {analysis!r} is not one of {analyses.ANALYSES}.")
  workdir = workdir_lib.check(workdir or tempfile.mkdtemp(prefix=f"vitcnn_jax-{analysis}-"))
  config = ml_collections.ConfigDict(dict(analysis=analysis, seed=0, **driver.CONTROL))
  config.update(fields)
  module = importlib.import_module(f"vitcnn_jax.analyses.{analysis}")
  driver.check_config(config, module)
  driver.check_sources(config, sources)
  job = module.build(config, loaded)
  with workdir_lib.lock(workdir):
    driver.run(config, workdir, job, loaded, sources)
  with np.load(io.BytesIO(fileio.read_bytes(results.workdir_path(workdir, f"{job.name}.npz")))) as z:
    arrays = {k: z[k] for k in z.files}
  summary = json.loads(fileio.read_bytes(results.workdir_path(workdir, f"{job.name}.json")))
  return Result(analysis, arrays, summary, workdir, job.plot)


def _named(models: Mapping[str, ModelSpec], layers) -> dict[str, loading.Loaded]:
  """{label: spec} -> loaded models under `key(label)`, in name order like config.models."""
  names = {key(label): label for label in models}
  if len(names) != len(models):
    raise ValueError(f"model labels {list(models)} give the same name twice ({list(names)}); "
                     "rename one.")
  return {k: load(k, models[names[k]], layers, names[k]) for k in sorted(names)}


def _protocol(n: int, batch_size: int | None, default: int) -> dict:
  return dict(num_examples=n, batch_size=min(batch_size or default, n))


def cka(models: Mapping[str, ModelSpec], images: Images, *, layers="paper", batch_size: int = 256,
        repeats: int = 1, num_examples: int | None = None, workdir: str | None = None,
        **fields) -> Result:
  """Minibatch CKA within and across `models` ({label: model}); Figs 1, 2, B.1.
  Arrays `cka_A_B` (A, B: `key(label)`, every pair in name order), `names_A`."""
  src = source(images)
  loaded = _named(models, layers)
  n = num_examples or len(src)
  return run("cka", loaded, {"data": src}, workdir, repeats=repeats,
             **_protocol(n, batch_size, 256), **fields)


def attention_distance(model: ModelSpec, images: Images, *, label: str = "ViT",
                       batch_size: int = 64, workdir: str | None = None, **fields) -> Result:
  """Mean attention distance per head and block of a ViT (Figs 3, D.1)."""
  src = source(images)
  loaded = {"vit": load("vit", model, "block*/attn/weights", label)}
  return run("attention_distance", loaded, {"data": src}, workdir,
             **{"cls": "drop", "plot_blocks": [], **_protocol(len(src), batch_size, 64), **fields})


def skip_ratio(images: Images, *, vit: ModelSpec = None, mixer: ModelSpec = None,
               resnet: ModelSpec = None, batch_size: int = 64, workdir: str | None = None,
               **fields) -> Result:
  """Norm ratio of the residual stream to each branch (Figs 7, E.2), for a ViT and/or
  a Mixer, with a ResNet's units beside them."""
  src = source(images)
  given = {k: v for k, v in dict(vit=vit, mixer=mixer, resnet=resnet).items() if v is not None}
  loaded = {k: load(k, v, "all") for k, v in given.items()}
  return run("skip_ratio", loaded, {"data": src}, workdir,
             **{"plot_tokens": 9, **_protocol(len(src), batch_size, 64), **fields})


def receptive_field(models: Mapping[str, ModelSpec], images: Images, *, batch_size: int = 8,
                    workdir: str | None = None, **fields) -> Result:
  """Effective receptive fields of every block (Figs 6, C.1-C.4)."""
  src = source(images)
  return run("receptive_field", _named(models, "all"), {"data": src}, workdir,
             **{"pre_residual": False, **_protocol(len(src), batch_size, 8), **fields})


def localization(model: ModelSpec, images: Images, layer: str, *, label: str | None = None,
                 batch_size: int = 256, workdir: str | None = None, **fields) -> Result:
  """CKA of each token of `layer` with each input patch (Figs 9, 10)."""
  src = source(images)
  name = key(label or "model")
  loaded = {name: load(name, model, "all", label)}
  return run("localization", loaded, {"data": src}, workdir,
             **{"layer": layer, "tokens": [], **_protocol(len(src), batch_size, 256), **fields})


def head_subsets(vit: ModelSpec, resnet: ModelSpec, images: Images, *, resnet_layers,
                 subset_size: int = 1, batch_size: int = 256, workdir: str | None = None,
                 **fields) -> Result:
  """CKA of ViT head subsets, sorted by attention distance, against ResNet layers (Fig 5)."""
  src = source(images)
  loaded = {"vit": load("vit", vit, "all"), "resnet": load("resnet", resnet, resnet_layers)}
  return run("head_subsets", loaded, {"data": src}, workdir,
             **{"block": 0, "subset_size": subset_size, "subset_stride": 1, "tap": "heads",
                **_protocol(len(src), batch_size, 256), **fields})


def reference_cka(models: Mapping[str, ModelSpec], images: Images, reference: str, *,
                  layers="paper", batch_size: int = 256, repeats: int = 1,
                  labels: Sequence[int] | None = None, workdir: str | None = None,
                  **fields) -> Result:
  """CKA of each layer with the same layer of the `reference` model (label), and,
  given `labels`, top-1 accuracy (Figs 8, 12, G.1)."""
  src = source(images, labels)
  if reference not in models:
    raise ValueError(f"reference {reference!r} is not one of the models {list(models)}.")
  return run("reference_cka", _named(models, layers), {"data": src}, workdir,
             **{"reference": key(reference), "accuracy": labels is not None, "repeats": repeats,
                **_protocol(len(src), batch_size, 256), **fields})


def linear_probe(models: Mapping[str, ModelSpec], images: Images, labels: Sequence[int],
                 test_images: Images, test_labels: Sequence[int], *, layers="blocks",
                 features: Sequence[str] = ("mean",), shots: int = 0, seeds: int = 1,
                 holdout: int = 0, l2: float = 1024.0, batch_size: int = 256,
                 workdir: str | None = None, **fields) -> Result:
  """Linear probes on each layer's features, scored on the test images (Figs 11, 13);
  `l2=0` chooses l2 per probe on the last `holdout` training images."""
  train, test = source(images, labels), source(test_images, test_labels)
  loaded = _named(models, layers)
  return run("linear_probe", loaded, {"data": train, "test": test}, workdir,
             **{"shots": shots, "seeds": seeds, "holdout": holdout, "l2": l2,
                "l2_sweep": list(probe.L2_SWEEP), "test_examples": 0,
                "models": {k: {"features": tuple(features)} for k in loaded},
                **_protocol(len(train), batch_size, 256), **fields})


