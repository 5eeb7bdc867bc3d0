"""ResNets and ConvNeXts in Hugging Face transformers' layouts: tiny random
models saved by transformers' `save_pretrained`, loaded by us from the folder
with nothing assumed, matching transformers' forward at each stage's output
and at the logits."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import compiled, load_stating_everything
from support import hf_ref
from support.numerics import BIT_ROUNDINGS, assert_close, network
from vitcnn_jax import checkpoints

T = hf_ref.transformers
TOL = network(BIT_ROUNDINGS)
PROCESSOR = dict(image_processor_type="ConvNextImageProcessor", do_resize=True,
                 size={"shortest_edge": 32}, crop_pct=0.875, resample=2, do_normalize=True,
                 image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])

# name -> (model class, config, our last stage's points, what the file shows)
MODELS = {
    "resnet_bottleneck": (T.ResNetForImageClassification,
                          T.ResNetConfig(num_labels=5, embedding_size=8, hidden_sizes=[16, 32, 48],
                                         depths=[1, 2, 1]),
                          ["block1/unit01/out", "block2/unit02/out", "block3/unit01/out"],
                          dict(block="bottleneck", stride_in="3x3", widths=(4, 8, 12))),
    "resnet_v1_basic": (T.ResNetModel,
                        T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[2, 1],
                                       layer_type="basic", downsample_in_bottleneck=True),
                        ["block1/unit02/out", "block2/unit01/out"], dict(block="basic")),
    "resnet_v1_bottleneck": (T.ResNetModel,
                             T.ResNetConfig(embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1],
                                            downsample_in_bottleneck=True),
                             ["block1/unit01/out", "block2/unit01/out"], dict(stride_in="1x1")),
    "convnext": (T.ConvNextForImageClassification,
                 T.ConvNextConfig(num_labels=5, hidden_sizes=[8, 16, 24], depths=[1, 2, 1], num_stages=3),
                 ["stage0/block00/out", "stage1/block01/out", "stage2/block00/out"],
                 dict(layer_scale=True, head_eps=1e-12)),
    "convnextv2": (T.ConvNextV2ForImageClassification,
                   T.ConvNextV2Config(num_labels=5, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                                      layer_norm_eps=1e-6),
                   ["stage0/block00/out", "stage1/block00/out"],
                   dict(grn=True, layer_scale=False, head_eps=1e-6)),
    "dinov3_convnext": (T.DINOv3ConvNextModel, T.DINOv3ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 2]),
                        ["stage0/block00/out", "stage1/block01/out"],
                        dict(layer_scale=True, head_eps=1e-6, widths=(8, 16))),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("hf_cnn")
  models = {name: hf_ref.randomized(cls(config), seed)
            for seed, (name, (cls, config, _, _)) in enumerate(MODELS.items())}
  return {name: (hf_ref.save(model, root / name, PROCESSOR), model) for name, model in models.items()}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_folder_matches_transformers(folders, name, caplog):
  folder, model = folders[name]
  c = load_stating_everything(folder, caplog, MODELS[name][3])
  assert c.model.image_size == 32 and c.policy == "hf_bilinear_crop0.875_imagenet"
  x = np.random.default_rng(4).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  with hf_ref.torch.no_grad():  # BatchNorm's running statistics moved off their init too
    for m in model.modules():
      if isinstance(m, hf_ref.torch.nn.BatchNorm2d):
        m.running_mean.uniform_(-0.2, 0.2)
        m.running_var.uniform_(0.5, 1.5)
  hf_ref.save(model, folder, PROCESSOR)
  c = checkpoints.load(folder)
  ref = hf_ref.run(model, x)
  out, points = compiled(c.model, c.params, x, capture=MODELS[name][2])
  stages = ref.hidden_states[-len(MODELS[name][2]):]  # after the stem's (ResNet, ConvNext)
  for point, hidden in zip(MODELS[name][2], stages):
    hidden = hidden.numpy().transpose(0, 2, 3, 1)
    assert_close(points[point], hidden, TOL * float(np.abs(hidden).max()), f"{name} {point}")
  final = ref.logits if hasattr(ref, "logits") else ref.pooler_output.reshape(2, -1)
  if not hasattr(ref, "logits") and c.model.num_classes is None:
    out = points.get("pre_logits", out)
  final = np.asarray(final)
  assert_close(out, final, TOL * float(np.abs(final).max()), f"{name} output")
