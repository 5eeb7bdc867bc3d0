"""The Vision Transformer family: the model (`model.py`) and its readers: Google's
npz (`google.py`), timm's ViT (`timm.py`) and Eva (`timm_eva.py`) state dicts,
and transformers' folders (`transformers.py`)."""

from vitcnn_jax.models.family import Family
from vitcnn_jax.models.vit import google, timm, timm_eva, transformers
from vitcnn_jax.models.vit.model import ViT

FAMILY = Family("vit", ViT, (google.READER, timm.READER, timm_eva.READER, transformers.READER))
