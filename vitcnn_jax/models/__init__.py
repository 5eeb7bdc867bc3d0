"""The model families, each a package with its architecture (`model.py`) and a
reader per upstream whose files it loads; `formats/` holds what readers share
and `loader.py` turns a file into a model.

Every model returns `(logits, out)` and exposes its anatomy (`anatomy.py`):
analyses ask a model what it has, never which family it is. A new family is a
package declaring its `FAMILY`, registered below.
"""

from __future__ import annotations

import flax.linen as nn

from vitcnn_jax.models import bit, convnext, mixer, resnet, swin, vit
from vitcnn_jax.models.bit.model import BiT
from vitcnn_jax.models.convnext.model import ConvNeXt
from vitcnn_jax.models.family import Family
from vitcnn_jax.models.mixer.model import Mixer
from vitcnn_jax.models.resnet.model import ResNet
from vitcnn_jax.models.swin.model import Swin
from vitcnn_jax.models.vit.model import ViT

FAMILIES: dict[str, Family] = {f.name: f for f in (
    vit.FAMILY, bit.FAMILY, mixer.FAMILY, convnext.FAMILY, resnet.FAMILY, swin.FAMILY)}


def family_of(model: nn.Module) -> Family:
  """The family of a model instance."""
  return FAMILIES[model.family]


def get_model(family: str, **kwargs) -> nn.Module:
  if family not in FAMILIES:
    raise ValueError(f"Unknown model family {family!r}; expected one of {sorted(FAMILIES)}.")
  return FAMILIES[family].module(**kwargs)


__all__ = ["BiT", "ConvNeXt", "FAMILIES", "Family", "Mixer", "ResNet", "Swin", "ViT", "family_of",
           "get_model"]
