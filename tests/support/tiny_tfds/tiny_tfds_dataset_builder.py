"""Builder of the tiny dataset (tfds needs it in a package module, not a script)."""

from __future__ import annotations

import io

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

NUM_EXAMPLES = 12


def image(i: int) -> np.ndarray:
  """Example i's image: a deterministic 16 x 16 RGB pattern."""
  return np.random.default_rng(i).integers(0, 256, (16, 16, 3), dtype=np.uint8)


class Builder(tfds.core.GeneratorBasedBuilder):
  """12 labelled 16 x 16 images in one 'test' split."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(16, 16, 3)),
        "label": tfds.features.ClassLabel(num_classes=3)}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"test": self._generate_examples()}

  def _generate_examples(self):
    for i in range(NUM_EXAMPLES):
      png = io.BytesIO()
      Image.fromarray(image(i)).save(png, format="PNG")  # encoded bytes: no TensorFlow needed
      yield i, {"image": png.getvalue(), "label": i % 3}
