"""The ConvNeXt family: the model and its readers of timm's state dicts and
transformers' folders."""

from vitcnn_jax.models.convnext import timm, transformers
from vitcnn_jax.models.convnext.model import ConvNeXt
from vitcnn_jax.models.family import Family

FAMILY = Family("convnext", ConvNeXt, (timm.READER, transformers.READER))
