"""ResNet v1 from an ONNX graph whose weights carry no module paths (tf2onnx,
or any converter): the graph is walked from its input, and each convolution is
placed in the unit its position in the graph implies (stem, then per unit the
shortcut and the branch's 1x1 / 3x3 convs up to the Add), checked by kernel
size, strides and padding. A node that fits nowhere is named in the error.

BatchNorm may be folded into the convs' biases (tf2onnx's `*_fused_bn`) or be
BatchNormalization nodes. The root max-pool's padding is read from its node
(TF's SAME pads (0, 1)); the input size from the graph's input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitcnn_jax.models.formats import onnx as onnx_file
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading
from vitcnn_jax.models.resnet import model as resnet

FORMATS = {"onnx_resnet": "an ONNX graph of a ResNet v1 (e.g. tf2onnx's), its convolutions "
                          "placed by graph order, shape and attributes"}


def detect_graph(flat: dict[str, np.ndarray], graph: onnx_file.Graph) -> str | None:
  """A graph whose first conv is a 7x7/2 root followed by a 3x3/2 max-pool."""
  del flat
  convs = [n for n in graph.nodes if n.op == "Conv"]
  pools = [n for n in graph.nodes if n.op == "MaxPool"]
  if convs and pools and list(convs[0].attrs.get("kernel_shape", ())) == [7, 7] and list(
      pools[0].attrs.get("kernel_shape", ())) == [3, 3]:
    return "onnx_resnet"
  return None


class _Walk:
  """The graph's nodes by the tensors they read and write."""

  def __init__(self, keys: Keys):
    self.keys, self.graph = keys, keys.graph
    self.path = keys.path
    self.bn_eps: set[float] = set()  # the BatchNormalization nodes' epsilons
    self.users: dict[str, list[onnx_file.Node]] = {}
    for n in self.graph.nodes:
      for t in n.inputs:
        self.users.setdefault(t, []).append(n)

  def fail(self, node: onnx_file.Node, why: str) -> CheckpointError:
    """The error for a node the walk could not place."""
    return CheckpointError(f"{self.path}: cannot place node {node.name!r} ({node.op}) in a ResNet v1: "
                     f"{why}. This graph is not one we can map.")

  def next(self, node: onnx_file.Node) -> onnx_file.Node:
    users = self.users.get(node.outputs[0], [])
    if len(users) != 1:
      raise self.fail(node, f"its output feeds {len(users)} nodes, not one")
    return users[0]

  def weight(self, node: onnx_file.Node, i: int) -> np.ndarray:
    name = node.inputs[i] if len(node.inputs) > i else ""
    key = self.graph.renamed.get(name, name)[len(self.keys.prefix):]
    if not self.keys.has(key):
      raise self.fail(node, f"its input {i} ({name or 'absent'}) is not a weight of the file")
    return self.keys.take(key)

  def conv(self, node: onnx_file.Node, p: dict, ours: str, kernel: int, stride: int | None,
           src: dict) -> tuple[onnx_file.Node, int, bool]:
    """Our conv `ours` from Conv `node` (and its BatchNormalization, if one
    follows): (the last node, its stride, whether a BatchNorm node was there)."""
    if node.op != "Conv":
      raise self.fail(node, f"expected the Conv of {ours}")
    a = node.attrs
    pad = (kernel - 1) // 2
    strides = list(a.get("strides", [1, 1]))
    if (list(a.get("kernel_shape", [])) != [kernel, kernel] or a.get("group", 1) != 1
        or list(a.get("dilations", [1, 1])) != [1, 1] or strides[0] != strides[1]
        or list(a.get("pads", [0] * 4)) != [pad] * 4 or (stride and strides[0] != stride)):
      raise self.fail(node, f"{ours} needs a {kernel}x{kernel} conv, stride "
                      f"{stride or 'any'}, padding {pad} on every side, no groups or dilation; "
                      f"the node has {dict(a)}")
    w = self.weight(node, 1)
    p[f"{ours}/kernel"] = w.transpose(2, 3, 1, 0)
    src[f"{ours}/kernel"] = node.inputs[1]
    head, _, leaf = ours.rpartition("/")
    bn = f"{head}/bn{leaf[len('conv'):]}" if head else f"bn{leaf[len('conv'):]}"  # conv2 -> bn2
    nxt = self.users.get(node.outputs[0], [])
    if len(nxt) == 1 and nxt[0].op == "BatchNormalization":
      b = nxt[0]
      for i, name in enumerate(("scale", "bias", "mean", "var"), 1):
        p[f"{bn}/{name}"] = self.weight(b, i)
      if len(node.inputs) > 2 and node.inputs[2]:
        raise self.fail(node, "a conv bias before a BatchNormalization")
      self.bn_eps.add(float(b.attrs.get("epsilon", 1e-5)))
      return b, strides[0], True
    p[f"{ours}/bias"] = self.weight(node, 2)
    return node, strides[0], False

  def relu(self, node: onnx_file.Node) -> onnx_file.Node:
    nxt = self.next(node)
    if nxt.op != "Relu":
      raise self.fail(nxt, f"expected a Relu after {node.name!r}")
    return nxt


def _ends_at_add(w: _Walk, conv: onnx_file.Node) -> bool:
  """Whether `conv` (through its BatchNormalization) feeds an Add alone: a projection."""
  nxt = w.users.get(conv.outputs[0], [])
  if len(nxt) == 1 and nxt[0].op == "BatchNormalization":
    nxt = w.users.get(nxt[0].outputs[0], [])
  return len(nxt) == 1 and nxt[0].op == "Add"


_KERNELS = {3: [1, 3, 1], 2: [3, 3]}  # bottleneck, basic


def _unit(w: _Walk, tensor: str, p: dict, ours: str, src: dict, stride: int
          ) -> tuple[str, list[int], bool]:
  """The unit reading `tensor`: (its output tensor, its branch convs' strides,
  whether BatchNorm nodes were there)."""
  users = w.users.get(tensor, [])
  convs = [n for n in users if n.op == "Conv"]
  proj = [c for c in convs if _ends_at_add(w, c)]
  main = [c for c in convs if not _ends_at_add(w, c)]
  odd = [n for n in users if n.op not in ("Conv", "Add")]
  if odd or len(main) != 1 or len(proj) > 1:
    raise w.fail((odd or convs)[0], f"a unit's input should feed one branch conv, at most one "
                 f"projection conv and the Add; it feeds {[n.name for n in users]}")
  node, strides, kernels, bn = main[0], [], [], False
  for i in (1, 2, 3):
    kernel = node.attrs.get("kernel_shape", [0])[0] if node.op == "Conv" else 0
    last, s, bn_ = w.conv(node, p, f"{ours}/conv{i}", kernel if kernel in (1, 3) else 1, None, src)
    strides.append(s)
    kernels.append(kernel)
    bn |= bn_
    add = w.next(last)
    if add.op == "Add":
      break
    node = w.next(w.relu(last))
  if kernels != _KERNELS.get(len(kernels)):
    raise w.fail(main[0], f"the branch's kernels {kernels} are neither a bottleneck's [1, 3, 1] "
                 "nor a basic unit's [3, 3]")
  if add.op != "Add":
    raise w.fail(add, "a unit's branch has more than three convs")
  if proj:
    last, _, bn_ = w.conv(proj[0], p, f"{ours}/conv_proj", 1, stride, src)
    if w.next(last) is not add:
      raise w.fail(proj[0], "the projection does not reach the branch's Add")
  elif tensor not in add.inputs:
    raise w.fail(add, "the Add sums neither the unit's input nor a projection")
  return w.relu(add).outputs[0], strides, bn


def read(keys: Keys) -> Reading:
  w = _Walk(keys)
  p: dict[str, np.ndarray] = {}
  src: dict[str, str] = {}
  ev: dict[str, str] = {}
  stem = next(n for n in keys.graph.nodes if n.op == "Conv")
  last, _, bn = w.conv(stem, p, "conv_root", 7, 2, src)
  pool = w.next(w.relu(last))
  pads = list(pool.attrs.get("pads", [0] * 4))
  if (pool.op != "MaxPool" or list(pool.attrs.get("kernel_shape", [])) != [3, 3]
      or list(pool.attrs.get("strides", [])) != [2, 2] or pads[:2] != pads[0:1] * 2
      or pads[2:] != pads[2:3] * 2 or not all(0 <= x <= 1 for x in pads)):
    raise w.fail(pool, f"the root needs a 3x3/2 max-pool padded alike on both axes; {pool.attrs}")
  cfg: dict[str, Any] = dict(stem_width=p["conv_root/kernel"].shape[-1],
                             pool_pad=(pads[0], pads[2]))
  ev["stem_width"] = f"node {stem.name} {p['conv_root/kernel'].shape}"
  ev["pool_pad"] = f"node {pool.name}: pads {pads}"
  tensor, depth, widths, kinds, where = pool.outputs[0], [], [], set(), set()
  while any(n.op == "Conv" for n in w.users.get(tensor, [])):
    new_stage = not depth or sum(n.op == "Conv" for n in w.users[tensor]) == 2  # a projection
    b = len(depth) + new_stage
    ours = f"block{b}_unit{1 if new_stage else depth[-1] + 1:02d}"
    stride = 1 if b == 1 or not new_stage else 2
    tensor, strides, bn_ = _unit(w, tensor, p, ours, src, stride)
    bn |= bn_
    kinds.add(len(strides))
    if new_stage:
      depth.append(1)
      widths.append(p[f"{ours}/conv1/kernel"].shape[-1])
    else:
      depth[-1] += 1
    if sum(s != 1 for s in strides) > (stride == 2) or (stride == 2 and 2 not in strides):
      raise CheckpointError(f"{keys.path}: unit {ours} has branch strides {strides}; a ResNet "
                               f"v1 unit downsamples once, by {stride}.")
    if stride == 2 and len(strides) == 3:
      where.add("1x1" if strides[0] == 2 else "3x3")
  if len(kinds) != 1 or len(where) > 1:
    raise CheckpointError(f"{keys.path}: units of mixed kinds ({sorted(kinds)} convs, strides "
                             f"in {sorted(where)}); one ResNet has one kind of unit.")
  (n_convs,) = kinds
  cfg.update(depth=tuple(depth), widths=tuple(widths), batchnorm=bn,
             block="bottleneck" if n_convs == 3 else "basic", stride_in=where.pop() if where else "3x3")
  ev.update(depth="the units the graph's Adds close", widths="each stage's first conv",
            block=f"{n_convs} convs per unit", batchnorm="BatchNormalization nodes" if bn else
            "conv biases (BatchNorm folded)", stride_in="the strided conv of downsampling units")
  _head(w, tensor, p, cfg, ev)
  shape = keys.graph.input_shape
  size = [s for s in shape if isinstance(s, int) and s > 3]
  cfg["image_size"] = size[0] if len(size) == 2 and size[0] == size[1] else 224
  ev["image_size"] = f"the graph's input {shape}"
  if len(w.bn_eps) > 1:
    raise CheckpointError(f"{keys.path}: BatchNormalization epsilons {sorted(w.bn_eps)}; one "
                             "ResNet has one.")
  cfg.update(bn_eps=w.bn_eps.pop() if w.bn_eps else 1e-5, input_order="rgb")
  ev.update(bn_eps="the BatchNormalization nodes' epsilon" if bn else "folded: no epsilon",
            input_order="not in the graph; RGB unless the zoo entry says otherwise")
  return Reading(keys.fmt, cfg, ev, p, ("input_order",), src)


def _head(w: _Walk, tensor: str, p: dict, cfg: dict, ev: dict) -> None:
  """Global average pooling (GlobalAveragePool, ReduceMean or an AveragePool
  over the last map), reshapes, then MatMul + Add or Gemm: our head."""
  node = w.users.get(tensor, [None])[0]
  if node is None:
    cfg["num_classes"], ev["num_classes"] = None, "the graph ends at the last unit"
    return
  if node.op not in ("GlobalAveragePool", "ReduceMean", "AveragePool"):
    raise w.fail(node, "expected global average pooling after the last unit")
  while (node := w.next(node)).op in ("Reshape", "Flatten", "Squeeze"):
    pass
  if node.op == "Gemm":
    k = w.weight(node, 1)
    p["head/kernel"] = k.T if node.attrs.get("transB", 0) else k
    p["head/bias"] = w.weight(node, 2)
  elif node.op == "MatMul":
    p["head/kernel"] = w.weight(node, 1)
    add = w.next(node)
    if add.op != "Add":
      raise w.fail(add, "expected the classifier's bias Add")
    p["head/bias"] = w.weight(add, 1 if add.inputs[0] == node.outputs[0] else 0)
  else:
    raise w.fail(node, "expected the classifier (MatMul or Gemm) after the pooling")
  cfg["num_classes"], ev["num_classes"] = p["head/kernel"].shape[1], f"node {node.name}"


READER = Reader(
    formats=FORMATS,
    policy=resnet.ResNet.default_policy,
    read=read,
    overridable=("input_order",),
    detect_graph=detect_graph,
)
