"""The BiT ResNet-v2 family: the model and its reader of big_transfer's and
big_vision's npz files."""

from vitcnn_jax.models.bit import google
from vitcnn_jax.models.bit.model import BiT
from vitcnn_jax.models.family import Family

FAMILY = Family("bit", BiT, (google.READER,))
