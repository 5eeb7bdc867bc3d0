"""Data sources on tiny data made here: tfds (mock), image folders, IDX files."""

from __future__ import annotations

import os

import numpy as np
import pytest

from support.idx_files import striped, write_idx
from vitcnn_jax.inputs import data
from vitcnn_jax.inputs import datasets
from vitcnn_jax.inputs import folders
from vitcnn_jax.inputs import packaged
from vitcnn_jax.inputs import preprocess
from vitcnn_jax.inputs import zoo
from vitcnn_jax.inputs.data import SyntheticSource
from vitcnn_jax.inputs.datasets import IdxSource
from vitcnn_jax.inputs.folders import FolderSource
from vitcnn_jax.run import loading
from vitcnn_jax.run import pipeline


def test_idx_source_shapes_labels_and_gzip(tmp_path):
  images, labels = striped(30)
  write_idx(tmp_path, "train", images, labels)
  write_idx(tmp_path, "t10k", images[:5], labels[:5], gz=False)
  src = IdxSource(str(tmp_path), "train")
  assert len(src) == 30 and src.num_classes == int(labels.max()) + 1
  got = src.images([3, 7])
  assert got[0].shape == (28, 28) and got[0].dtype == np.uint8
  np.testing.assert_array_equal(got[1], images[7])
  np.testing.assert_array_equal(src.labels([3, 7]), labels[[3, 7]])
  assert len(IdxSource(str(tmp_path), "t10k")) == 5


def test_idx_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.*'t10k'"):
    IdxSource(str(tmp_path), "train")
  with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
    IdxSource(datasets.FASHION_MNIST_DIR, "nosplit")
  images, labels = striped(10)
  write_idx(tmp_path, "train", images, labels, gz=False)
  path = tmp_path / "train-images-idx3-ubyte"
  path.write_bytes(path.read_bytes()[:-100])
  with pytest.raises(ValueError, match="truncated"):
    IdxSource(str(tmp_path), "train")
  path.write_bytes(b"garbage!" * 4)
  with pytest.raises(ValueError, match="not a uint8 IDX file"):
    IdxSource(str(tmp_path), "train")


def test_folder_source_class_subfolders_and_flat(tmp_path):
  from PIL import Image
  rng = np.random.default_rng(0)
  for c in ("cat", "dog"):
    os.makedirs(tmp_path / "cls" / c)
    for i in range(3):
      Image.fromarray(rng.integers(0, 256, (20 + i, 30, 3), dtype=np.uint8)).save(tmp_path / "cls" / c / f"{i}.png")
  src = FolderSource(str(tmp_path / "cls"))
  assert len(src) == 6 and src.num_classes == 2
  assert list(src.labels(range(6))) == [0, 0, 0, 1, 1, 1]
  imgs = src.images([0, 2])
  assert imgs[0].shape == (20, 30, 3) and imgs[1].shape == (22, 30, 3) and imgs[0].dtype == np.uint8
  os.makedirs(tmp_path / "flat")
  Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(tmp_path / "flat" / "g.png")
  flat = FolderSource(str(tmp_path / "flat"))
  assert len(flat) == 1 and flat.images([0])[0].shape == (8, 8, 3)


def test_flat_folder_with_a_labels_file(tmp_path):
  from PIL import Image
  names = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in (3, 1, 2)]
  for n in names:
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / n, format="JPEG")
  (tmp_path / "one_per_line.txt").write_text("n02\nn01\nn02\n")  # in sorted file order
  (tmp_path / "pairs.txt").write_text("ILSVRC2012_val_00000002 7\nILSVRC2012_val_00000001.JPEG 3\n"
                                      "ILSVRC2012_val_00000003 0\n")
  src = FolderSource(str(tmp_path), str(tmp_path / "one_per_line.txt"))
  assert [os.path.basename(f) for f, _ in src.files] == sorted(names)
  assert list(src.labels([0, 1, 2])) == [1, 0, 1] and src.num_classes == 2  # n01 < n02
  src = FolderSource(str(tmp_path), str(tmp_path / "pairs.txt"))
  assert list(src.labels([0, 1, 2])) == [3, 7, 0] and src.num_classes == 8
  (tmp_path / "short.txt").write_text("n01\nn02\n")
  with pytest.raises(ValueError, match="2 labels for 3 images"):
    FolderSource(str(tmp_path), str(tmp_path / "short.txt"))
  (tmp_path / "partial.txt").write_text("ILSVRC2012_val_00000002 7\n")
  with pytest.raises(ValueError, match=r"no label for 2 of 3 images.*00000001"):
    FolderSource(str(tmp_path), str(tmp_path / "partial.txt"))


def test_imagenet_validation_labels_bundled_with_tfds():
  """The flat ILSVRC2012 validation folder gets tfds's own labels (no TensorFlow)."""
  names = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 50_001)]
  text = folders.read_labels(folders.imagenet_validation_labels(), names)
  ids = folders.label_ids(text)
  assert text[0] == "n01751748" and ids[0] == 65  # the first validation image: a sea snake
  import tensorflow_datasets as tfds
  builder = tfds.builder("imagenet2012")
  assert builder.info.features["label"].names == sorted(set(text))  # tfds's numbering


def test_folder_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="is not a directory"):
    FolderSource(str(tmp_path / "missing"))
  os.makedirs(tmp_path / "empty")
  with pytest.raises(FileNotFoundError, match="no images"):
    FolderSource(str(tmp_path / "empty"))
  os.makedirs(tmp_path / "bad")
  (tmp_path / "bad" / "x.png").write_bytes(b"not a png")
  src = FolderSource(str(tmp_path / "bad"))
  with pytest.raises(ValueError, match=r"x\.png: unreadable image"):
    src.images([0])


def test_tfds_array_record_prepared_without_tensorflow(tmp_path):
  """A dataset prepared by tfds as array_record, read back through the config."""
  from support.tiny_tfds import tiny_tfds_dataset_builder as tiny
  tiny.Builder(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  src = pipeline.make_source(__import__("ml_collections").ConfigDict(
      dict(source="tfds", name="tiny_tfds", split="test", data_dir=str(tmp_path),
           image_key="image", label_key="label")))
  assert len(src) == tiny.NUM_EXAMPLES and src.num_classes == 3
  # tfds shuffles records by key: find each example's key from its image.
  keys = [next(k for k in range(tiny.NUM_EXAMPLES) if np.array_equal(im, tiny.image(k)))
          for im in src.images(range(len(src)))]
  assert sorted(keys) == list(range(tiny.NUM_EXAMPLES))
  assert src.labels(range(len(src))).tolist() == [k % 3 for k in keys]
  with pytest.raises(KeyError, match="no split 'train'.*'test'"):
    datasets.TfdsSource("tiny_tfds", "train", str(tmp_path))


def test_tfds_missing_dataset_says_how_to_prepare(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"not prepared.*tfds build imagenet2012 --file_format=array_record"):
    datasets.TfdsSource("imagenet2012", "validation", str(tmp_path))
  assert not (tmp_path / "downloads").exists()  # nothing started downloading


def test_sampling_without_replacement_deterministic_and_per_repeat():
  a = data.sample(100, 40, seed=3, repeat=0)
  assert len(set(a)) == 40 and a.max() < 100
  np.testing.assert_array_equal(a, data.sample(100, 40, seed=3, repeat=0))
  assert not np.array_equal(a, data.sample(100, 40, seed=3, repeat=1))
  with pytest.raises(ValueError, match="source has 100"):
    data.sample(100, 101, 0, 0)


def test_synthetic_is_deterministic_per_index():
  s = SyntheticSource(10, 16, seed=1)
  np.testing.assert_array_equal(s.images([4])[0], SyntheticSource(10, 16, seed=1).images([4])[0])
  assert not np.array_equal(s.images([4])[0], s.images([5])[0])


class _Recorder:
  """A source that records which indices it was asked for."""
  name, num_classes = "recorder", 10

  def __init__(self, n):
    self.n, self.asked = n, []

  def __len__(self):
    return self.n

  def images(self, indices):
    self.asked += [int(i) for i in indices]
    return [np.full((8, 8, 3), int(i) % 256, np.uint8) for i in indices]

  def labels(self, indices):
    return np.zeros(len(indices), int)


def test_each_process_loads_only_its_devices_minibatches(monkeypatch):
  """2 processes x 2 local devices, minibatches of 4: step 0 covers minibatches 0-3."""
  indices = np.arange(100, 130)  # 30 examples: 7 minibatches of 4 and one of 2
  model = loading.Loaded("vit", "", "m", type("M", (), {"image_size": 8})(), None, [], "resize")
  monkeypatch.setattr(pipeline.jax, "local_device_count", lambda: 2)
  monkeypatch.setattr(pipeline.jax, "device_count", lambda: 4)
  seen = {}
  for p in (0, 1):
    monkeypatch.setattr(pipeline.jax, "process_index", lambda p=p: p)
    src = _Recorder(200)
    for step in (0, 1):
      imgs, mask, total, _, _ = pipeline._local_step(src, indices, [model], 4, step)
      assert imgs[0].shape == (8, 8, 8, 3)
      seen[(p, step)] = (list(src.asked), mask.tolist(), total)
      src.asked.clear()
  assert seen[(0, 0)][0] == list(range(100, 108))  # minibatches 0, 1
  assert seen[(1, 0)][0] == list(range(108, 116))  # minibatches 2, 3
  assert seen[(0, 1)][0] == list(range(116, 124))  # minibatches 4, 5
  assert seen[(1, 1)][0] == list(range(124, 130))  # minibatch 6 and the partial 7th (2 rows)
  assert seen[(1, 1)][1] == [1.0] * 6 + [0.0] * 2
  assert seen[(0, 0)][2] == 16 and seen[(1, 1)][2] == 14


def test_real_fashion_mnist_from_debian():
  """The offline dataset the demo uses (installed by `make test` / `make demo`)."""
  if not os.path.isdir(datasets.FASHION_MNIST_DIR) and not os.environ.get("CI"):
    pytest.skip("dataset-fashion-mnist is not installed")
  train, test = IdxSource(datasets.FASHION_MNIST_DIR, "train"), IdxSource(datasets.FASHION_MNIST_DIR, "t10k")
  assert (len(train), len(test), train.num_classes) == (60000, 10000, 10)
  assert np.bincount(train.labels(range(60000))).tolist() == [6000] * 10
  assert train.images([0])[0].shape == (28, 28)


def test_photo_crops_are_seeded_multiscale_crops_labelled_by_photograph(tmp_path):
  from PIL import Image
  rng = np.random.default_rng(0)
  for i, shape in enumerate([(100, 150), (120, 90), (64, 64)]):
    Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)).save(tmp_path / f"p{i}.png")
  s = folders.PhotoCrops(str(tmp_path), 40, size=32, seed=1)
  assert (len(s), s.num_classes) == (40, 3) and data.labels_are(s) == "photographs"
  np.testing.assert_array_equal(s.labels(range(7)), [0, 1, 2, 0, 1, 2, 0])
  a, b = s.images([4, 4])
  assert a.shape == (32, 32, 3) and a.dtype == np.uint8 and (a == b).all()
  # Crop 0 is the whole shorter side of photograph 0 (scale 1.0): rows 0..99, a seeded column.
  whole = np.asarray(Image.open(tmp_path / "p0.png"))
  cols = [whole[:, c:c + 100] for c in range(51)]
  ref = [np.clip(np.round(preprocess.resize(c, (32, 32), "area")), 0, 255) for c in cols]
  assert any((s.images([0])[0] == r).all() for r in ref)
  assert not (s.images([3])[0] == s.images([0])[0]).all()  # another scale of the same photograph
  assert folders.PhotoCrops(str(tmp_path), 40, size=32, seed=2).identity != s.identity
  with pytest.raises(IndexError, match="out of range"):
    s.images([40])


def test_photo_crops_of_class_folders_are_labelled_by_class(tmp_path):
  """Photographs in class sub-folders: each crop's label is its photograph's class
  (what a probe must generalise across photographs), not the photograph."""
  from PIL import Image
  rng = np.random.default_rng(0)
  for c, count in (("cats", 2), ("dogs", 3)):
    (tmp_path / c).mkdir()
    for i in range(count):
      Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(tmp_path / c / f"{i}.png")
  s = folders.PhotoCrops(str(tmp_path), 20, size=16)
  assert s.num_classes == 2 and "5 photographs in 2 classes" in s.name and data.labels_are(s) == "classes"
  np.testing.assert_array_equal(s.labels(range(7)), [0, 0, 1, 1, 1, 0, 0])
  cfg = zoo.data_spec("photos", num_examples=20, path=str(tmp_path), crop=16)  # --config.data.path=DIR
  assert pipeline.make_source(cfg).labels([4]).tolist() == [1]


def test_the_offline_photographs_as_a_configured_source():
  s = pipeline.make_source(zoo.data_spec("photos", num_examples=30))
  assert (len(s), s.num_classes) == (30, len(packaged.PHOTOS))
  assert s.images([0])[0].shape == (256, 256, 3)


def test_a_photograph_too_small_to_crop_is_named(tmp_path):
  from PIL import Image
  rng = np.random.default_rng(0)
  Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(tmp_path / "big.png")
  Image.fromarray(rng.integers(0, 256, (3, 3, 3), dtype=np.uint8)).save(tmp_path / "tiny.png")
  s = folders.PhotoCrops(str(tmp_path), 4, size=32)
  assert s.images([0])[0].shape == (32, 32, 3)  # big.png
  with pytest.raises(ValueError, match=r"tiny\.png: a photograph of 3x3 px; crops need its shorter side at least 4"):
    s.images([1])
