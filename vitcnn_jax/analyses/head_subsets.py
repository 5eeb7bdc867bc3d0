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

The "vit" may be any model whose attention the anatomy places on the image: a
Swin's first block is read in its windows, distances in image pixels.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax.analyses import attention_distance as ad
from vitcnn_jax.plotting import attention
from vitcnn_jax.plotting import style
from vitcnn_jax.run import declaration
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results
from vitcnn_jax.similarity import linear_cka

DEFAULTS = {
    "num_examples": 10240,  # the CKA protocol of the paper (Appendix A)
    "batch_size": 1024,  # per device (a CKA minibatch)
    "seed": 0,
    "block": 0,  # the paper uses the first block
    "subset_size": 0,  # heads per subset (the paper does not say); 0: a quarter of the heads
    "subset_stride": 1,  # sliding windows over the heads sorted by distance
    "tap": "heads",  # "heads" (before the output projection) or "projected"
}
TAPS = ("heads", "projected")


def subsets(order: np.ndarray, size: int, stride: int) -> list[list[int]]:
  if not 1 <= size <= len(order):
    raise ValueError(f"config.subset_size={size} must be in 1..{len(order)} heads.")
  if stride < 1:
    raise ValueError(f"config.subset_stride={stride} must be >= 1.")
  return [order[i:i + size].tolist() for i in range(0, len(order) - size + 1, stride)]


class HeadSubsets(protocol.HsicPass, protocol.Analysis):
  """Head distances and per-subset HSIC. With tap="heads" one pass suffices: a
  subset's Gram is the sum of its heads' Grams and U-centring is linear, so its
  HSIC with any layer is a sum of per-head terms (A H A^T below). The projected
  tap mixes heads, so it takes a second pass once the subsets are known."""

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    if config.tap not in TAPS:
      raise ValueError(f"config.tap={config.tap!r} is not one of {TAPS}.")
    self.config, self.vit, self.res = config, models["vit"], models["resnet"]
    layers = self.vit.model.attention()
    if not 0 <= config.block < len(layers):
      raise ValueError(f"config.block={config.block} is outside 0..{len(layers) - 1}.")
    self.layer = layers[config.block]
    self.heads = self.layer.num_heads
    self.subset_size = config.subset_size or max(1, self.heads // 4)
    self.res_names = list(self.res.names)
    one_pass = config.tap == "heads"
    self.points = {"vit": [self.layer.weights] + [self.layer.heads] * one_pass}
    if one_pass:
      self.points["resnet"] = self.res_names
    self.groups: list[list[int]] = []

  def passes(self):
    return [self] if self.config.tap == "heads" else [self, _Projected(self)]

  def spatial_heads(self, out: dict):
    """(B, N, H, hd) per-head outputs of the spatial tokens, from the captured points."""
    return out[self.layer.heads][:, self.layer.num_prefix:]

  def step(self, forward, labels, mask) -> dict:
    del labels
    out = forward("vit")
    dist = jnp.asarray(ad.distances(self.layer), jnp.float32)
    w = out[self.layer.weights]
    sums = {"distance": ad.mean_distance(w, dist, self.layer.num_prefix, "drop").T @ mask}
    if self.config.tap == "heads":
      heads = self.spatial_heads(out)
      res = forward("resnet")
      reps = [heads[:, :, h] for h in range(self.heads)] + [res[n] for n in self.res_names]
      sums.update(forward.activation_sums(reps, mask))
    return sums

  def subsets(self, distance_sums: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
    head_dist = distance_sums / self.config.num_examples
    order = np.argsort(head_dist, kind="stable")
    return head_dist, subsets(order, self.subset_size, self.config.subset_stride)

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
    full = linear_cka.cka_from_hsic(pairs, [f"heads{g}" for g in groups] + self.res_names,
                                    moments / self.config.num_examples)
    sub_cka = full[:len(groups), len(groups):]
    sub_dist = [float(head_dist[g].mean()) for g in groups]
    summary = {"analysis": "head_subsets", "block": self.config.block, "tap": self.config.tap,
               "head_distance_px": head_dist.tolist(), "subsets": groups,
               "subset_distance_px": sub_dist, "resnet_layers": self.res_names,
               "cka": sub_cka.tolist(), "num_examples": self.config.num_examples}
    arrays = {"cka": sub_cka, "subset_distance": np.asarray(sub_dist), "head_distance": head_dist}
    return arrays, summary

  def plot(self, arrays, summary, workdir: str, figures: style.Figures) -> list:
    return [attention.head_subsets(arrays["subset_distance"], arrays["cka"], self.res_names,
                                   f"{self.vit.label} block {self.config.block}", self.res.label,
                                   results.workdir_path(workdir, "head_subsets.png"), figures)]


class _Projected(protocol.HsicPass):
  """Second pass of tap="projected": each subset's heads through the output projection."""

  def __init__(self, a: HeadSubsets):
    self.a = a
    self.points = {"vit": [a.layer.heads], "resnet": a.res_names}
    self.groups: list[list[int]] = []

  def setup(self, done) -> None:
    self.groups = self.a.subsets(done[0][0]["distance"])[1]

  def step(self, forward, labels, mask) -> dict:
    del labels
    kernel = self.a.vit.model.head_projection(self.a.vit.params, self.a.layer.block)
    heads = self.a.spatial_heads(forward("vit"))
    reps = [jnp.einsum("bnhd,hdo->bno", heads[:, :, g], kernel[jnp.asarray(g)]) for g in self.groups]
    res = forward("resnet")
    reps += [res[n] for n in self.a.res_names]
    return forward.activation_sums(reps, mask)


def _local_more_similar(s: dict) -> declaration.Verdict:
  dist = np.asarray(s["subset_distance_px"])
  mean_cka = np.asarray(s["cka"]).mean(axis=1)
  if len(dist) < 3 or np.ptp(dist) == 0:
    return None
  r = float(np.corrcoef(dist, mean_cka)[0, 1])
  return r < 0, (f"correlation of a subset's distance with its mean CKA {r:+.2f} over "
                 f"{len(dist)} subsets ({dist.min():.1f}-{dist.max():.1f} px)")


def key_numbers(s: dict) -> list[tuple[str, str]]:
  d, c = np.asarray(s["subset_distance_px"]), np.asarray(s["cka"]).mean(axis=1)
  return [("subsets", str(len(d))), ("subset distance, from / to (px)", f"{d.min():.1f} / {d.max():.1f}"),
          ("mean CKA of the most local / most global subset",
           f"{c[d.argmin()]:.3f} / {c[d.argmax()]:.3f}")]


DECLARATION = declaration.Declaration(
    name="head_subsets", build=HeadSubsets, models=declaration.Models(required=("vit", "resnet")),
    needs=(("vit", "attention"),),
    defaults=DEFAULTS, layers="all", figures="Fig 5", hsic_minibatches=True,
    key_numbers=key_numbers,
    findings=(declaration.Finding(
        "Subsets of first-block heads that attend more locally are more similar (CKA) to the "
        "lower ResNet layers; CKA falls as the subset's mean attention distance grows (here: "
        "a negative correlation of a subset's distance with its mean CKA).", _local_more_similar),))
