"""What a transformers config.json says of a model beyond its weights: the keys a
reader asks for, with its config class's defaults for keys the file leaves out,
and without a config.json those defaults, recorded as assumed."""

from __future__ import annotations

from typing import Any, Callable

from vitcnn_jax.models.formats.base import CheckpointError, Keys, Settings


class HfConfig(Settings):
  """The settings in config.json (or in its `section`, e.g. a two-tower model's
  `vision_config`) of a transformers model whose config class is `upstream`,
  with that class's `defaults` for the keys read."""

  def __init__(self, keys: Keys, upstream: str, defaults: dict[str, Any], section: str | None = None):
    super().__init__()
    self.upstream, self.defaults, self.path = upstream, defaults, keys.path
    self.section: dict[str, Any] | None = None
    if keys.meta:
      config = keys.meta.config
      self.section = config.get(section, {}) if section else config
      self.where = f"config.json{f' {section}.' if section else ' '}"

  def agrees(self, read: dict[str, int], path: str) -> None:
    """config.json describes these weights: each key it has equals what they show."""
    for key, value in read.items():
      if self.section and key in self.section and self.section[key] != value:
        raise CheckpointError(f"{path}: config.json {key}={self.section[key]!r}, but the weights "
                              f"show {value}: the config.json belongs to another model.")

  def get(self, field: str, key: str, cfg: dict, ev: dict, convert: Callable[[Any], Any] = lambda v: v,
          default: Any = None) -> Any:
    """cfg[field] from config.json's `key` (converted by `convert`), with its evidence."""
    default = self.defaults[key] if default is None else default
    if self.section is None:
      value, why = default, f"not in the weights and no config.json; {self.upstream}'s default {key}={default!r}"
    elif key in self.section:
      value, why = self.section[key], f"{self.where}{key}={self.section[key]!r}"
    else:
      value, why = default, f"{self.where}without {key}: {self.upstream}'s default {default!r}"
    try:
      value = convert(value)
    except CheckpointError as e:  # a value it cannot take: name the file
      raise CheckpointError(f"{self.path}: {e}") from None
    (self.assume if self.section is None else self.state)(field, cfg, ev, value, why)
    return value
