"""Float64 NumPy forwards written from the upstream arithmetic, for the files timm
cannot load (big_vision sincos2d / pool '0' / two-tower ViTs, bit_paper ResNets).

Independent of vitcnn_jax on purpose: they read the upstream key names of
tests/support/upstream_files.py directly (big_vision names, `params/` stripped).
"""

from __future__ import annotations

import numpy as np


def _sub(w: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
  return {k[len(prefix) + 1:]: np.asarray(v, np.float64) for k, v in w.items()
          if k.startswith(prefix + "/")}


def layer_norm(x: np.ndarray, p: dict, eps: float = 1e-6) -> np.ndarray:
  m = x.mean(-1, keepdims=True)
  v = ((x - m) ** 2).mean(-1, keepdims=True)
  return (x - m) / np.sqrt(v + eps) * p["scale"] + p["bias"]


def gelu_tanh(x: np.ndarray) -> np.ndarray:
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def attention(q_in: np.ndarray, kv_in: np.ndarray, p: dict) -> np.ndarray:
  """Flax MultiHeadDotProductAttention: q / sqrt(head_dim), softmax, output Dense."""
  q = np.einsum("btd,dhk->bthk", q_in, p["query/kernel"]) + p["query/bias"]
  k = np.einsum("btd,dhk->bthk", kv_in, p["key/kernel"]) + p["key/bias"]
  v = np.einsum("btd,dhk->bthk", kv_in, p["value/kernel"]) + p["value/bias"]
  logits = np.einsum("bqhd,bkhd->bhqk", q / np.sqrt(q.shape[-1]), k)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  heads = np.einsum("bhqk,bkhd->bqhd", weights, v)
  return np.einsum("bqhd,hdo->bqo", heads, p["out/kernel"]) + p["out/bias"]


def mlp(x: np.ndarray, p: dict) -> np.ndarray:
  h = gelu_tanh(x @ p["Dense_0/kernel"] + p["Dense_0/bias"])
  return h @ p["Dense_1/kernel"] + p["Dense_1/bias"]


def sincos2d(h: int, w: int, width: int, temperature: float = 10_000.) -> np.ndarray:
  """big_vision posemb_sincos_2d: [sin x, cos x, sin y, cos y] over width/4 frequencies."""
  q = width // 4
  omega = temperature ** -(np.arange(q) / (q - 1))
  rows, cols = np.divmod(np.arange(h * w), w)
  x, y = cols[:, None] * omega, rows[:, None] * omega
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)[None]


def bv_vit(w: dict[str, np.ndarray], images: np.ndarray, *, pool: str) -> tuple[np.ndarray, np.ndarray]:
  """(head input, output) of big_vision's ViT `_Model` for a flat unprefixed tree."""
  w = {k: np.asarray(v, np.float64) for k, v in w.items()}
  kernel = w["embedding/kernel"]
  p = kernel.shape[0]
  n, height, width, _ = images.shape
  gh, gw = height // p, width // p
  patches = images.astype(np.float64).reshape(n, gh, p, gw, p, 3).transpose(0, 1, 3, 2, 4, 5)
  x = np.einsum("nhwijc,ijcd->nhwd", patches, kernel) + w["embedding/bias"]
  d = x.shape[-1]
  x = x.reshape(n, gh * gw, d)
  x = x + (w["pos_embedding"] if "pos_embedding" in w else sincos2d(gh, gw, d))
  if pool == "tok":
    x = np.concatenate([np.tile(w["cls"], (n, 1, 1)), x], axis=1)
  depth = len({k.split("/")[1] for k in w if k.startswith("Transformer/encoderblock_")})
  for i in range(depth):
    b = _sub(w, f"Transformer/encoderblock_{i}")
    y = layer_norm(x, _sub(b, "LayerNorm_0"))
    x = x + attention(y, y, _sub(b, "MultiHeadDotProductAttention_0"))
    x = x + mlp(layer_norm(x, _sub(b, "LayerNorm_1")), _sub(b, "MlpBlock_0"))
  x = layer_norm(x, _sub(w, "Transformer/encoder_norm"))
  if pool in ("tok", "0"):
    x = x[:, 0]
  elif pool == "gap":
    x = x.mean(1)
  elif pool == "map":
    m = _sub(w, "MAPHead_0")
    y = attention(np.tile(m["probe"], (n, 1, 1)), x, _sub(m, "MultiHeadDotProductAttention_0"))
    x = (y + mlp(layer_norm(y, _sub(m, "LayerNorm_0")), _sub(m, "MlpBlock_0")))[:, 0]
  head_input = x
  if "pre_logits/kernel" in w:
    x = np.tanh(x @ w["pre_logits/kernel"] + w["pre_logits/bias"])
  if "head/kernel" in w:
    x = x @ w["head/kernel"] + w["head/bias"]
  return head_input, x


def _standardize(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
  x = x - x.mean(axis=axes, keepdims=True)
  return x / np.sqrt((x ** 2).mean(axis=axes, keepdims=True) + eps)


def std_conv(x: np.ndarray, kernel: np.ndarray, stride: int = 1) -> np.ndarray:
  """Weight-standardised (eps 1e-10) conv with symmetric padding (k - 1) // 2."""
  k = _standardize(kernel, (0, 1, 2), 1e-10)
  size, pad = k.shape[0], (k.shape[0] - 1) // 2
  xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  oh = (x.shape[1] + 2 * pad - size) // stride + 1
  ow = (x.shape[2] + 2 * pad - size) // stride + 1
  out = np.zeros((x.shape[0], oh, ow, k.shape[-1]))
  for dy in range(size):
    for dx in range(size):
      window = xp[:, dy:dy + stride * (oh - 1) + 1:stride, dx:dx + stride * (ow - 1) + 1:stride]
      out += np.einsum("nhwc,co->nhwo", window, k[dy, dx])
  return out


def group_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, groups: int = 32) -> np.ndarray:
  g = x.reshape(x.shape[:-1] + (groups, x.shape[-1] // groups))
  return _standardize(g, (1, 2, 4), 1e-5).reshape(x.shape) * scale.reshape(-1) + bias.reshape(-1)


def max_pool(x: np.ndarray, pad_value: float) -> np.ndarray:
  """3x3 stride-2 max-pool after padding 1 on each side with `pad_value`."""
  xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=pad_value)
  oh, ow = (xp.shape[1] - 3) // 2 + 1, (xp.shape[2] - 3) // 2 + 1
  windows = [xp[:, dy:dy + 2 * (oh - 1) + 1:2, dx:dx + 2 * (ow - 1) + 1:2]
             for dy in range(3) for dx in range(3)]
  return np.max(windows, axis=0)


def bit_paper(w: dict[str, np.ndarray], images: np.ndarray, *, pool_pad: float) -> np.ndarray:
  """Logits of big_vision's `bit_paper.Model` for a flat unprefixed tree."""
  w = {k: np.asarray(v, np.float64) for k, v in w.items()}
  x = max_pool(std_conv(images.astype(np.float64), w["root_block/conv_root/kernel"], 2), pool_pad)
  blocks = sorted({k.split("/")[0] for k in w if k.startswith("block")})
  for b, block in enumerate(blocks):
    units = sorted({k.split("/")[1] for k in w if k.startswith(block + "/")})
    for u, unit in enumerate(units):
      p = _sub(w, f"{block}/{unit}")
      stride = 2 if b > 0 and u == 0 else 1
      y = np.maximum(group_norm(x, p["gn1/scale"], p["gn1/bias"]), 0)
      shortcut = std_conv(y, p["conv_proj/kernel"], stride) if "conv_proj/kernel" in p else x
      y = std_conv(y, p["conv1/kernel"])
      y = std_conv(np.maximum(group_norm(y, p["gn2/scale"], p["gn2/bias"]), 0), p["conv2/kernel"], stride)
      y = std_conv(np.maximum(group_norm(y, p["gn3/scale"], p["gn3/bias"]), 0), p["conv3/kernel"])
      x = y + shortcut
  x = np.maximum(group_norm(x, w["norm-pre-head/scale"], w["norm-pre-head/bias"]), 0).mean((1, 2))
  return x @ w["head/kernel"] + w["head/bias"]
