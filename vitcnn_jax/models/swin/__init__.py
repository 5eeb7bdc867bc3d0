"""The Swin Transformer family: the model and its reader of timm's and
transformers' state dicts (one name table each, `state_dict.py`)."""

from vitcnn_jax.models.family import Family
from vitcnn_jax.models.swin import state_dict
from vitcnn_jax.models.swin.model import Swin

FAMILY = Family("swin", Swin, (state_dict.READER,))
