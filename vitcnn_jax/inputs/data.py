"""Image sources (uint8 images and labels by index) and sampling without replacement.

A source is random-access: `len(source)`, `source.images(indices)` (a list of
HxW or HxWxC uint8 arrays, sizes may differ) and `source.labels(indices)`.
Sampling and host sharding work on indices, so each host reads only the
examples its devices process.

Sources: tfds (`tfds.data_source`, array_record, no TensorFlow), image folders
(PIL), MNIST-format IDX files (Debian's dataset-fashion-mnist), synthetic.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from typing import Protocol, Sequence

import numpy as np

from vitcnn_jax import fileio

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


class Source(Protocol):
  name: str
  num_classes: int
  identity: str  # changes whenever the examples may have: resumed states check it

  def __len__(self) -> int: ...

  def images(self, indices: Sequence[int]) -> list[np.ndarray]: ...

  def labels(self, indices: Sequence[int]) -> np.ndarray: ...


LABELS_ARE = "classes"  # a source's labels, unless it says otherwise (`labels_are`)


def labels_are(source: Source) -> str:
  """What `source`'s labels say: "classes", or e.g. "photographs" (PhotoCrops of a
  flat folder: one label per photograph, which a probe tells apart trivially)."""
  return getattr(source, "labels_are", LABELS_ARE)


class SyntheticSource:
  """Deterministic random images (each a function of its index): tests, benchmarks."""

  num_classes = 10

  def __init__(self, num_examples: int, size: int = 32, seed: int = 0):
    if num_examples < 1 or size < 4:
      raise ValueError(f"num_examples={num_examples}, size={size}: a synthetic source needs "
                       "at least 1 example of at least 4x4 pixels.")
    self.name = f"synthetic({num_examples}, {size}px)"
    self.identity = f"{self.name} seed {seed}"
    self.n, self.size, self.seed = num_examples, size, seed

  def __len__(self) -> int:
    return self.n

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    out = []
    for i in indices:
      if not 0 <= i < self.n:
        raise IndexError(f"{self.name}: index {i} out of range.")
      rng = np.random.default_rng((self.seed, int(i)))
      # Smooth blobs plus noise: enough structure for layers to differ.
      base = rng.integers(0, 256, (4, 4, 3)).astype(np.float32)
      img = np.kron(base, np.ones((self.size // 4 + 1, self.size // 4 + 1, 1)))[:self.size, :self.size]
      img = img + rng.normal(0, 20, img.shape)
      out.append(np.clip(img, 0, 255).astype(np.uint8))
    return out

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    return np.asarray(indices) % self.num_classes


class ArraySource:
  """Images already in memory, e.g. a notebook's uint8 array: (N, H, W, 3), or
  (N, H, W) / (N, H, W, 1) grey, which is repeated to RGB like the other sources."""

  def __init__(self, images: np.ndarray, labels: Sequence[int] | None = None):
    images = np.asarray(images)
    if images.dtype != np.uint8:
      raise TypeError(f"images have dtype {images.dtype}; pass uint8 pixels in 0..255 (the "
                      "models' preprocessing scales them).")
    if images.ndim == 3:
      images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3) or len(images) == 0:
      raise ValueError(f"images have shape {images.shape}; pass (N, H, W, 3) or (N, H, W) "
                       "with N >= 1.")
    if labels is not None:
      labels = np.asarray(labels)
      if labels.shape != (len(images),) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels have shape {labels.shape} and dtype {labels.dtype}; pass "
                         f"{len(images)} integer class labels.")
    self._images = images if images.shape[-1] == 3 else np.repeat(images, 3, axis=-1)
    self._labels = labels
    self.num_classes = int(labels.max()) + 1 if labels is not None else 1
    digest = hashlib.sha256(self._images.tobytes())
    if labels is not None:
      digest.update(labels.astype(np.int64).tobytes())
    self.name = f"array({len(images)}, {images.shape[1]}x{images.shape[2]})"
    self.identity = f"{self.name} {digest.hexdigest()[:16]}"

  def __len__(self) -> int:
    return len(self._images)

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    return [self._images[i] for i in indices]

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    if self._labels is None:
      raise KeyError(f"{self.name}: no labels were given with the images.")
    return self._labels[np.asarray(indices, np.int64)]


class TfdsSource:
  """A tfds dataset split via `tfds.data_source` (array_record; no TensorFlow)."""

  def __init__(self, name: str, split: str, data_dir: str | None = None,
               image_key: str = "image", label_key: str = "label"):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    self.name = f"tfds:{name}[{split}]"
    prepare = (f"Prepare it once as array_record: `pip install tensorflow-cpu` (needed by "
               f"`tfds build` only), then `tfds build {name} --file_format=array_record "
               f"--data_dir=DIR` (ImageNet needs the manual download in DIR/downloads/manual), "
               f"and pass --config.data.data_dir=DIR. ImageNet's validation JPEGs also work "
               f"directly: --config.data.source=folder (see docs/running.md).")
    try:
      builder = tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # tfds raises several types for unknown names
      raise FileNotFoundError(f"{self.name}: unknown to tfds ({type(e).__name__}: {e}).") from e
    # Checked first: data_source() on an unprepared dataset starts downloading it.
    if not builder.is_prepared():
      raise FileNotFoundError(f"{self.name}: not prepared under data_dir={data_dir!r} "
                              f"(looked in {builder.data_path}). {prepare}")
    if split not in builder.info.splits:
      raise KeyError(f"{self.name}: no split {split!r}; it has {sorted(builder.info.splits)}. "
                     "Set --config.data.split.")
    try:
      self.ds = builder.as_data_source(split=split)
    except Exception as e:  # e.g. prepared in another file format
      raise FileNotFoundError(f"{self.name}: cannot open it as a data source under "
                              f"{builder.data_path} ({type(e).__name__}: {e}). {prepare}") from e
    self.image_key, self.label_key = image_key, label_key
    features = self.ds.dataset_info.features
    if image_key not in features:
      raise KeyError(f"{self.name}: no feature {image_key!r}; it has {sorted(features)}. "
                     "Set --config.data.image_key.")
    label = features[label_key] if label_key in features else None
    self.num_classes = getattr(label, "num_classes", 0) or 0
    self.identity = (f"{self.name} version {builder.info.version} in {builder.data_path}, "
                     f"{len(self.ds)} examples, keys {image_key}/{label_key}")

  def __len__(self) -> int:
    return len(self.ds)

  def _records(self, indices: Sequence[int]) -> list[dict]:
    return [self.ds[int(i)] for i in indices]

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    return [np.asarray(r[self.image_key]) for r in self._records(indices)]

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    if not self.num_classes:
      raise KeyError(f"{self.name}: no class label feature {self.label_key!r}.")
    return np.asarray([r[self.label_key] for r in self._records(indices)])


IMAGENET_VAL_LABELS = "imagenet2012_validation"


def imagenet_validation_labels() -> str:
  """tfds's own file of the 50,000 ImageNet validation labels (one WordNet id per
  line, in file-name order), installed with tensorflow-datasets."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
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
    from PIL import Image  # pylint: disable=g-import-not-at-top  (pillow comes with matplotlib)
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
    from vitcnn_jax.inputs import preprocess  # pylint: disable=g-import-not-at-top  (it imports jax)
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


def read_idx(path: str) -> np.ndarray:
  """An MNIST-format IDX file (optionally gzipped) as a uint8 array."""
  raw = fileio.read_bytes(path)
  if raw[:2] == b"\x1f\x8b":
    try:
      raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:
      raise ValueError(f"{path}: corrupt gzip data ({e}).") from e
  if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] != 0x08:
    raise ValueError(f"{path}: not a uint8 IDX file (magic {raw[:4]!r}).")
  ndim = raw[3]
  dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
  if data.size != int(np.prod(dims)):
    raise ValueError(f"{path}: header says {dims} ({int(np.prod(dims))} bytes) but holds "
                     f"{data.size}; the file is truncated.")
  return data.reshape(dims)


class IdxSource:
  """MNIST-format files `{split}-images-idx3-ubyte[.gz]` / `-labels-idx1-...`."""

  def __init__(self, directory: str, split: str):
    self.name = f"idx:{directory}[{split}]"
    paths = {}
    for kind, idx in (("images", 3), ("labels", 1)):
      base = os.path.join(directory, f"{split}-{kind}-idx{idx}-ubyte")
      found = [p for p in (base, base + ".gz") if fileio.exists(p)]
      if not found:
        hint = (" Install it with `apt-get install dataset-fashion-mnist`."
                if os.path.abspath(directory) == FASHION_MNIST_DIR else "")
        raise FileNotFoundError(f"{base}[.gz] not found (split {split!r}; MNIST-format "
                                f"splits are 'train' and 't10k').{hint}")
      paths[kind] = found[0]
    self.x = read_idx(paths["images"])
    self.y = read_idx(paths["labels"]).astype(np.int64)
    if self.x.ndim != 3 or len(self.x) != len(self.y):
      raise ValueError(f"{paths['images']}: images {self.x.shape} do not match labels "
                       f"{self.y.shape} in {paths['labels']}.")
    self.num_classes = int(self.y.max()) + 1
    digest = hashlib.sha256(self.x.tobytes() + self.y.tobytes()).hexdigest()[:16]
    self.identity = f"{self.name} (contents {digest})"

  def __len__(self) -> int:
    return len(self.x)

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    return [self.x[int(i)] for i in indices]

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    return self.y[np.asarray(indices, int)]


class ClassSubset:
  """The examples of some classes of a source, relabelled 0..k-1 in the order given
  (a transfer task: pre-train on some classes, fine-tune on the others). Every
  label is read once, when it is made."""

  def __init__(self, source: Source, classes: Sequence[int]):
    classes = [int(c) for c in classes]
    if len(set(classes)) != len(classes) or not all(0 <= c < source.num_classes for c in classes):
      raise ValueError(f"{source.name}: classes={classes} must be distinct labels in "
                       f"0..{source.num_classes - 1}.")
    labels = np.concatenate([source.labels(np.arange(i, min(i + 4096, len(source))))
                             for i in range(0, len(source), 4096)])
    self.rows = np.flatnonzero(np.isin(labels, classes))
    relabel = np.zeros(source.num_classes, np.int64)
    relabel[classes] = np.arange(len(classes))
    self.y = relabel[labels[self.rows]]
    self.source, self.num_classes = source, len(classes)
    self.name = f"{source.name} classes {classes}"
    self.identity = f"{source.identity} classes {classes}"

  def __len__(self) -> int:
    return len(self.rows)

  def images(self, indices: Sequence[int]) -> list[np.ndarray]:
    return self.source.images(self.rows[np.asarray(indices, int)])

  def labels(self, indices: Sequence[int]) -> np.ndarray:
    return self.y[np.asarray(indices, int)]


def sample(num_available: int, num_examples: int, seed: int, repeat: int) -> np.ndarray:
  """`num_examples` distinct indices; a different draw for every repeat."""
  if num_examples > num_available:
    raise ValueError(f"Asked for {num_examples} examples without replacement but the "
                     f"source has {num_available}; lower num_examples.")
  return np.random.default_rng((seed, repeat)).permutation(num_available)[:num_examples]
