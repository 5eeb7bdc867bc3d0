"""Mean attention distance per layer and head (paper Figs 3, 4, C.5, C.6).

For each head: the attention-weighted pixel distance between query and key
patch centres, averaged over queries and images. CLS convention
(`config.cls`): "drop" (default; the convention of Kornblith's gist linked to
the paper's authors: CLS row and column removed, rows not renormalised, so
CLS attention mass counts as distance 0), or "renormalize" (rows rescaled to
sum to 1 over spatial keys).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax import plotting
from vitcnn_jax import results
from vitcnn_jax.models import common

CLS_CONVENTIONS = ("drop", "renormalize")


def distance_matrix(grid: tuple[int, int], patch: int) -> np.ndarray:
  """(N, N) pixel distances between patch centres, tokens in row-major order."""
  ys, xs = np.divmod(np.arange(grid[0] * grid[1]), grid[1])
  pos = np.stack([ys, xs], axis=-1).astype(np.float64)
  return patch * np.linalg.norm(pos[:, None] - pos[None, :], axis=-1)


def mean_distance(weights: jax.Array, dist: jax.Array, num_prefix: int,
                  cls: str = "drop") -> jax.Array:
  """(B, H, T, T) attention -> (B, H) mean distance over spatial queries."""
  w = weights[:, :, num_prefix:, num_prefix:]
  if cls == "renormalize":
    w = w / w.sum(axis=-1, keepdims=True)
  elif cls != "drop":
    raise ValueError(f"cls={cls!r} is not one of {CLS_CONVENTIONS}.")
  return jnp.einsum("bhqk,qk->bhq", w, dist, precision=jax.lax.Precision.HIGHEST).mean(axis=-1)


MODELS = ("vit",)


class AttentionDistance:
  """One pass: per block and head, the attention distance summed over images."""
  name = title = "attention_distance"
  repeats, labels = 1, False

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    if config.cls not in CLS_CONVENTIONS:
      raise ValueError(f"config.cls={config.cls!r} is not one of {CLS_CONVENTIONS}.")
    self.config, self.m = config, models["vit"]
    if self.m.model.family != "vit":
      raise ValueError(f"config.models.vit: attention distance needs a ViT, got a {self.m.model.family} checkpoint.")
    patch = common.to_pair(self.m.model.patch_size)
    if patch[0] != patch[1]:
      raise ValueError(f"config.models.vit: non-square patches {patch} are not supported.")
    self.names = [n for n in self.m.names if n.endswith("/attn/weights") and not n.startswith("map/")]
    if not self.names:
      raise ValueError("config.models.vit.capture selects no `blockNN/attn/weights`.")
    blocks = [int(n.split("/")[0][5:]) for n in self.names]
    missing = [b for b in config.plot_blocks if b not in blocks]
    if missing:
      raise ValueError(f"config.plot_blocks {missing} are not among the captured blocks {blocks}.")
    self.points = {"vit": self.names}
    self.patch = patch[0]
    self.ceiling = distance_matrix(self.m.model.grid, self.patch)

  def passes(self):
    return [self]

  def step(self, forward, labels, mask) -> dict:
    del labels
    out = forward("vit")
    dist = jnp.asarray(self.ceiling, jnp.float32)
    per = jnp.stack([mean_distance(out[n], dist, self.m.model.num_prefix_tokens, self.config.cls)
                     for n in self.names])  # (L, B, H)
    return {"distance": jnp.einsum("lbh,b->lh", per, mask)}

  def finalize(self, sums):
    mean = sums[0][0]["distance"] / self.config.num_examples
    blocks = [int(n.split("/")[0][5:]) for n in self.names]
    summary = {"analysis": "attention_distance", "checkpoint": self.m.path, "label": self.m.label,
               "cls": self.config.cls, "num_examples": self.config.num_examples,
               "patch_size": self.patch, "grid": list(self.m.model.grid), "blocks": blocks,
               "mean_distance_px": mean.tolist(), "uniform_ceiling_px": float(self.ceiling.mean())}
    return {"mean_distance": mean, "blocks": np.asarray(blocks)}, summary

  def plot(self, arrays, summary, workdir: str) -> None:
    plotting.attention_distance(arrays["mean_distance"], summary["blocks"],
                                list(self.config.plot_blocks) or None, self.m.label,
                                summary["uniform_ceiling_px"],
                                results.workdir_path(workdir, "attention_distance.png"))


build = AttentionDistance
