"""The analyses from a notebook, a line each, through the same path as main.py.

  import vitcnn_jax as vj
  r = vj.cka({"ViT-B/16": "ViT-B_16.npz", "R50": {"checkpoint": "BiT-M-R50x1.npz",
                                                 "resolution": 224}}, images)
  r["cka_r50_vit_b_16"], r.names["vit_b_16"]; r.plot()

Every analysis of `vitcnn_jax/analyses/` is a function here, made from its
declaration: `vj.NAME(models, images, *, labels=None, test=None, layers=None,
workdir=None, **fields)`. `models` maps labels to models (an analysis that reads
fixed names, e.g. `vit` and `resnet`, takes those names as keys; one that reads
one model also takes it alone). A model is a checkpoint path (local or gs://), a
name of `zoo.ZOO`, a `(model, params)` pair, or a dict of `checkpoint`
(or `model` and `params`) with `label`, `capture`, `policy`, per-model fields of
the analysis (e.g. a probe's `features`) and `load_model` overrides (e.g.
`resolution`: a ResNet's npz does not record its input size). Images are a
uint8 array (N, H, W[, 3]) or a `data` source; `test` (images and labels, or a
source) for analyses that score on a test split. `fields` are the analysis's
config fields (its `DEFAULTS`, the paper's protocol) and the driver's
(`control.CONTROL`). Results go to `workdir` (a new temporary one unless given:
then a finished run there is reused) and come back as a `jobs.Result`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import tempfile
from typing import Any, Callable, Iterator, Mapping, Sequence

import ml_collections
import numpy as np

from vitcnn_jax import analyses
from vitcnn_jax import jobs
from vitcnn_jax.inputs import data
from vitcnn_jax.inputs import zoo
from vitcnn_jax.models.formats import in_memory
from vitcnn_jax.run import control
from vitcnn_jax.run import declaration

ModelSpec = Any  # str (path or zoo name) | dict | (module, params)
Images = Any  # np.ndarray of uint8 | data.Source
SPEC_FIELDS = ("checkpoint", "label", "capture", "policy")


def key(label: str) -> str:
  """The name arrays and files use for a model labelled `label`: "ViT-B/16" -> "vit_b_16"."""
  out = re.sub(r"[^0-9a-z]+", "_", label.lower()).strip("_")
  if not out:
    raise ValueError(f"model label {label!r} needs at least one letter or digit.")
  return out


def source(images: Images, labels: Sequence[int] | None = None) -> data.Source:
  if isinstance(images, (np.ndarray, list)):
    return data.ArraySource(np.asarray(images), labels)
  if all(hasattr(images, a) for a in ("images", "labels", "identity")):
    return images
  raise TypeError(f"images are a {type(images).__name__}; pass a uint8 array (N, H, W[, 3]) or a "
                  "vitcnn_jax.inputs.data source.")


def spec(label: str, given: ModelSpec, layers, model_fields: Sequence[str]) -> dict:
  """A model spec of `config.models` for a notebook's model."""
  if isinstance(given, tuple) and len(given) == 2:
    given = {"model": given[0], "params": given[1]}
  elif isinstance(given, str):
    given = {"checkpoint": given, "label": given if given in zoo.ZOO else label}
  elif not isinstance(given, Mapping):
    raise TypeError(f"model {label!r} is a {type(given).__name__}; pass a checkpoint path, a name "
                    "in vitcnn_jax.inputs.zoo.ZOO, a dict of a checkpoint and load_model "
                    "overrides, or a (model, params) pair.")
  given = dict(given)
  if "model" in given or "params" in given:
    given["checkpoint"] = in_memory.remember(given.pop("model"), given.pop("params"))
  out = {"label": label, "capture": layers, "policy": "", **{k: given.pop(k) for k in
                                                            (*SPEC_FIELDS, *model_fields) if k in given}}
  out["capture"] = (out["capture"],) if isinstance(out["capture"], str) else tuple(out["capture"])
  return {**out, "overrides": given}


def speak(text: str, labels: Mapping[str, str]) -> str:
  """A message of `main.py`'s flags in the notebook's words: `--config.models.vit.policy=X`
  and `config.models.vit.policy` become `models['ViT']['policy']` (`labels`: name ->
  the label the notebook gave), `--config.F=` and `config.F` the keyword `F=`."""
  label = lambda name: labels.get(name, name)
  text = re.sub(r"(?:--)?config\.models\.(\w+)\.(\w+)",
                lambda m: f"models[{label(m[1])!r}][{m[2]!r}]", text)
  text = re.sub(r"(?:--)?config\.models\.(\w+)\b", lambda m: f"models[{label(m[1])!r}]", text)
  return re.sub(r"(?:--)?\bconfig\.(?=\w)", "", text)


class _Reworded(logging.Filter):
  """Rewords the package's log records (`speak`)."""

  def __init__(self, labels: Mapping[str, str]):
    super().__init__()
    self.labels = labels

  def filter(self, record: logging.LogRecord) -> bool:
    record.msg, record.args = speak(record.getMessage(), self.labels), ()
    return True


class _RewordedLines:
  """A text stream that rewords each whole line (`speak`) before it passes it on."""

  def __init__(self, out, labels: Mapping[str, str]):
    self.out, self.labels, self.line = out, labels, ""

  def write(self, text: str) -> int:
    self.line += text
    *done, self.line = self.line.split("\n")
    for line in done:
      self.out.write(speak(line, self.labels) + "\n")
    return len(text)

  def flush(self) -> None:
    if self.line:
      self.out.write(speak(self.line, self.labels))
      self.line = ""
    self.out.flush()


@contextlib.contextmanager
def in_notebook_words(labels: Mapping[str, str]) -> Iterator[None]:
  """While a notebook function runs: the package's notices, printed lines and
  errors name keyword arguments and the models' dicts, not `main.py`'s flags."""
  logger, reworded = logging.getLogger("vitcnn_jax"), _Reworded(labels)
  logger.addFilter(reworded)
  lines = _RewordedLines(sys.stdout, labels)
  try:
    with contextlib.redirect_stdout(lines):
      yield
  except Exception as e:
    if len(e.args) == 1 and isinstance(e.args[0], str):  # the same error, in the caller's words
      e.args = (speak(e.args[0], labels),)
    raise
  finally:
    lines.flush()
    logger.removeFilter(reworded)


def _one_model(models) -> bool:
  """Whether `models` is one model: anything but a mapping, or a mapping that is a
  model's own spec (it names a checkpoint, or a model and its params), not a
  mapping of names to models."""
  return not isinstance(models, Mapping) or "checkpoint" in models or "model" in models


def _names(declared: declaration.Declaration, models) -> dict[str, tuple[str, ModelSpec]]:
  """{config name: (label, spec)} of the models a notebook passed."""
  fixed = (*declared.models.required, *declared.models.optional)
  if _one_model(models):
    if len(fixed) > 1 or declared.models.count not in (None, 1):
      raise TypeError(f"{declared.name} reads {declared.models.describe()}: pass a dict of them.")
    name = fixed[0] if fixed else "model"
    return {name: (name if fixed else "model", models)}
  if not declared.models.any_names:
    return {n: (n, m) for n, m in models.items()}
  out = {key(label): (label, m) for label, m in models.items()}
  if len(out) != len(models):
    raise ValueError(f"model labels {list(models)} give the same name twice ({list(out)}); rename one.")
  return dict(sorted(out.items()))


def config_of(declared: declaration.Declaration, models, n: int, layers=None,
              **fields) -> ml_collections.ConfigDict:
  """The config of a notebook call: the declaration's defaults, the driver's fields,
  `fields`, and per model `config.models`."""
  known = {**declared.defaults, **control.CONTROL}
  shared = {k: fields.pop(k) for k in declared.model_fields if k in fields}
  unknown = sorted(set(fields) - set(known))
  if unknown:
    raise TypeError(f"{declared.name}() got {unknown}; its fields are {sorted(known)} and, per "
                    f"model, {list(declared.model_fields) or 'none'}.")
  for k, v in fields.items():  # a group of fields (e.g. calibration) given in part: the rest default
    if isinstance(known[k], Mapping) and isinstance(v, Mapping):
      if bad := sorted(set(v) - set(known[k])):
        raise TypeError(f"{declared.name}() got {k} with {bad}; its fields are {sorted(known[k])}.")
      fields[k] = {**known[k], **v}
  config = ml_collections.ConfigDict({"analysis": declared.name, **known, **fields})
  if "num_examples" in declared.defaults and "num_examples" not in fields:
    config.num_examples = min(config.num_examples, n)
  if "batch_size" not in fields and "num_examples" in config:
    config.batch_size = min(config.batch_size, config.num_examples)
  config.models = {name: {**shared, **spec(label, m, layers or declared.layers, declared.model_fields)}
                   for name, (label, m) in _names(declared, models).items()}
  return config


def function(name: str) -> Callable[..., jobs.Result]:
  """The notebook function of analysis `name`."""
  declared = analyses.get(name)

  def run(models: Mapping[str, ModelSpec] | ModelSpec, images: Images, *,
          labels: Sequence[int] | None = None, test: Any = None, layers=None,
          workdir: str | None = None, **fields) -> jobs.Result:
    sources = {"data": source(images, labels)}
    if declared.test_split:
      if test is None:
        raise TypeError(f"{name}() scores on a test split: pass test=(images, labels).")
      sources["test"] = source(*test) if isinstance(test, tuple) else source(test)
    config = config_of(declared, models, len(sources["data"]), layers, **fields)
    workdir = workdir or tempfile.mkdtemp(prefix=f"vitcnn_jax-{name}-")
    try:
      with in_notebook_words({k: m.label for k, m in config.models.items()}):
        return jobs.run(config, workdir, sources)
    finally:  # models handed over in memory are the caller's again
      for spec_ in config.models.values():
        if spec_.checkpoint.startswith(in_memory.IN_MEMORY):
          in_memory.forget(spec_.checkpoint)

  run.__name__ = run.__qualname__ = name
  run.__doc__ = (f"{declared.figures} of the paper: {declared.findings[0].text if declared.findings else ''}"
                 f"\n\nModels: {declared.models.describe()}; default layers {declared.layers!r}. "
                 f"Fields and defaults: {declared.defaults}.")
  return run


def __getattr__(name: str):
  """`api.cka`, `api.attention_distance`, ...: one function per analysis."""
  if name in analyses.names():
    return function(name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted([*globals(), *analyses.names()])
