"""Images from folders: class sub-folders or flat with a labels file
(`FolderSource`), and square crops of a few large photographs (`PhotoCrops`).

Images are decoded with PIL and become 8-bit RGB without guessing (`to_rgb8`);
a folder's listing and sizes make its identity, which resumed states check.
"""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

import numpy as np

from vitcnn_jax import fileio
from vitcnn_jax.inputs.data import LABELS_ARE

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


IMAGENET_VAL_LABELS = "imagenet2012_validation"


def imagenet_validation_labels() -> str:
  """tfds's own file of the 50,000 ImageNet validation labels (one WordNet id per
  line, in file-name order), installed with tensorflow-datasets."""
  import tensorflow_datasets as tfds
  return os.path.join(os.path.dirname(tfds.__file__), "datasets", "imagenet2012",
                      "validation_labels.txt")


def read_labels(path: str, names: Sequence[str]) -> list[str]:
  """Labels of the images `names` (sorted file names) from a text file: one label
  per line in that order, or lines `FILE LABEL` (FILE with or without extension)."""
  lines = [ln.split() for ln in fileio.read_bytes(path).decode().splitlines() if ln.strip()]
  if all(len(ln) == 1 for ln in lines):
    if len(lines) != len(names):
      raise ValueError(f"{path}: {len(lines)} labels for {len(names)} images; a file of one "
                       "label per line must hold one for every image, in file-name order.")
    return [ln[0] for ln in lines]
  if not all(len(ln) == 2 for ln in lines):
    bad = next(i for i, ln in enumerate(lines) if len(ln) != 2)
    raise ValueError(f"{path}: line {bad + 1} is {' '.join(lines[bad])!r}; expected `FILE LABEL` "
                     "on every line, or one label per line.")
  table = {}
  for name, label in lines:
    table[name] = table[os.path.splitext(name)[0]] = label
  missing = [n for n in names if n not in table and os.path.splitext(n)[0] not in table]
  if missing:
    raise ValueError(f"{path}: no label for {len(missing)} of {len(names)} images, e.g. "
                     f"{missing[:3]}.")
  return [table.get(n, table.get(os.path.splitext(n)[0])) for n in names]


def label_ids(labels: Sequence[str]) -> list[int]:
  """Integer labels as they are; class names numbered in sorted order (for WordNet
  ids that is tfds's imagenet2012 numbering)."""
  if all(t.isdigit() for t in labels):
    return [int(t) for t in labels]
  number = {c: i for i, c in enumerate(sorted(set(labels)))}
  return [number[t] for t in labels]


class ImageError(ValueError):
  """An image file that cannot become 8-bit RGB without guessing."""


def to_rgb8(im, path: str) -> np.ndarray:
  """An 8-bit RGB array of a PIL image. 16-bit integer images are scaled from
  0..65535 (PIL's RGB conversion would clip them, leaving them almost white);
  float images have no agreed range and are refused."""
  if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
    a = np.asarray(im, np.int64)
    if a.min() < 0 or a.max() > 65535:
      raise ImageError(f"{path}: {im.mode} image with values {a.min()}..{a.max()}, outside "
                       "16 bits; convert it to 8-bit RGB first.")
    grey = np.round(a / 257.0).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=-1) if grey.ndim == 2 else grey
  if im.mode == "F" or im.mode.startswith("F;"):
    raise ImageError(f"{path}: floating-point image (mode {im.mode}) has no agreed value "
                     "range; convert it to 8-bit RGB first.")
  return np.asarray(im.convert("RGB"))


class FolderSource:
  """Images under a directory: class sub-folders (labels by sorted name), or flat
  with an optional labels file (`labels`, see `read_labels`), or flat unlabelled.

  `labels="imagenet2012_validation"` reads tfds's bundled validation labels, so
  the flat folder of ILSVRC2012 validation JPEGs gives tfds's labels.
  """

  def __init__(self, root: str, labels: str = ""):
    self.name = f"folder:{root}"
    if not os.path.isdir(root):
      raise FileNotFoundError(f"{root!r} is not a directory.")
    entries = sorted(os.listdir(root))
    classes = [e for e in entries if os.path.isdir(os.path.join(root, e))]
    files: list[tuple[str, int]] = []
    if classes:
      if labels:
        raise ValueError(f"labels={labels!r} are for a flat folder, but {root} has "
                         f"class sub-folders ({classes[:3]}...), which are the labels.")
      loose = [e for e in entries if e.lower().endswith(IMAGE_EXTENSIONS)]
      if loose:
        raise ValueError(f"{root} has class sub-folders and also {len(loose)} images beside "
                         f"them (e.g. {loose[0]}), which would be left out: move them into "
                         "a class folder or elsewhere.")
      for label, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, c))):
          if f.lower().endswith(IMAGE_EXTENSIONS):
            files.append((os.path.join(root, c, f), label))
    else:
      names = [f for f in entries if f.lower().endswith(IMAGE_EXTENSIONS)]
      if labels:
        path = imagenet_validation_labels() if labels == IMAGENET_VAL_LABELS else labels
        ids = label_ids(read_labels(path, names))
        files = [(os.path.join(root, f), i) for f, i in zip(names, ids)]
      else:
        files = [(os.path.join(root, f), 0) for f in names]
    if not files:
      raise FileNotFoundError(
          f"{root}: no images ({', '.join(IMAGE_EXTENSIONS)}) found, neither directly nor in "
          "class sub-folders.")
    self.files, self.classes = files, classes
    self.num_classes = len(classes) if classes else max(i for _, i in files) + 1
    listing = hashlib.sha256()
    for path, label in files:  # names, sizes, times and labels: edits change it
      st = os.stat(path)
      listing.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{label}\n".encode())
    self.identity = f"{self.name} ({len(files)} files, listing {listing.hexdigest()[:16]})"

  def __len__(self) -> int:
    return len(self.files)

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    from PIL import Image  # pillow comes with matplotlib
    out = []
    for i in indices:
      path = self.files[int(i)][0]
      try:
        with Image.open(path) as im:
          out.append(to_rgb8(im, path))
      except ImageError:
        raise
      except Exception as e:  # PIL raises many types for bad files
        raise ValueError(f"{path}: unreadable image ({type(e).__name__}: {e}).") from e
    return out

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    return np.asarray([self.files[int(i)][1] for i in indices])


class PhotoCrops:
  """Square crops of a few photographs, at several scales and seeded positions:
  enough distinct inputs for the analyses from a folder of photos (the offline
  ones of `packaged.PHOTOS`, or any). Crop i comes from photograph i mod P at
  scale SCALES[(i // P) mod S] of its shorter side; its label is the photograph,
  or, where the photographs are in class sub-folders, its class: labels that a
  probe must generalise across photographs to predict. A few dozen photographs,
  not ImageNet: crops of one photograph share content."""

  SCALES = (1.0, 0.7, 0.5, 0.35, 0.25)
  MIN_SIDE = 4  # the smallest crop's side

  def __init__(self, root: str, num_examples: int, size: int = 256, seed: int = 0):
    self.photos, self.root = FolderSource(root), root
    if num_examples < 1 or size < 4:
      raise ValueError(f"num_examples={num_examples}, size={size}: photo crops need at least "
                       "1 example of at least 4x4 pixels.")
    self.n, self.size, self.seed = num_examples, size, seed
    self.by_class = bool(self.photos.classes)
    self.labels_are = LABELS_ARE if self.by_class else "photographs"
    self.num_classes = self.photos.num_classes if self.by_class else len(self.photos)
    classes = f" in {self.num_classes} classes" if self.by_class else ""
    self.name = f"photos:{root} ({len(self.photos)} photographs{classes}, {num_examples} crops)"
    self.identity = f"{self.photos.identity}, {num_examples} crops of {size}px, seed {seed}"
    self._cache: dict[int, np.ndarray] = {}

  def __len__(self) -> int:
    return self.n

  def _photo(self, p: int) -> np.ndarray:
    if p not in self._cache:
      photo = self.photos.images([p])[0]
      if min(photo.shape[:2]) < self.MIN_SIDE:
        raise ValueError(f"{self.photos.files[p][0]}: a photograph of {photo.shape[1]}x{photo.shape[0]} px; "
                         f"crops need its shorter side at least {self.MIN_SIDE} px. Remove it from {self.root} "
                         "or use a larger copy.")
      self._cache[p] = photo
    return self._cache[p]

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    from vitcnn_jax.inputs import preprocess  # it imports jax
    out = []
    count = len(self.photos)
    for i in indices:
      if not 0 <= i < self.n:
        raise IndexError(f"{self.name}: index {i} out of range.")
      photo = self._photo(int(i) % count)
      h, w = photo.shape[:2]
      side = max(self.MIN_SIDE, round(self.SCALES[(int(i) // count) % len(self.SCALES)] * min(h, w)))
      rng = np.random.default_rng((self.seed, int(i)))
      top, left = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
      crop = photo[top:top + side, left:left + side]
      out.append(np.clip(np.round(preprocess.resize(crop, (self.size, self.size), "area")),
                         0, 255).astype(np.uint8))
    return out

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    photos = np.asarray(indices) % len(self.photos)
    return self.photos.labels(photos) if self.by_class else photos
