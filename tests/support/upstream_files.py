"""Synthetic checkpoints written with the exact upstream key names and shapes.

Independent of vitcnn_jax.checkpoints on purpose: the key lists below are
spelled out from the upstream formats (see shared/spec/upstream.md), so a
loader bug cannot be mirrored by a writer bug.
"""

from __future__ import annotations

import numpy as np


class Rand:
  """Random weights scaled so that activations stay O(1) through the net."""

  def __init__(self, seed: int):
    self.rng = np.random.default_rng(seed)

  def kernel(self, *shape: int, fan_in: int | None = None) -> np.ndarray:
    fan_in = fan_in or int(np.prod(shape[:-1]))
    return (self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

  def bias(self, *shape: int) -> np.ndarray:
    return (0.1 * self.rng.standard_normal(shape)).astype(np.float32)

  def scale(self, *shape: int) -> np.ndarray:
    return (1 + 0.1 * self.rng.standard_normal(shape)).astype(np.float32)


def _attention(r: Rand, d: int, heads: int) -> dict[str, np.ndarray]:
  hd = d // heads
  w = {}
  for name in ("query", "key", "value"):
    w[f"{name}/kernel"] = r.kernel(d, heads, hd, fan_in=d)
    w[f"{name}/bias"] = r.bias(heads, hd)
  w["out/kernel"] = r.kernel(heads, hd, d, fan_in=d)
  w["out/bias"] = r.bias(d)
  return w


def _mlp(r: Rand, d: int, m: int, out: int | None = None) -> dict[str, np.ndarray]:
  return {"Dense_0/kernel": r.kernel(d, m), "Dense_0/bias": r.bias(m),
          "Dense_1/kernel": r.kernel(m, out or d), "Dense_1/bias": r.bias(out or d)}


def _ln(r: Rand, d: int) -> dict[str, np.ndarray]:
  return {"scale": r.scale(d), "bias": r.bias(d)}


def _under(prefix: str, tree: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {f"{prefix}/{k}": v for k, v in tree.items()}


def _vit_head(r: Rand, width: int, pre_logits: int | None,
              num_classes: int | None) -> dict[str, np.ndarray]:
  """Optional pre_logits (Dense + tanh in the model) and optional classifier."""
  w, feat = {}, width
  if pre_logits:
    w["pre_logits/kernel"], w["pre_logits/bias"] = r.kernel(width, pre_logits), r.bias(pre_logits)
    feat = pre_logits
  if num_classes:
    w["head/kernel"], w["head/bias"] = r.kernel(feat, num_classes), r.bias(num_classes)
  return w


def vt_vit(seed: int = 0, *, width: int = 48, depth: int = 2, heads: int = 3,
           mlp: int = 96, patch: int = 8, grid: int = 4, num_classes: int | None = 7,
           pool: str = "token", pre_logits: int | None = None) -> dict[str, np.ndarray]:
  """google-research/vision_transformer ViT file: pre-linen names, cls row in posemb."""
  r = Rand(seed)
  w = {"embedding/kernel": r.kernel(patch, patch, 3, width), "embedding/bias": r.bias(width)}
  rows = grid * grid
  if pool == "token":
    w["cls"] = r.bias(1, 1, width)
    rows += 1
  w["Transformer/posembed_input/pos_embedding"] = r.bias(1, rows, width)
  for i in range(depth):
    b = f"Transformer/encoderblock_{i}"
    w.update(_under(f"{b}/LayerNorm_0", _ln(r, width)))
    w.update(_under(f"{b}/MultiHeadDotProductAttention_1", _attention(r, width, heads)))
    w.update(_under(f"{b}/LayerNorm_2", _ln(r, width)))
    w.update(_under(f"{b}/MlpBlock_3", _mlp(r, width, mlp)))
  w.update(_under("Transformer/encoder_norm", _ln(r, width)))
  w.update(_vit_head(r, width, pre_logits, num_classes))
  return w


def bv_vit(seed: int = 0, *, width: int = 48, depth: int = 2, heads: int = 3,
           mlp: int = 96, patch: int = 8, grid: int = 4, num_classes: int | None = 7,
           pool: str = "tok", scan: bool = False, prefix: str = "params/",
           posemb: str = "learn", rep_size: int | None = None) -> dict[str, np.ndarray]:
  """big_vision ViT file: linen names, top-level pos_embedding (none for `sincos2d`),
  optional scan stacking; pool_type 'tok', 'gap', 'map' or '0' (the last two
  leave the same tensors); `rep_size` adds pre_logits."""
  r = Rand(seed)
  w = {"embedding/kernel": r.kernel(patch, patch, 3, width), "embedding/bias": r.bias(width)}
  if posemb == "learn":
    w["pos_embedding"] = r.bias(1, grid * grid, width)
  if pool == "tok":
    w["cls"] = r.bias(1, 1, width)
  blocks = []
  for _ in range(depth):
    blk = {}
    blk.update(_under("LayerNorm_0", _ln(r, width)))
    blk.update(_under("MultiHeadDotProductAttention_0", _attention(r, width, heads)))
    blk.update(_under("LayerNorm_1", _ln(r, width)))
    blk.update(_under("MlpBlock_0", _mlp(r, width, mlp)))
    blocks.append(blk)
  if scan:
    w.update(_under("Transformer/encoderblock",
                    {k: np.stack([b[k] for b in blocks]) for k in blocks[0]}))
  else:
    for i, blk in enumerate(blocks):
      w.update(_under(f"Transformer/encoderblock_{i}", blk))
  w.update(_under("Transformer/encoder_norm", _ln(r, width)))
  if pool == "map":
    w["MAPHead_0/probe"] = r.bias(1, 1, width)
    w.update(_under("MAPHead_0/MultiHeadDotProductAttention_0", _attention(r, width, heads)))
    w.update(_under("MAPHead_0/LayerNorm_0", _ln(r, width)))
    w.update(_under("MAPHead_0/MlpBlock_0", _mlp(r, width, mlp)))
  w.update(_vit_head(r, width, rep_size, num_classes))
  return {prefix + k: v for k, v in w.items()}


def two_tower(image_tower: dict[str, np.ndarray], seed: int = 0, width: int = 32,
              vocab: int = 50) -> dict[str, np.ndarray]:
  """A big_vision two-tower (LiT / SigLIP) file: `params/img/...` (a big_vision ViT
  written with prefix ""), `params/txt/...` (a text transformer) and the scalars
  `t` (temperature) and `b` (SigLIP bias)."""
  r = Rand(seed)
  txt = {"Embed_0/embedding": r.kernel(vocab, width), "pos_embedding": r.bias(1, 16, width)}
  txt.update(_under("Encoder_0/encoderblock_0/LayerNorm_0", _ln(r, width)))
  txt.update(_under("Encoder_0/encoderblock_0/MultiHeadDotProductAttention_0", _attention(r, width, 2)))
  txt.update(_under("Encoder_0/encoder_norm", _ln(r, width)))
  txt["head/kernel"], txt["head/bias"] = r.kernel(width, width), r.bias(width)
  w = {f"params/img/{k}": v for k, v in image_tower.items()}
  w.update({f"params/txt/{k}": v for k, v in txt.items()})
  w["params/t"], w["params/b"] = np.array([2.3], np.float32), np.array([-10.0], np.float32)
  return w


def bv_bit(seed: int = 0, *, width: float = 0.5, depth=(1, 1, 1, 1),
           num_classes: int = 7) -> dict[str, np.ndarray]:
  """big_vision `bit_paper` ResNet-v2 file: `params/root_block/conv_root`,
  `blockB/unitUU/{conv1..3, conv_proj, gn1..3}` with (1,1,1,C) GroupNorm params,
  `norm-pre-head`, and a Dense head."""
  r = Rand(seed)
  root = int(64 * width)
  w = {"root_block/conv_root/kernel": r.kernel(7, 7, 3, root)}
  cin = root
  for b, units in enumerate(depth, 1):
    mid = root * 2 ** (b - 1)
    for u in range(1, units + 1):
      p = f"block{b}/unit{u:02d}"
      for i, (c, shape) in enumerate([(cin, (1, 1, cin, mid)), (mid, (3, 3, mid, mid)),
                                      (mid, (1, 1, mid, 4 * mid))], 1):
        w[f"{p}/gn{i}/scale"], w[f"{p}/gn{i}/bias"] = r.scale(1, 1, 1, c), r.bias(1, 1, 1, c)
        w[f"{p}/conv{i}/kernel"] = r.kernel(*shape)
      if u == 1:
        w[f"{p}/conv_proj/kernel"] = r.kernel(1, 1, cin, 4 * mid)
      cin = 4 * mid
  w["norm-pre-head/scale"], w["norm-pre-head/bias"] = r.scale(1, 1, 1, cin), r.bias(1, 1, 1, cin)
  w["head/kernel"], w["head/bias"] = r.kernel(cin, num_classes), r.bias(num_classes)
  return {f"params/{k}": v for k, v in w.items()}


def bt_bit(seed: int = 0, *, width: float = 0.5, depth=(1, 2, 1, 1), num_classes: int = 7,
           numbered_convs: bool = False, gn_4d: bool = False) -> dict[str, np.ndarray]:
  """google-research/big_transfer ResNet-v2 file (`resnet/...`, HWIO kernels)."""
  r = Rand(seed)
  conv_count = iter(range(10_000))

  def conv(name: str, *shape: int) -> tuple[str, np.ndarray]:
    suffix = f"_{next(conv_count)}" if numbered_convs else ""
    return f"resnet/{name}/standardized_conv2d{suffix}/kernel", r.kernel(*shape)

  def gn(name: str, c: int) -> dict[str, np.ndarray]:
    shape = (1, 1, 1, c) if gn_4d else (c,)
    return {f"resnet/{name}/group_norm/gamma": r.scale(*shape),
            f"resnet/{name}/group_norm/beta": r.bias(*shape)}

  root = int(64 * width)
  w = dict([conv("root_block", 7, 7, 3, root)])
  cin = root
  for b, units in enumerate(depth, 1):
    mid = root * 2 ** (b - 1)
    for u in range(1, units + 1):
      p = f"block{b}/unit{u:02d}"
      w.update(gn(f"{p}/a", cin))
      w.update([conv(f"{p}/a", 1, 1, cin, mid)])
      w.update(gn(f"{p}/b", mid))
      w.update([conv(f"{p}/b", 3, 3, mid, mid)])
      w.update(gn(f"{p}/c", mid))
      w.update([conv(f"{p}/c", 1, 1, mid, 4 * mid)])
      if u == 1:
        w.update([conv(f"{p}/a/proj", 1, 1, cin, 4 * mid)])
      cin = 4 * mid
  w["resnet/group_norm/gamma"], w["resnet/group_norm/beta"] = r.scale(cin), r.bias(cin)
  w["resnet/head/conv2d/kernel"] = r.kernel(1, 1, cin, num_classes)
  w["resnet/head/conv2d/bias"] = r.bias(num_classes)
  return w


def mixer(seed: int = 0, *, width: int = 32, blocks: int = 2, tokens_mlp: int = 8,
          channels_mlp: int = 64, patch: int = 8, grid: int = 4,
          num_classes: int = 7) -> dict[str, np.ndarray]:
  """vision_transformer MLP-Mixer file."""
  r = Rand(seed)
  w = {"stem/kernel": r.kernel(patch, patch, 3, width), "stem/bias": r.bias(width)}
  for i in range(blocks):
    b = f"MixerBlock_{i}"
    w.update(_under(f"{b}/LayerNorm_0", _ln(r, width)))
    w.update(_under(f"{b}/token_mixing", _mlp(r, grid * grid, tokens_mlp)))
    w.update(_under(f"{b}/LayerNorm_1", _ln(r, width)))
    w.update(_under(f"{b}/channel_mixing", _mlp(r, width, channels_mlp)))
  w.update(_under("pre_head_layer_norm", _ln(r, width)))
  w["head/kernel"], w["head/bias"] = r.kernel(width, num_classes), r.bias(num_classes)
  return w


def save(path, arrays: dict[str, np.ndarray]) -> str:
  np.savez(path, **arrays)
  return str(path)
