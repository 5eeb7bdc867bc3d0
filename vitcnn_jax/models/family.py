"""What a family is to the loader: its Flax model and one reader per upstream
whose files it loads (`formats.base.Reader`), declared in its package's
`__init__.py` and registered in `models/__init__.py`."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import numpy as np

from vitcnn_jax.models.formats.base import Reader


@dataclasses.dataclass(frozen=True)
class Family:
  name: str
  module: type[nn.Module]  # the Flax model
  readers: tuple[Reader, ...]  # the first that writes is where `save` writes by default

  def reader_for(self, fmt: str) -> Reader:
    """The reader of format `fmt`."""
    for reader in self.readers:
      if fmt in reader.formats:
        return reader
    raise ValueError(f"A {self.name} model has no format {fmt!r}; its formats are "
                     f"{sorted(f for r in self.readers for f in r.formats)}.")

  def writers(self, suffix: str | None = None) -> list[Reader]:
    """The readers that also write (to files ending in `suffix`, if given)."""
    return [r for r in self.readers if r.write and suffix in (None, r.suffix)]

  def write(self, model, flat: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
    """Our flat params as the arrays of a file of format `fmt`."""
    reader = self.reader_for(fmt)
    if reader.write is None:
      saves = [f"{r.format_for(model)!r} ({r.suffix})" for r in self.writers()]
      raise ValueError(f"Format {fmt!r} is read, not written; a {self.name} model saves as "
                       + (" or ".join(saves) if saves else "none of its formats") + ".")
    return reader.write(model, flat, fmt)
