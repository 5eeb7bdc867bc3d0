"""RoPE ViTs in timm's `Eva` layout (`.safetensors`): DINOv3 as timm publishes it
(timm/vit_*_patch16_dinov3.*).

Names: cls_token, reg_token, patch_embed.proj, blocks.N.{norm1, attn.qkv (no bias;
attn.q_bias and attn.v_bias where it has them, the key's bias zero), attn.proj,
gamma_1, norm2, mlp.fc1/fc2 or SwiGLU mlp.fc1_g/fc1_x/fc2, gamma_2}, norm or
fc_norm, head. No learned position embedding: DINOv3's rotary embedding of the
patch tokens (our rope="dinov3"). A file that has a `pos_embed` besides (EVA-02,
Perception Encoder: another rotary embedding) is refused by name.

What the weights cannot say (heads, LayerNorm eps 1e-5, the rotary base 100,
timm's pooling) comes from the timm config.json beside the file
(`timm_config.py`), else is DINOv3's, reported as assumed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitcnn_jax.models import io
from vitcnn_jax.models import timm_config
from vitcnn_jax.models import vit_io
from vitcnn_jax.models import vit_timm_io

FORMATS = {"timm_eva": "timm's Eva state dict (.safetensors) of a DINOv3 ViT: fused qkv with "
                       "q_bias/v_bias, gamma_1/gamma_2, reg_token, rotary embeddings"}
SUFFIX = None  # read, never written
POLICY = "bicubic_crop1_imagenet"  # timm's DINOv3 evaluation: 256, bicubic, no crop
OVERRIDABLE = ("ln_eps", "num_heads", "rope_theta")
_ATTN = "MultiHeadDotProductAttention_0"
_EVA_ONLY = ("blocks.0.gamma_1", "blocks.0.attn.q_bias", "blocks.0.mlp.fc1_g.weight",
             "blocks.0.attn.q_proj.weight")


def detect(flat: dict[str, np.ndarray]) -> str | None:
  if "patch_embed.proj.weight" in flat and any(k in flat for k in _EVA_ONLY):
    return "timm_eva"
  return None


def _attention(keys: io.Keys, p: dict, src: str, ours: str, h: int, d: int) -> None:
  """Fused qkv without bias, the query's and value's biases apart (the key's zero)."""
  w = keys.take(f"{src}.attn.qkv.weight")
  if w.shape != (3 * d, d):
    raise io.CheckpointError(f"{keys.path}: {keys.shape(src + '.attn.qkv.weight')} should be "
                             f"({3 * d}, {d}).")
  biases = [keys.take(f"{src}.attn.{q}_bias") if keys.has(f"{src}.attn.{q}_bias") else np.zeros(d, w.dtype)
            for q in ("q", "k", "v")]
  for j, (name, b) in enumerate(zip(("query", "key", "value"), biases)):
    p[f"{ours}/{name}/kernel"] = w[j * d:(j + 1) * d].T.reshape(d, h, d // h)
    p[f"{ours}/{name}/bias"] = b.reshape(h, d // h)
  pw, pb = io.take_torch_linear(keys, f"{src}.attn.proj")
  p[f"{ours}/out/kernel"], p[f"{ours}/out/bias"] = pw.reshape(h, d // h, d), pb


def _mlp(keys: io.Keys, p: dict, src: str, ours: str) -> tuple[int, str]:
  """(hidden width, kind): timm's SwiGLU (silu(fc1_g) * fc1_x) as our packed one."""
  if not keys.has(f"{src}.mlp.fc1_g.weight"):
    return vit_timm_io.mlp(keys, p, f"{src}.mlp", ours)
  (wg, bg), (wx, bx) = (io.take_torch_linear(keys, f"{src}.mlp.{n}") for n in ("fc1_g", "fc1_x"))
  p[f"{ours}/Dense_0/kernel"], p[f"{ours}/Dense_0/bias"] = np.concatenate([wg, wx], 1), np.concatenate([bg, bx])
  p[f"{ours}/Dense_1/kernel"], p[f"{ours}/Dense_1/bias"] = io.take_torch_linear(keys, f"{src}.mlp.fc2")
  return wg.shape[1], "swiglu"


def _blocks(keys: io.Keys, p: dict, cfg: dict, ev: dict) -> None:
  idx = keys.indices(r"blocks\.(\d+)\.")
  if not idx or idx[0] != 0:
    raise io.CheckpointError(f"{keys.path}: no blocks.0.* tensors found.")
  cfg["depth"], ev["depth"] = len(idx), f"blocks.0..{len(idx) - 1}"
  d, h, kinds = cfg["width"], cfg["num_heads"], set()
  cfg["layer_scale"] = keys.has("blocks.0.gamma_1")
  ev["layer_scale"] = "blocks.0.gamma_1" + ("" if cfg["layer_scale"] else ": absent")
  for i in idx:
    src, ours = f"blocks.{i}", f"Transformer/encoderblock_{i}"
    io.take_torch_norm(keys, p, f"{src}.norm1", f"{ours}/LayerNorm_0")
    _attention(keys, p, src, f"{ours}/{_ATTN}", h, d)
    io.take_torch_norm(keys, p, f"{src}.norm2", f"{ours}/LayerNorm_1")
    kinds.add(_mlp(keys, p, src, f"{ours}/MlpBlock_0"))
    if cfg["layer_scale"]:
      p[f"{ours}/ls1"], p[f"{ours}/ls2"] = keys.take(f"{src}.gamma_1"), keys.take(f"{src}.gamma_2")
  if len(kinds) > 1:
    raise io.CheckpointError(f"{keys.path}: the blocks' MLPs differ ({sorted(kinds)}).")
  (cfg["mlp_dim"], cfg["mlp"]), = kinds
  ev["mlp_dim"] = ev["mlp"] = keys.shape("blocks.0.mlp.fc2.weight")


def read(keys: io.Keys) -> io.Reading:
  if keys.has("pos_embed"):
    raise io.CheckpointError(
        f"{keys.path}: a timm Eva file with a learned {keys.shape('pos_embed')} beside its rotary "
        "embeddings (EVA-02 or a Perception Encoder); their rotary embedding is not supported "
        "yet, only DINOv3's (no pos_embed).")
  p: dict[str, np.ndarray] = {}
  cfg: dict[str, Any] = {}
  ev: dict[str, str] = {}
  w = keys.take("patch_embed.proj.weight")
  p["embedding/kernel"], p["embedding/bias"] = w.transpose(2, 3, 1, 0), keys.take("patch_embed.proj.bias")
  cfg["width"], cfg["patch_size"] = w.shape[0], w.shape[2]
  ev["width"] = ev["patch_size"] = keys.shape("patch_embed.proj.weight")
  s = timm_config.Settings(keys, "timm's DINOv3")
  s.heads(cfg, ev, vit_timm_io.HEADS.get(cfg["width"], max(cfg["width"] // 64, 1)))
  _blocks(keys, p, cfg, ev)
  cfg.update(posemb="none", rope="dinov3", pre_norm=False, patch_bias=True, distilled=False,
             representation_size=None, class_token=keys.has("cls_token"))
  ev["posemb"] = ev["rope"] = "no pos_embed: timm's DINOv3 (rope_type 'dinov3')"
  if cfg["class_token"]:
    p["cls"], ev["class_token"] = keys.take("cls_token"), keys.shape("cls_token")
  cfg["num_registers"] = keys.flat["reg_token"].shape[1] if keys.has("reg_token") else 0
  ev["num_registers"] = keys.shape("reg_token") if keys.has("reg_token") else "reg_token: absent"
  if cfg["num_registers"]:
    p["reg"] = keys.take("reg_token")
  cfg["fc_norm"] = keys.has("fc_norm.weight")
  io.take_torch_norm(keys, p, "fc_norm" if cfg["fc_norm"] else "norm",
                     "fc_norm" if cfg["fc_norm"] else "Transformer/encoder_norm")
  ev["fc_norm"] = "fc_norm.weight" + ("" if cfg["fc_norm"] else ": absent")
  io.take_head_torch(keys, p, cfg, ev)
  s.get("ln_eps", cfg, ev, 1e-5, "DINOv3's LayerNorm eps 1e-5")
  s.get("rope_theta", cfg, ev, 100.0, "DINOv3's rope temperature 100")
  s.get("gelu", cfg, ev, "exact", "timm's nn.GELU (erf)")
  s.pool(cfg, ev, "gap", "timm's Eva default global_pool 'avg': the patch tokens' mean")
  s.get("image_size", cfg, ev, 256, "timm's DINOv3 input size 256")
  return io.Reading(keys.fmt, cfg, ev, p, tuple(s.assumed), policy=s.policy())


def adapt(cfg: dict, r: io.Reading, native: int | None, path: str) -> None:
  """Heads split; rotary embeddings need no resampling."""
  del native
  vit_timm_io.split_heads(cfg, r, path)
  vit_io.adapt(cfg, r, None, path)


def default_format(model) -> str:
  del model
  return "timm_eva"


def write(model, flat: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
  """Reading only."""
  del model, flat
  raise ValueError(f"Format {fmt!r} is read, not written.")
