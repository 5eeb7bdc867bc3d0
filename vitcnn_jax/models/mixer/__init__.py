"""The MLP-Mixer family: the model and its reader of the Mixer release's npz files."""

from vitcnn_jax.models.family import Family
from vitcnn_jax.models.mixer import google
from vitcnn_jax.models.mixer.model import Mixer

FAMILY = Family("mixer", Mixer, (google.READER,))
