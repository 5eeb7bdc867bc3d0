"""Model families by name; each model returns `(logits, out)`."""

from __future__ import annotations

import flax.linen as nn

from vitcnn_jax.models.bit import BiT
from vitcnn_jax.models.common import Capture
from vitcnn_jax.models.mixer import Mixer
from vitcnn_jax.models.vit import ViT

FAMILIES: dict[str, type[nn.Module]] = {"vit": ViT, "bit": BiT, "mixer": Mixer}


def get_model(family: str, **kwargs) -> nn.Module:
  if family not in FAMILIES:
    raise ValueError(f"Unknown model family {family!r}; expected one of {sorted(FAMILIES)}.")
  return FAMILIES[family](**kwargs)


__all__ = ["BiT", "Capture", "FAMILIES", "Mixer", "ViT", "get_model"]
