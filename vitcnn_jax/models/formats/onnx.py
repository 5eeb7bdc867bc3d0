"""ONNX files as a checkpoint container: their weights by name, and the graph
that says what each anonymous weight is. Protobuf parsing only (the `onnx`
package, optional like gcsfs); nothing in the file is executed.

Exporters name weights two ways, and both become the flat names the families'
layouts read:
- torch's exporter names nodes by module path (`/backbone/encoder/layer.0/
  attention/attention/key/MatMul`) and leaves the weights it transposed or
  folded anonymous (`onnx::MatMul_1966`). Each anonymous weight is named after
  the module of the node that consumes it: a Conv's or Gemm's weight and bias
  become that module's `weight` and `bias`, a MatMul's [in, out] matrix its
  torch `weight` (out, in), anything else `<module>.<Op>`.
- converters without module paths (tf2onnx) leave the names they had; a layout
  then places the graph's convolutions by their order, shapes and attributes
  (`Graph.nodes`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from vitcnn_jax.models.formats.base import CheckpointError



@dataclasses.dataclass(frozen=True)
class Node:
  op: str
  name: str
  inputs: tuple[str, ...]  # tensor names; a weight's is its key in the flat arrays
  outputs: tuple[str, ...]
  attrs: dict[str, Any]


@dataclasses.dataclass
class Graph:
  """What the layouts may read besides the weights."""
  nodes: list[Node]
  input_shape: tuple[int | str, ...]  # the first input's, e.g. ('batch', 3, 224, 224)
  producer: str  # e.g. 'pytorch 2.7.0', 'tf2onnx 1.8.4'
  described: dict[str, str]  # flat key -> how the file names it, for messages
  renamed: dict[str, str]  # initializer name -> its flat key, where they differ


# (op, input index) -> the torch parameter it holds; other anonymous weights are `<module>.<Op>`.
_LEAVES = {("MatMul", 1): "weight", ("Conv", 1): "weight", ("Conv", 2): "bias",
           ("Gemm", 1): "weight", ("Gemm", 2): "bias"}


# The tags of ModelProto's fields after ir_version (producer_name, opset_import, graph, ...).
_NEXT_TAGS = {0x12, 0x1a, 0x22, 0x28, 0x32, 0x3a, 0x42, 0x72, 0x7a, 0x82}


def is_onnx(data: bytes) -> bool:
  """A ModelProto starts with field 1, ir_version (tag 0x08, a small positive
  varint), then another of its fields (an empty safetensors file starts 0x08 0x00)."""
  return len(data) > 3 and data[0] == 0x08 and 0 < data[1] < 0x80 and data[2] in _NEXT_TAGS


def _module_of(node_name: str) -> str | None:
  """'/backbone/encoder/layer.0/attention/attention/key/MatMul' ->
  'backbone.encoder.layer.0.attention.attention.key' (torch's exporter's names)."""
  if not node_name.startswith("/"):
    return None
  parts = node_name.strip("/").split("/")[:-1]
  return ".".join(parts) if parts else None


def read(path: str, data: bytes) -> tuple[dict[str, np.ndarray], Graph]:
  """The float weights of an ONNX model, named as the module docstring says, and its graph."""
  try:
    import onnx
    from onnx import numpy_helper
  except ImportError as e:
    raise CheckpointError(f"{path}: an ONNX file; reading it needs the `onnx` package "
                             "(protobuf only): pip install onnx") from e
  try:
    model = onnx.load_model_from_string(data)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
  except Exception as e:  # DecodeError, or a truncated tensor
    raise CheckpointError(f"{path}: not a readable ONNX file ({type(e).__name__}: {e}). It "
                             "is truncated or corrupt: download it again.") from e
  g = model.graph
  if not g.node or not weights:
    raise CheckpointError(f"{path}: the ONNX file holds no graph or no weights "
                             f"({len(g.node)} nodes, {len(weights)} initializers).")
  # An Identity of a weight (torch's exporter shares equal weights so) is that weight.
  same = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity" and n.input[0] in weights}
  nodes = [Node(n.op_type, n.name, tuple(same.get(i, i) for i in n.input), tuple(n.output),
                {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute
                 if a.type != onnx.AttributeProto.TENSOR})
           for n in g.node if n.output[0] not in same]
  first_user: dict[str, Node] = {}  # each tensor's first reader, found in one pass
  for n in reversed(nodes):
    first_user.update((t, n) for t in n.inputs)
  flat, described, renamed = {}, {}, {}
  for name, w in weights.items():
    if w.dtype.kind != "f":  # shapes, axes and indices: constants of the graph, not weights
      continue
    key = name
    user = first_user.get(name)
    module = _module_of(user.name) if user and name.startswith("onnx::") else None
    if module:
      op, at = user.op, user.inputs.index(name)
      leaf = _LEAVES.get((op, at), op)
      key, w = f"{module}.{leaf}", (w.T if op == "MatMul" and w.ndim == 2 else w)
      described[key] = f"{name} (input {at} of node {user.name})"
      renamed[name] = key
    if key in flat:
      raise CheckpointError(f"{path}: two weights map to {key!r} ({described.get(key, key)} "
                               f"and {name}); this export is not one we can read.")
    flat[key] = np.asarray(w, np.float32)
  inputs = [i for i in g.input if i.name not in weights]  # old exporters list weights too
  dims = inputs[0].type.tensor_type.shape.dim if inputs else []
  shape = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims)
  return flat, Graph(nodes, shape, f"{model.producer_name} {model.producer_version}".strip(),
                     described, renamed)
