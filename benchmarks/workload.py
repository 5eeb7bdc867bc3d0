"""What every part of a CKA benchmark run shares: the workload (W or the peers'
ResNet-18 shape), its settings, its images and our two networks."""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np

HALF = ((0.5,) * 3, (0.5,) * 3)
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# name -> default images, batch, size and the input normalisation (mean, std on [0, 1]):
# our models' preprocessing policies ("resize": half; ResNet v1: imagenet), checked in ours.step_inputs.
WORKLOADS = {"W": dict(images=256, batch=32, size=224, stats=HALF),
             "resnet18": dict(images=10_000, batch=1_000, size=32, stats=IMAGENET)}
R18_LAYERS = (["conv1"] + [f"layer{s}.{b}.conv{c}" for s in (1, 2, 3, 4) for b in (0, 1) for c in (1, 2)]
              + ["fc"])
R18_CAPTURE = ("root/conv", "block*/unit*/conv1", "block*/unit*/conv2", "logits")  # the same 18 points
R18_CLASSES = 10  # the peers' benchmark: CIFAR-10


@dataclasses.dataclass(frozen=True)
class Setup:
  """What every part of one run shares."""
  workload: str = "W"
  images: int = 256
  batch: int = 32
  size: int = 224
  work: str = os.path.join(tempfile.gettempdir(), "cka_bench")  # weights, CKA matrices, references
  cache: str = ""  # JAX's persistent compilation cache folder ("": none)
  device: str = "cpu"  # torch's device for the peers ("cuda": ours runs on JAX's GPU too)
  reference: bool = True  # the float64 references (False: no error columns)
  second: bool = False  # also time a second call in the same process (a notebook's usual case)

  @property
  def stats(self) -> tuple:
    return WORKLOADS[self.workload]["stats"]

  def path(self, name: str) -> str:
    return os.path.join(self.work, name)


def images(s: Setup) -> np.ndarray:
  return np.random.default_rng(0).integers(0, 256, (s.images, s.size, s.size, 3), dtype=np.uint8)


def r18_file(s: Setup, i: int) -> str:
  """The ResNet-18 workload's network `i` (timm's state dict), which both sides load."""
  return s.path(f"resnet18_{i}.safetensors")


def jax_models(s: Setup):
  """Our two networks as the driver loads them: W's at our random init, or the two
  ResNet-18 read from timm's files."""
  import logging

  from vitcnn_jax import checkpoints
  from vitcnn_jax.models import BiT, ViT, param_trees
  from vitcnn_jax.models.vit import model as vit
  from vitcnn_jax.run import loading
  logging.getLogger("vitcnn_jax").setLevel(logging.ERROR)  # assumed settings of the timm files
  out = []
  if s.workload == "resnet18":
    for i in range(2):
      c = checkpoints.load(r18_file(s, i), resolution=s.size)
      out.append(loading.loaded(f"r18_{i}", c.path, f"ResNet-18 seed {i}", c.model, c.params, R18_CAPTURE))
    return out
  for name, model in (("vit", ViT(num_classes=1000, **vit.decode_variant("B/16"))),
                      ("resnet", BiT(num_classes=1000, width=1, depth=50))):
    params = param_trees.random_params(model, np.zeros((1, 224, 224, 3), np.float32), seed=len(out))
    out.append(loading.loaded(name, "<random init>", name, model, params, "paper"))
  return out
