"""What every reader shares: the error, what a reader found (`Reading`), what a
config.json beside the file states or leaves assumed (`Settings`), the key
ledger (`Keys`) that refuses a file's leftover tensors, and `Reader`, the
declaration each reader module ends with."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Callable

import numpy as np

Params = dict[str, Any]


log = logging.getLogger("vitcnn_jax")


class CheckpointError(ValueError):
  """A checkpoint that cannot be read as the model it describes."""


@dataclasses.dataclass
class Reading:
  """What a family's reader found in a file."""
  fmt: str
  config: dict[str, Any]     # model fields read from the file
  evidence: dict[str, str]   # field -> the tensor (or absence) it was read from
  params: dict[str, np.ndarray]  # flat, our names
  assumed: tuple[str, ...] = ()  # fields no tensor decides: defaults, overridable
  sources: dict[str, str] = dataclasses.field(default_factory=dict)  # ours -> file key, where
  # no writer maps it back (a block of a scan-stacked tree), for messages
  policy: tuple[str, str] | None = None  # (policy, where it is stated): the preprocessing


class Settings:
  """What a file's config.json says beyond its tensors, field by field: each value
  with where it was stated, or a default, recorded as assumed (an override may
  change it). A reader's config.json is read by a subclass for its upstream."""

  def __init__(self):
    self.assumed: list[str] = []

  def state(self, field: str, cfg: dict, ev: dict, value: Any, why: str) -> None:
    cfg[field], ev[field] = value, why

  def assume(self, field: str, cfg: dict, ev: dict, value: Any, why: str) -> None:
    self.state(field, cfg, ev, value, why)
    self.assumed.append(field)


class Keys:
  """The file's tensors, handed out once each; leftovers are an error."""

  def __init__(self, flat: dict[str, np.ndarray], path: str, fmt: str, prefix: str = "",
               graph: Any = None, meta: Any = None):
    self.flat, self.path, self.fmt = flat, path, fmt
    self.prefix = prefix  # what the file puts before every key (`params/`), for messages
    self.graph = graph  # an ONNX file's `onnx_file.Graph`, else None
    self.meta = meta  # the settings beside the weights (`hf_folder.Meta`), else None
    self.used: set[str] = set()

  def has(self, key: str) -> bool:
    return key in self.flat

  def shape(self, key: str) -> str:
    """`key (shape)`: the evidence a field was read from, named as the file names it."""
    named = self.graph.described.get(self.prefix + key) if self.graph else None
    return f"{named or key} {tuple(self.flat[key].shape)}"

  def take(self, key: str) -> np.ndarray:
    if key not in self.flat:
      raise CheckpointError(
          f"{self.path}: key {self.prefix + key!r} is missing; a {self.fmt} checkpoint with "
          "this architecture needs it. The file is incomplete or of another format.")
    self.used.add(key)
    return self.flat[key]

  def indices(self, pattern: str) -> list[int]:
    """Sorted distinct integers captured by `pattern`, checked to be 0..n-1 or 1..n."""
    found = sorted({int(m.group(1)) for k in self.flat if (m := re.match(pattern, k))})
    if found and found != list(range(found[0], found[0] + len(found))):
      raise CheckpointError(f"{self.path}: numbering of {pattern!r} has gaps: {found}.")
    return found

  def finish(self) -> None:
    left = sorted(set(self.flat) - self.used)
    if left:
      shown = ", ".join(self.shape(k) if self.graph else self.prefix + self.shape(k)
                        for k in left[:10])
      raise CheckpointError(
          f"{self.path}: {len(left)} tensor(s) not used by the {self.fmt} model "
          f"read from this file: {shown}{' ...' if len(left) > 10 else ''}. "
          "Refusing to ignore them; is this a different architecture?")


def take_head(keys: Keys, p: dict, cfg: dict, ev: dict,
              kernel: str = "head/kernel", bias: str = "head/bias") -> None:
  """The classifier, if the file has one (two-tower image towers often do not)."""
  if keys.has(kernel):
    w = keys.take(kernel)
    if not (w.ndim == 2 or (w.ndim == 4 and w.shape[:2] == (1, 1))):
      raise CheckpointError(f"{keys.path}: {keys.prefix}{keys.shape(kernel)} should be a 2-D "
                            "(width, classes) kernel, or (1, 1, width, classes) as big_transfer "
                            "writes it. The file is malformed.")
    w = w.reshape(w.shape[-2:])
    p["head/kernel"], p["head/bias"] = w, keys.take(bias)
    cfg["num_classes"], ev["num_classes"] = w.shape[-1], keys.shape(kernel)
  else:
    cfg["num_classes"], ev["num_classes"] = None, f"no {kernel} in the file"



@dataclasses.dataclass(frozen=True)
class Reader:
  """One upstream's files of one family, declared at the end of its module.

  A reader needs only its formats, its upstream's preprocessing, `read`, and
  `detect` (a format told by a file's keys) or `detect_graph` (by an ONNX graph's
  structure): it reads only unless it gives `write` (and the `suffix` it writes), it
  adapts nothing to a new resolution unless it gives `adapt`, and a model is
  written as its first format unless `default_format` says otherwise.
  """
  formats: dict[str, str]  # format -> what its files are (messages, docs/models.md)
  policy: str  # the preprocessing of the upstream's own evaluation
  read: Callable[[Keys], Reading]
  detect: Callable[[dict[str, np.ndarray]], str | None] | None = None  # a format told by keys
  overridable: tuple[str, ...] = ()  # fields set from the format that an override may change
  adapt: Callable[[dict, Reading, int | None, str], None] | None = None
  write: Callable[[Any, dict[str, np.ndarray], str], dict[str, np.ndarray]] | None = None
  suffix: str | None = None  # the file `write` fills: ".npz" or ".safetensors"
  default_format: Callable[[Any], str] | None = None
  detect_graph: Callable[[dict[str, np.ndarray], Any], str | None] | None = None  # ONNX structure
  narrows: tuple[str, ...] = ()  # formats whose keys its files carry too: this one is meant

  def adapt_to(self, cfg: dict, r: Reading, native: int | None, path: str) -> None:
    """`cfg` made to run at the requested resolution (`adapt`), if anything must change."""
    if self.adapt is not None:
      self.adapt(cfg, r, native, path)

  def format_for(self, model) -> str:
    return self.default_format(model) if self.default_format else next(iter(self.formats))
