"""CKA between subsets of first-block ViT heads and lower ResNet layers (paper Fig 5).

Pass 1: mean attention distance of every head of `config.block` (the
attention_distance analysis). Heads are sorted from most local to most global
and cut into sliding windows of `config.subset_size` heads (stride
`config.subset_stride`). Pass 2: minibatch CKA between each subset's
representation and each ResNet layer of `config.models.resnet.capture`.

Tap point (`config.tap`; the paper leaves it open): "heads" (default) takes the
subset's per-head outputs before the output projection, flattened over tokens
(CLS excluded) and head channels; "projected" passes only the subset's heads
through the block's output projection (bias excluded).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax import hsic
from vitcnn_jax import plotting
from vitcnn_jax import results
from vitcnn_jax.analyses import attention_distance as ad

TAPS = ("heads", "projected")


def subsets(order: np.ndarray, size: int, stride: int) -> list[list[int]]:
  if not 1 <= size <= len(order):
    raise ValueError(f"config.subset_size={size} must be in 1..{len(order)} heads.")
  if stride < 1:
    raise ValueError(f"config.subset_stride={stride} must be >= 1.")
  return [order[i:i + size].tolist() for i in range(0, len(order) - size + 1, stride)]


MODELS = ("vit", "resnet")
HSIC_MINIBATCHES = True


class HeadSubsets:
  """Head distances and per-subset HSIC. With tap="heads" one pass suffices: a
  subset's Gram is the sum of its heads' Grams and U-centring is linear, so its
  HSIC with any layer is a sum of per-head terms (A H A^T below). The projected
  tap mixes heads, so it takes a second pass once the subsets are known."""
  name, title, repeats, labels = "head_subsets", "head subsets", 1, False

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    if config.tap not in TAPS:
      raise ValueError(f"config.tap={config.tap!r} is not one of {TAPS}.")
    self.config, self.vit, self.res = config, models["vit"], models["resnet"]
    if self.vit.model.family != "vit" or self.res.model.family != "bit":
      raise ValueError("config.models.vit must be a ViT and config.models.resnet a BiT ResNet.")
    if not 0 <= config.block < self.vit.model.depth:
      raise ValueError(f"config.block={config.block} is outside 0..{self.vit.model.depth - 1}.")
    self.blk, self.heads = f"block{config.block:02d}", self.vit.model.num_heads
    self.res_names = list(self.res.names)
    one_pass = config.tap == "heads"
    self.points = {"vit": [f"{self.blk}/attn/weights"] + [f"{self.blk}/attn/heads"] * one_pass}
    if one_pass:
      self.points["resnet"] = self.res_names
    self.groups: list[list[int]] = []

  def passes(self):
    return [self] if self.config.tap == "heads" else [self, _Projected(self)]

  def spatial_heads(self, out: dict):
    """(B, N, H, hd) per-head outputs of the spatial tokens, from the captured points."""
    return out[f"{self.blk}/attn/heads"][:, self.vit.model.num_prefix_tokens:]

  def step(self, forward, labels, mask) -> dict:
    del labels
    out = forward("vit")
    dist = jnp.asarray(ad.distance_matrix(self.vit.model.grid, int(np.ravel(self.vit.model.patch_size)[0])),
                       jnp.float32)
    w = out[f"{self.blk}/attn/weights"]
    sums = {"distance": ad.mean_distance(w, dist, self.vit.model.num_prefix_tokens, "drop").T @ mask}
    if self.config.tap == "heads":
      heads = self.spatial_heads(out)
      res = forward("resnet")
      reps = [heads[:, :, h] for h in range(self.heads)] + [res[n] for n in self.res_names]
      sums.update(forward.minibatch_sums(reps, mask))
    return sums

  def subsets(self, distance_sums: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
    head_dist = distance_sums / self.config.num_examples
    order = np.argsort(head_dist, kind="stable")
    return head_dist, subsets(order, self.config.subset_size, self.config.subset_stride)

  host_sums = staticmethod(hsic.unscale)

  def finalize(self, sums):
    head_dist, groups = self.subsets(sums[0][0]["distance"])
    if self.config.tap == "heads":
      a = np.zeros((len(groups) + len(self.res_names), self.heads + len(self.res_names)))
      for i, g in enumerate(groups):
        a[i, g] = 1
      a[len(groups):, self.heads:] = np.eye(len(self.res_names))
      pairs = a @ sums[0][0]["hsic"] @ a.T
      moments = a @ sums[0][0]["moments"]  # a subset's: the sum of its heads'
    else:
      pairs, moments = sums[1][0]["hsic"], sums[1][0]["moments"]
    full = hsic.cka_from_hsic(pairs, [f"heads{g}" for g in groups] + self.res_names,
                             moments / self.config.num_examples)
    sub_cka = full[:len(groups), len(groups):]
    sub_dist = [float(head_dist[g].mean()) for g in groups]
    summary = {"analysis": "head_subsets", "block": self.config.block, "tap": self.config.tap,
               "head_distance_px": head_dist.tolist(), "subsets": groups,
               "subset_distance_px": sub_dist, "resnet_layers": self.res_names,
               "cka": sub_cka.tolist(), "num_examples": self.config.num_examples}
    arrays = {"cka": sub_cka, "subset_distance": np.asarray(sub_dist), "head_distance": head_dist}
    return arrays, summary

  def plot(self, arrays, summary, workdir: str) -> None:
    plotting.head_subsets(arrays["subset_distance"], arrays["cka"], self.res_names,
                          f"{self.vit.label} block {self.config.block}", self.res.label,
                          results.workdir_path(workdir, "head_subsets.png"))


class _Projected:
  """Second pass of tap="projected": each subset's heads through the output projection."""
  repeats, labels, title = 1, False, "head subsets (projected)"

  def __init__(self, a: HeadSubsets):
    self.a = a
    self.points = {"vit": [f"{a.blk}/attn/heads"], "resnet": a.res_names}
    self.groups: list[list[int]] = []

  def setup(self, done) -> None:
    self.groups = self.a.subsets(done[0][0]["distance"])[1]

  def step(self, forward, labels, mask) -> dict:
    del labels
    kernel = self.a.vit.params["Transformer"][f"encoderblock_{self.a.config.block}"][
        "MultiHeadDotProductAttention_0"]["out"]["kernel"]
    heads = self.a.spatial_heads(forward("vit"))
    reps = [jnp.einsum("bnhd,hdo->bno", heads[:, :, g], kernel[jnp.asarray(g)]) for g in self.groups]
    res = forward("resnet")
    reps += [res[n] for n in self.a.res_names]
    return forward.minibatch_sums(reps, mask)

  host_sums = staticmethod(hsic.unscale)


build = HeadSubsets
