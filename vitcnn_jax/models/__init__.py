"""The model families, each with its architecture and its checkpoint formats.

Every model returns `(logits, out)` and exposes its anatomy (`models/anatomy.py`):
analyses ask a model what it has, never which family it is.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import flax.linen as nn

from vitcnn_jax.models import (bit_io, convnext_hf_io, convnext_io, mixer_io, resnet_hf_io, resnet_io,
                               resnet_onnx_io, swin_io, vit_eva_io, vit_hf_io, vit_io, vit_timm_io)
from vitcnn_jax.models.bit import BiT
from vitcnn_jax.models.convnext import ConvNeXt
from vitcnn_jax.models.mixer import Mixer
from vitcnn_jax.models.resnet import ResNet
from vitcnn_jax.models.swin import Swin
from vitcnn_jax.models.vit import ViT


@dataclasses.dataclass(frozen=True)
class Family:
  name: str
  module: type[nn.Module]  # the Flax model
  ios: tuple[ModuleType, ...]  # its formats' modules: detect, read, adapt, write, FORMATS, SUFFIX, OVERRIDABLE

  def io_for(self, fmt: str) -> ModuleType:
    """The module of format `fmt`."""
    for io_ in self.ios:
      if fmt in io_.FORMATS:
        return io_
    raise ValueError(f"A {self.name} model has no format {fmt!r}; its formats are "
                     f"{sorted(f for io_ in self.ios for f in io_.FORMATS)}.")


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("vit", ViT, (vit_io, vit_eva_io, vit_timm_io, vit_hf_io)), Family("bit", BiT, (bit_io,)),
    Family("mixer", Mixer, (mixer_io,)), Family("convnext", ConvNeXt, (convnext_io, convnext_hf_io)),
    Family("resnet", ResNet, (resnet_io, resnet_hf_io, resnet_onnx_io)),
    Family("swin", Swin, (swin_io,)))}


def family_of(model: nn.Module) -> Family:
  """The family of a model instance."""
  return FAMILIES[model.family]


def get_model(family: str, **kwargs) -> nn.Module:
  if family not in FAMILIES:
    raise ValueError(f"Unknown model family {family!r}; expected one of {sorted(FAMILIES)}.")
  return FAMILIES[family].module(**kwargs)


__all__ = ["BiT", "ConvNeXt", "FAMILIES", "Family", "Mixer", "ResNet", "Swin", "ViT", "family_of",
           "get_model"]
