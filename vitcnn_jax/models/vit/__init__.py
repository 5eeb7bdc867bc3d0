"""The Vision Transformer family: the model (`model.py`) and its readers: Google's
npz (`google.py`), timm's ViT (`timm.py`) and Eva (`timm_eva.py`) state dicts,
and transformers' folders (`transformers.py`, its layouts in
`transformers_layouts.py`). The readers share what they have in common through
`torch_pieces.py` (attention, MLPs, heads, timm's prefix tokens of torch state
dicts) and `resize.py` (another resolution or patch size), never each other."""

from vitcnn_jax.models.family import Family
from vitcnn_jax.models.vit import google, timm, timm_eva, transformers
from vitcnn_jax.models.vit.model import ViT

FAMILY = Family("vit", ViT, (google.READER, timm.READER, timm_eva.READER, transformers.READER))
