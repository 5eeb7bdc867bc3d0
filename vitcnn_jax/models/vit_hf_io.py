"""ViTs in Hugging Face transformers' DINOv2 layout (`Dinov2Model`): from a
torch ONNX export of one (its weights named by `onnx_file`), or a state dict.

Names: `embeddings.{cls_token, mask_token, position_embeddings,
patch_embeddings.projection}`, `encoder.layer.N.{norm1, attention.attention.
{query,key,value}, attention.output.dense, layer_scale1.lambda1, norm2,
mlp.fc1, mlp.fc2, layer_scale2.lambda1}`, `layernorm`. The position embedding
covers a 37x37 grid (518 px at patch 14) and is resized to the input's grid
as transformers does on every forward: torch's bicubic (a=-0.75,
align_corners=False) without antialiasing; once at load time here. A torch
export splits it into the class row (`embeddings.Concat`) and the grid rows
(`embeddings.Reshape`). The mask token only replaces masked patches in
pretraining and is left out. What the weights cannot say (heads, GELU,
LayerNorm eps) is transformers' Dinov2Config default, reported as assumed.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from vitcnn_jax import preprocess
from vitcnn_jax.models import io
from vitcnn_jax.models import vit_io
from vitcnn_jax.models import vit_timm_io

FORMATS = {"hf_dinov2": "Hugging Face transformers' Dinov2Model weights (a torch ONNX export's "
                        "or a state dict's): embeddings.*, encoder.layer.N.*, layernorm"}
SUFFIX = None  # read, never written
POLICY = "bicubic_crop0.875_imagenet"  # transformers' DINOv2 image processor: 256 then 224
OVERRIDABLE = ("gelu", "ln_eps", "num_heads")
_ATTN = "MultiHeadDotProductAttention_0"


def detect(flat: dict[str, np.ndarray]) -> str | None:
  if "embeddings.patch_embeddings.projection.weight" in flat and any(
      k.startswith("encoder.layer.") for k in flat):
    return "hf_dinov2"
  return None


def _position_embedding(keys: io.Keys) -> tuple[np.ndarray, str]:
  if keys.has("embeddings.position_embeddings") or not keys.has("embeddings.Reshape"):
    return keys.take("embeddings.position_embeddings"), keys.shape("embeddings.position_embeddings")
  cls, grid = keys.take("embeddings.Concat"), keys.take("embeddings.Reshape")
  if cls.shape[-1] != grid.shape[-1] or cls.size != cls.shape[-1]:
    raise io.CheckpointError(f"{keys.path}: the class row {keys.shape('embeddings.Concat')} and "
                             f"the grid rows {keys.shape('embeddings.Reshape')} of the position "
                             "embedding do not fit together.")
  pe = np.concatenate([cls.reshape(1, 1, -1), grid.reshape(1, -1, grid.shape[-1])], axis=1)
  return pe, f"{keys.shape('embeddings.Concat')} + {keys.shape('embeddings.Reshape')}"


def _input_size(keys: io.Keys, grid: int, patch: int) -> tuple[int, str]:
  """The resolution: an ONNX graph's input, else the embedding's grid."""
  shape = keys.graph.input_shape if keys.graph else ()
  if len(shape) == 4 and isinstance(shape[2], int) and shape[2] == shape[3] and shape[2] > 0:
    return shape[2], f"the ONNX graph's input {shape}"
  return grid * patch, f"the position embedding's {grid}x{grid} grid"


def read(keys: io.Keys) -> io.Reading:
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  name = "embeddings.patch_embeddings.projection"
  w = keys.take(f"{name}.weight")
  if w.ndim != 4 or w.shape[1] != 3 or w.shape[2] != w.shape[3]:
    raise io.CheckpointError(f"{keys.path}: {keys.shape(name + '.weight')} is not a "
                             "(width, 3, patch, patch) convolution.")
  p["embedding/kernel"], p["embedding/bias"] = w.transpose(2, 3, 1, 0), keys.take(f"{name}.bias")
  d = cfg["width"] = w.shape[0]
  cfg["patch_size"] = w.shape[2]
  ev["width"] = ev["patch_size"] = keys.shape(f"{name}.weight")
  if keys.has("embeddings.mask_token"):
    keys.take("embeddings.mask_token")
  h = cfg["num_heads"] = vit_timm_io.HEADS.get(d, max(d // 64, 1))
  ev["num_heads"] = f"not in the weights; {h} for width {d} (Dinov2Config's models)"
  layers = keys.indices(r"encoder\.layer\.(\d+)\.")
  if not layers or layers[0] != 0:
    raise io.CheckpointError(f"{keys.path}: no encoder.layer.0.* weights found.")
  cfg["depth"], ev["depth"] = len(layers), f"encoder.layer.0..{len(layers) - 1}"
  kinds = set()
  for i in layers:
    src, ours = f"encoder.layer.{i}", f"Transformer/encoderblock_{i}"
    for q in ("query", "key", "value", "output.dense"):
      lin = f"{src}.attention.{'attention.' if q != 'output.dense' else ''}{q}.weight"
      if keys.has(lin) and keys.flat[lin].shape != (d, d):
        raise io.CheckpointError(f"{keys.path}: {keys.shape(lin)} should be ({d}, {d}), the "
                                 "width read from the patch embedding.")
    io.take_torch_norm(keys, p, f"{src}.norm1", f"{ours}/LayerNorm_0")
    vit_timm_io.attention(keys, p, f"{ours}/{_ATTN}", h,
                          [(f"{src}.attention.attention.{n}", slice(None))
                           for n in ("query", "key", "value")], f"{src}.attention.output.dense")
    io.take_torch_norm(keys, p, f"{src}.norm2", f"{ours}/LayerNorm_1")
    kinds.add(vit_timm_io.mlp(keys, p, f"{src}.mlp", f"{ours}/MlpBlock_0"))
    p[f"{ours}/ls1"] = keys.take(f"{src}.layer_scale1.lambda1")
    p[f"{ours}/ls2"] = keys.take(f"{src}.layer_scale2.lambda1")
  if len(kinds) > 1:
    raise io.CheckpointError(f"{keys.path}: the layers' MLPs differ ({sorted(kinds)}).")
  (cfg["mlp_dim"], cfg["mlp"]), = kinds
  ev["mlp_dim"] = ev["mlp"] = keys.shape("encoder.layer.0.mlp.fc1.weight")
  cfg["layer_scale"], ev["layer_scale"] = True, keys.shape("encoder.layer.0.layer_scale1.lambda1")
  io.take_torch_norm(keys, p, "layernorm", "Transformer/encoder_norm")
  cls = keys.take("embeddings.cls_token")
  pe, pe_ev = _position_embedding(keys)
  grid = math.isqrt(pe.shape[1] - 1)
  if grid * grid != pe.shape[1] - 1 or cls.shape != (1, 1, d) or pe.shape[-1] != d:
    raise io.CheckpointError(f"{keys.path}: a position embedding of {pe.shape} ({pe_ev}) and "
                             f"{keys.shape('embeddings.cls_token')} are not a class row and a "
                             f"square grid of width {d}.")
  p["cls"], p["pos_embedding"] = cls + pe[:, :1], pe[:, 1:]
  cfg["image_size"], ev["image_size"] = _input_size(keys, grid, cfg["patch_size"])
  cfg.update(pool="token", class_token=True, posemb="learn", fc_norm=False, num_classes=None,
             representation_size=None, gelu="exact", ln_eps=1e-6)
  ev.update(pool="embeddings.cls_token: the class token's final state (Dinov2Model's pooler)",
            class_token="embeddings.cls_token", posemb=pe_ev, fc_norm="layernorm",
            num_classes="Dinov2Model: no classifier",
            gelu="not in the weights; Dinov2Config's hidden_act 'gelu' (erf)",
            ln_eps="not in the weights; Dinov2Config's layer_norm_eps 1e-6")
  return io.Reading(keys.fmt, cfg, ev, p, ("num_heads", "gelu", "ln_eps"))


# transformers' Dinov2 resize of the embedding's grid.
resample_posemb = functools.partial(vit_timm_io.resample_posemb,
                                    weights=preprocess.torch_bicubic_weights)


def adapt(cfg: dict, r: io.Reading, native: int | None, path: str) -> None:
  """Heads split as timm's; the embedding's grid resized from the one it was
  trained on (its own square) to the input's."""
  del native
  grid = math.isqrt(r.params["pos_embedding"].shape[1])
  vit_timm_io.split_heads(cfg, r, path)
  vit_io.adapt(cfg, r, grid * cfg["patch_size"], path, resample=resample_posemb)


def default_format(model) -> str:
  del model
  return "hf_dinov2"


def write(model, flat: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
  """Reading only: our ViTs save as npz or timm safetensors."""
  del model, flat
  raise ValueError(f"Format {fmt!r} is read, not written; save as .npz or .safetensors.")
