"""ViTs in Hugging Face transformers' layouts, as `save_pretrained` writes them
and the hub holds them: a folder's `model.safetensors` (or shards) with its
`config.json`, a bare state dict, or a torch ONNX export (weights named by
`formats/onnx.py`). Where each model keeps each piece: `transformers_layouts.py`.

The architecture's numbers come from the tensors; what tensors cannot say
(heads, activation, LayerNorm eps, the evaluation resolution) from config.json,
with transformers' defaults of its config class for keys it leaves out, and
only without a config.json from those defaults, reported as assumed. The text
tower and logit scale of a two-tower file are left out. A position embedding
is resized to the input's grid as transformers does on every forward (torch's
bicubic; antialiased for DINOv2 with registers), once at load time here.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models.formats import hf_folder
from vitcnn_jax.models.formats import torch_layout
from vitcnn_jax.models.formats.base import CheckpointError, Keys, Reader, Reading, log
from vitcnn_jax.models.formats.hf_config import HfConfig
from vitcnn_jax.models.vit import resize
from vitcnn_jax.models.vit import torch_pieces
from vitcnn_jax.models.vit.model import ATTN
from vitcnn_jax.models.vit.transformers_layouts import LAYOUTS, MODEL_TYPES, Layout

FORMATS = {
    "hf_vit": "Hugging Face transformers' ViTModel / ViTForImageClassification (google/vit-*)",
    "hf_dinov2": "Hugging Face transformers' Dinov2Model, Dinov2WithRegistersModel (and their "
                 "classifiers), also as a torch ONNX export",
    "hf_clip": "the vision tower of a Hugging Face transformers CLIPModel / CLIPVisionModel",
    "hf_siglip": "the vision tower of a Hugging Face transformers SiglipModel / "
                 "SiglipVisionModel (SigLIP, SigLIP 2 at a fixed resolution)",
    "hf_siglip2": "the vision tower of a Hugging Face transformers Siglip2Model / "
                  "Siglip2VisionModel (SigLIP 2 NaFlex, run on one square grid)",
    "hf_dinov3": "Hugging Face transformers' DINOv3ViTModel (facebook/dinov3-vit*: rotary "
                 "embeddings, registers, layer scale)",
}
_GELUS = {"gelu": "exact", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu_fast": "tanh",
          "quick_gelu": "quick"}


def _wrapper(flat: dict[str, np.ndarray], layout: Layout) -> str | None:
  """The prefix under which `layout`'s model sits in `flat`, if it does."""
  norm = layout.layer.format(0) + layout.names["LayerNorm_0"]
  for w in layout.wrappers:
    if f"{w}{layout.patch}.weight" in flat and f"{w}{norm}.weight" in flat:
      return w
  return None


def detect(flat: dict[str, np.ndarray]) -> str | None:
  for fmt, layout in LAYOUTS.items():
    w = _wrapper(flat, layout)
    if w is None:
      continue
    if fmt == "hf_clip" and not any(k.endswith(layout.cls) for k in flat):
      continue  # no class embedding: SigLIP's tower
    if fmt.startswith("hf_siglip") and (flat[f"{w}{layout.patch}.weight"].ndim == 2) != (
        fmt == "hf_siglip2"):
      continue  # a conv (SigLIP) or a Linear (NaFlex) patch embedding
    return fmt
  return None


def _model_type(meta: hf_folder.Meta, layout: Layout) -> str | None:
  """config.json's model_type, refused where it names a model we do not read: its
  settings (heads, activation, eps) would be read under keys that mean other things."""
  model_type = meta.config.get("model_type")
  if model_type is None or model_type in MODEL_TYPES:
    return model_type
  fits = [t for t, (fmt, _) in MODEL_TYPES.items() if LAYOUTS[fmt] is layout]
  raise CheckpointError(
      f"{os.path.join(meta.folder, hf_folder.CONFIG)}: model_type={model_type!r} is not a ViT of "
      f"transformers we read (we read model_type {', '.join(sorted(MODEL_TYPES))}). The "
      f"weights look like a {layout.upstream.removesuffix('Config')} model's: if they are one, "
      f"set model_type to {' or '.join(map(repr, fits))} in that config.json; if not, convert "
      "the model to one of those types first.")


def _config(keys: Keys, layout: Layout) -> HfConfig:
  """The vision settings of config.json (its section of a two-tower model's), with
  `layout`'s config class's defaults."""
  section = MODEL_TYPES.get(_model_type(keys.meta, layout), (None, None))[1] if keys.meta else None
  return HfConfig(keys, layout.upstream, layout.defaults, section)


def _gelu(name: str) -> str:
  if name not in _GELUS:
    raise CheckpointError(f"config.json hidden_act={name!r} is not an activation our ViT has "
                             f"({sorted(_GELUS)}).")
  return _GELUS[name]


def _silu(name: str) -> str:
  """A gated MLP's activation: SiLU, as our SwiGLU (its GELU field then unused)."""
  if name != "silu":
    raise CheckpointError(f"config.json hidden_act={name!r} in a gated MLP; our SwiGLU gates "
                             "with SiLU.")
  return "exact"


def _position_embedding(keys: Keys, name: str) -> tuple[np.ndarray, str]:
  """(1, T, D) and its evidence; an ONNX export splits DINOv2's into a class row
  (`embeddings.Concat`) and the grid rows (`embeddings.Reshape`)."""
  if keys.has(name) or not keys.has("embeddings.Reshape"):
    pe = keys.take(name)
    return pe.reshape(1, -1, pe.shape[-1]), keys.shape(name)
  cls, grid = keys.take("embeddings.Concat"), keys.take("embeddings.Reshape")
  if cls.shape[-1] != grid.shape[-1] or cls.size != cls.shape[-1]:
    raise CheckpointError(f"{keys.path}: the class row {keys.shape('embeddings.Concat')} and "
                             f"the grid rows {keys.shape('embeddings.Reshape')} of the position "
                             "embedding do not fit together.")
  pe = np.concatenate([cls.reshape(1, 1, -1), grid.reshape(1, -1, grid.shape[-1])], axis=1)
  return pe, f"{keys.shape('embeddings.Concat')} + {keys.shape('embeddings.Reshape')}"


def _input_size(keys: Keys, s: HfConfig, cfg: dict, ev: dict, grid: int) -> None:
  """The resolution the model is evaluated at: an ONNX graph's input, the image
  processor's output size, else config.json's image_size (the embedding's grid
  without one)."""
  shape = keys.graph.input_shape if keys.graph else ()
  crop = keys.meta.input_size() if keys.meta else None
  if len(shape) == 4 and isinstance(shape[2], int) and shape[2] == shape[3] and shape[2] > 0:
    cfg["image_size"], ev["image_size"] = shape[2], f"the ONNX graph's input {shape}"
  elif crop:
    cfg["image_size"], ev["image_size"] = crop
  elif (s.section is not None and "image_size" in s.defaults) or not grid:  # rotary: no grid
    s.get("image_size", "image_size", cfg, ev)
  else:
    cfg["image_size"] = grid * cfg["patch_size"]
    ev["image_size"] = f"the position embedding's {grid}x{grid} grid"


def _names(keys: Keys, first: str, layout: Layout) -> dict[str, str]:
  """The block's names in this file (`first`: layer 0's prefix): those
  save_pretrained writes, or transformers 5's module paths, which its ONNX exports
  name weights by."""
  if layout.modules and keys.has(f"{first}{layout.modules[f'{ATTN}/query']}.weight"):
    return layout.modules
  return layout.names


def _blocks(keys: Keys, p: dict, cfg: dict, ev: dict, base: str, layout: Layout) -> None:
  layer = base + layout.layer
  idx = keys.indices("^" + layer.replace(".", r"\.").format(r"(\d+)"))
  if not idx or idx[0] != 0:
    raise CheckpointError(f"{keys.path}: no {layer.format(0)}* weights found.")
  cfg["depth"], ev["depth"] = len(idx), f"{layer.format('0')}..{idx[-1]}"
  d, h, kinds, n = cfg["width"], cfg["num_heads"], set(), _names(keys, layer.format(0), layout)
  scaled = keys.has(f"{layer.format(0)}layer_scale1.lambda1")
  cfg["layer_scale"] = scaled
  ev["layer_scale"] = f"{layer.format(0)}layer_scale1.lambda1" + ("" if scaled else ": absent")
  for i in idx:
    src, ours = layer.format(i), f"Transformer/encoderblock_{i}"
    for q in ("query", "key", "value", "out"):
      lin = f"{src}{n[f'{ATTN}/{q}']}.weight"
      if keys.has(lin) and keys.flat[lin].shape != (d, d):
        raise CheckpointError(f"{keys.path}: {keys.shape(lin)} should be ({d}, {d}), the "
                                 "width read from the patch embedding.")
    torch_layout.take_torch_norm(keys, p, src + n["LayerNorm_0"], f"{ours}/LayerNorm_0")
    torch_pieces.attention(keys, p, f"{ours}/{ATTN}", h,
                           [(src + n[f"{ATTN}/{q}"], slice(None)) for q in ("query", "key", "value")],
                           src + n[f"{ATTN}/out"])
    torch_layout.take_torch_norm(keys, p, src + n["LayerNorm_1"], f"{ours}/LayerNorm_1")
    if keys.has(f"{src}mlp.gate_proj.weight"):  # DINOv3's gated MLP: silu(gate) * up
      kinds.add((torch_pieces.gated_mlp(keys, p, f"{src}mlp.gate_proj", f"{src}mlp.up_proj",
                                        f"{src}mlp.down_proj", f"{ours}/MlpBlock_0"), "swiglu"))
    else:  # DINOv2's SwiGLU, weights_in twice as wide (silu(x1) * x2, as ours), or a plain MLP
      fc = (("mlp.weights_in", "mlp.weights_out") if keys.has(f"{src}mlp.weights_in.weight")
            else (n["MlpBlock_0/Dense_0"], n["MlpBlock_0/Dense_1"]))
      kinds.add(torch_pieces.mlp(keys, p, src + fc[0], src + fc[1], f"{ours}/MlpBlock_0"))
    if scaled:
      p[f"{ours}/ls1"] = keys.take(f"{src}layer_scale1.lambda1")
      p[f"{ours}/ls2"] = keys.take(f"{src}layer_scale2.lambda1")
  if len(kinds) > 1:
    raise CheckpointError(f"{keys.path}: the layers' MLPs differ ({sorted(kinds)}).")
  (cfg["mlp_dim"], cfg["mlp"]), = kinds
  fc2 = next(k for k in keys.flat if k.startswith(layer.format(0)) and k.endswith(
      (n["MlpBlock_0/Dense_1"] + ".weight", "mlp.weights_out.weight", "mlp.down_proj.weight")))
  ev["mlp_dim"] = ev["mlp"] = keys.shape(fc2)


def _map_head(keys: Keys, p: dict, cfg: dict, head: str) -> None:
  """SigLIP's attention-pooling head (torch's MultiheadAttention, fused in_proj)."""
  d, h = cfg["width"], cfg["num_heads"]
  probe = keys.take(f"{head}.probe")
  if probe.shape != (1, 1, d):
    raise CheckpointError(f"{keys.path}: {keys.shape(head + '.probe')} should be (1, 1, {d}).")
  p["MAPHead_0/probe"] = probe
  w, b = keys.take(f"{head}.attention.in_proj_weight"), keys.take(f"{head}.attention.in_proj_bias")
  if w.shape != (3 * d, d):
    raise CheckpointError(f"{keys.path}: {keys.shape(head + '.attention.in_proj_weight')} "
                             f"should be ({3 * d}, {d}).")
  ours = f"MAPHead_0/{ATTN}"
  for j, q in enumerate(("query", "key", "value")):
    rows = slice(j * d, (j + 1) * d)
    p[f"{ours}/{q}/kernel"] = w[rows].T.reshape(d, h, d // h)
    p[f"{ours}/{q}/bias"] = b[rows].reshape(h, d // h)
  w, b = torch_layout.take_torch_linear(keys, f"{head}.attention.out_proj")
  p[f"{ours}/out/kernel"], p[f"{ours}/out/bias"] = w.reshape(h, d // h, d), b
  torch_layout.take_torch_norm(keys, p, f"{head}.layernorm", "MAPHead_0/LayerNorm_0")
  if torch_pieces.mlp(keys, p, f"{head}.mlp.fc1", f"{head}.mlp.fc2",
                      "MAPHead_0/MlpBlock_0") != (cfg["mlp_dim"], "gelu"):
    raise CheckpointError(f"{keys.path}: {keys.shape(head + '.mlp.fc1.weight')} differs "
                             "from the layers' MLP; our MAP head shares their width.")


def _head(keys: Keys, p: dict, cfg: dict, ev: dict, s: HfConfig, fmt: str, base: str) -> None:
  """Pooling and the classifier (or projection) of each layout's models."""
  cfg.update(fc_norm=False, representation_size=None, num_classes=None, head_bias=True)
  ev["num_classes"] = "no classifier in the file"
  if fmt.startswith("hf_siglip"):
    has_head = keys.has(f"{base}head.probe")
    cfg["pool"] = "map" if has_head else "gap"
    ev["pool"] = f"{base}head.probe" if has_head else f"no {base}head: the tokens' mean"
    if has_head:
      _map_head(keys, p, cfg, f"{base}head")
    return
  cfg["pool"], ev["pool"] = "token", "the class token's final state (the model's pooled output)"
  for name in ("classifier", "visual_projection"):
    if keys.has(f"{name}.weight"):
      w, b = torch_layout.take_torch_linear(keys, name, bias=False)
      p["head/kernel"] = w
      if b is not None:
        p["head/bias"] = b
      cfg["head_bias"], cfg["num_classes"] = b is not None, w.shape[1]
      ev["num_classes"] = keys.shape(f"{name}.weight")
      if w.shape[0] == 2 * cfg["width"]:  # DINOv2's classifier: [class token, patch tokens' mean]
        cfg["pool"], ev["pool"] = "token_gap", keys.shape(f"{name}.weight")
  if keys.has("pooler.dense.weight"):  # ViTModel's pooler: tanh(dense(class token))
    act = s.get("pooler_act", "pooler_act", {}, {})
    if act != "tanh":
      raise CheckpointError(f"{keys.path}: pooler_act={act!r}; our pre_logits is tanh.")
    w, b = torch_layout.take_torch_linear(keys, "pooler.dense")
    p["pre_logits/kernel"], p["pre_logits/bias"] = w, b
    cfg["representation_size"], ev["representation_size"] = w.shape[1], keys.shape("pooler.dense.weight")


def _patch_embedding(keys: Keys, p: dict, cfg: dict, ev: dict, name: str) -> None:
  """The patch embedding's conv (or NaFlex's Linear over flattened patches, the
  same map): the width and the patch size."""
  w = keys.take(f"{name}.weight")
  if w.ndim == 2:  # NaFlex: (width, patch * patch * 3), each patch flattened (row, column, channel)
    side = math.isqrt(w.shape[1] // 3)
    if 3 * side * side != w.shape[1]:
      raise CheckpointError(f"{keys.path}: {keys.shape(name + '.weight')} is not a Linear over "
                               "square RGB patches (width, patch * patch * 3).")
    w = w.reshape(w.shape[0], side, side, 3).transpose(0, 3, 1, 2)
  if w.ndim != 4 or w.shape[1] != 3 or w.shape[2] != w.shape[3]:
    raise CheckpointError(f"{keys.path}: {keys.shape(name + '.weight')} is not a "
                             "(width, 3, patch, patch) convolution.")
  p["embedding/kernel"] = w.transpose(2, 3, 1, 0)
  cfg["patch_bias"] = keys.has(f"{name}.bias")
  if cfg["patch_bias"]:
    p["embedding/bias"] = keys.take(f"{name}.bias")
  ev["patch_bias"] = f"{name}.bias" + ("" if cfg["patch_bias"] else ": absent")
  cfg["width"] = w.shape[0]
  cfg["patch_size"] = w.shape[2]
  ev["width"] = ev["patch_size"] = keys.shape(f"{name}.weight")


def _tokens(keys: Keys, p: dict, cfg: dict, ev: dict, s: HfConfig, base: str,
            layout: Layout) -> None:
  """The class and register tokens, the position embedding (the class token's row
  folded into the token, as ours keeps it) or the rotary one, and the resolution."""
  d = cfg["width"]
  cfg["class_token"] = layout.cls is not None
  cls = keys.take(base + layout.cls).reshape(1, 1, -1) if layout.cls else None
  if cls is not None:
    ev["class_token"] = keys.shape(base + layout.cls)
  cfg["num_registers"], ev["num_registers"] = 0, "no embeddings.register_tokens"
  if keys.has(f"{base}embeddings.register_tokens"):  # after the class token, no position embedding
    reg = keys.take(f"{base}embeddings.register_tokens")
    if reg.shape[1]:  # DINOv3 keeps an empty (1, 0, D) one where it has none
      p["reg"] = reg
    cfg["num_registers"] = reg.shape[1]
    ev["num_registers"] = keys.shape(f"{base}embeddings.register_tokens")
  if layout.pos is None:  # rotary embeddings only, computed for the grid in use
    p["cls"], cfg["posemb"], cfg["rope"] = cls, "none", layout.rope
    ev["posemb"] = ev["rope"] = f"{layout.upstream}: rotary embeddings, no position embedding"
    s.get("rope_theta", "rope_theta", cfg, ev, float)
    _input_size(keys, s, cfg, ev, 0)
    return
  pe, pe_ev = _position_embedding(keys, base + layout.pos)
  if cls is not None:
    if cls.shape[-1] != d or pe.shape[-1] != d:
      raise CheckpointError(f"{keys.path}: {keys.shape(base + layout.cls)} and the position "
                               f"embedding ({pe_ev}) should have width {d}.")
    p["cls"], pe = cls + pe[:, :1], pe[:, 1:]
  grid = math.isqrt(pe.shape[1])
  if grid * grid != pe.shape[1] or pe.shape[-1] != d:
    raise CheckpointError(f"{keys.path}: a position embedding of {pe.shape} ({pe_ev}) is not "
                             f"{'a class row and ' * bool(layout.cls)}a square grid of width {d}.")
  p["pos_embedding"] = pe
  cfg["posemb"], ev["posemb"] = "learn", pe_ev
  _input_size(keys, s, cfg, ev, grid)


def read(keys: Keys) -> Reading:
  fmt = keys.fmt
  layout = LAYOUTS[fmt]
  base = _wrapper(keys.flat, layout) or ""
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  s = _config(keys, layout)
  for prefix in layout.dropped:
    left = [k for k in keys.flat if k.startswith(prefix)]
    keys.used.update(left)
    if left:
      log.info("%s: left out %d tensor(s) of %s* (not the vision tower).", keys.path, len(left), prefix)
  _patch_embedding(keys, p, cfg, ev, base + layout.patch)
  d = cfg["width"]
  if s.section is None:
    h = torch_pieces.usual_heads(d)
    s.assume("num_heads", cfg, ev, h, f"not in the weights and no config.json; {h} for width {d} "
             "(published models)")
  else:
    s.get("num_heads", "num_attention_heads", cfg, ev)
  # DINOv3's gated MLP applies hidden_act; DINOv2's SwiGLU (gate_proj in transformers 5) SiLU always
  gated = fmt == "hf_dinov3" and keys.has(f"{base}{layout.layer.format(0)}mlp.gate_proj.weight")
  s.get("gelu", "hidden_act", cfg, ev, _silu if gated else _gelu)
  s.get("ln_eps", "layer_norm_eps", cfg, ev, float)
  if keys.has(f"{base}embeddings.mask_token"):  # replaces masked patches in pretraining only
    keys.take(f"{base}embeddings.mask_token")
  _blocks(keys, p, cfg, ev, base, layout)
  s.agrees({"hidden_size": cfg["width"], "num_hidden_layers": cfg["depth"],
            "patch_size": cfg["patch_size"]}, keys.path)
  torch_layout.take_torch_norm(keys, p, base + layout.final, "Transformer/encoder_norm")
  cfg["pre_norm"] = layout.pre_norm is not None
  if layout.pre_norm:
    torch_layout.take_torch_norm(keys, p, base + layout.pre_norm, "norm_pre")
    ev["pre_norm"] = keys.shape(f"{base}{layout.pre_norm}.weight")
  _tokens(keys, p, cfg, ev, s, base, layout)
  _head(keys, p, cfg, ev, s, fmt, base)
  cfg["distilled"] = False
  policy = hf_folder.policy(keys.meta, layout.policy, "that of the published "
                            f"{layout.upstream.removesuffix('Config').removesuffix('Vision')} models")
  return Reading(keys.fmt, cfg, ev, p, tuple(s.assumed), policy=policy)


def adapt(cfg: dict, r: Reading, native: int | None, path: str) -> None:
  """Heads split; the embedding's grid resized from its own square to the
  input's, as transformers does on each forward."""
  del native
  torch_pieces.split_heads(cfg, r, path)
  pe = r.params.get("pos_embedding")  # None: rotary, computed for any grid
  own = None if pe is None else math.isqrt(pe.shape[1]) * cfg["patch_size"]
  if r.config.get("num_registers") and r.fmt == "hf_dinov2":
    weights = preprocess.bicubic_weights  # Dinov2WithRegisters interpolates with antialias
  else:
    weights = LAYOUTS[r.fmt].resample
  resize.adapt(cfg, r, own, path, weights)


READER = Reader(
    formats=FORMATS,
    policy="hf_bicubic_crop0.875_imagenet",  # each layout states its own (`Layout.policy`)
    detect=detect,
    read=read,
    overridable=("gelu", "ln_eps", "num_heads"),
    adapt=adapt,
)
