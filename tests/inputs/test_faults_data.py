"""Image files and folders that would be read wrongly: converted by mode, or refused."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require
from vitcnn_jax.inputs import folders

Image = require("PIL.Image")  # comes with matplotlib, a runtime dependency


def test_16_bit_png_is_scaled_not_clipped_to_white(tmp_path):
  grey = np.linspace(0, 65535, 64, dtype=np.uint16).reshape(8, 8)
  Image.fromarray(grey).save(tmp_path / "deep.png")
  with Image.open(tmp_path / "deep.png") as im:
    assert im.mode.startswith("I")  # what PIL makes of a 16-bit PNG
  img = folders.FolderSource(str(tmp_path)).images([0])[0]
  assert img.dtype == np.uint8 and img.shape == (8, 8, 3)
  np.testing.assert_array_equal(img[..., 0], np.round(grey / 257.0).astype(np.uint8))
  assert (img == 255).mean() < 0.05  # PIL's convert("RGB") made 99% of it white


def test_float_tiff_is_refused_naming_file_and_mode(tmp_path):
  Image.fromarray(np.full((8, 8), 0.5, np.float32)).save(tmp_path / "f.tif")
  with pytest.raises(folders.ImageError, match=r"f\.tif: floating-point image \(mode F\)"):
    folders.FolderSource(str(tmp_path)).images([0])


def test_images_beside_class_folders_are_an_error_not_left_out(tmp_path):
  for c in ("cat", "dog"):
    (tmp_path / c).mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / c / "a.png")
  Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "stray.png")
  with pytest.raises(ValueError, match=r"class sub-folders and also 1 images beside them "
                                       r"\(e.g. stray.png\)"):
    folders.FolderSource(str(tmp_path))
