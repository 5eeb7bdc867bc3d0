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

from vitcnn_jax import declaration
from vitcnn_jax import plotting
from vitcnn_jax import protocol
from vitcnn_jax import results

DEFAULTS = {
    "num_examples": 5000,  # the paper: 5,000 ImageNet validation images
    "batch_size": 100,  # per device (any size gives the same result)
    "seed": 0,
    "cls": "drop",  # "drop" (authors' gist: no renormalisation) or "renormalize"
    "plot_blocks": (),  # blocks of the sorted-heads panel; (): first two and last two
}
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


def square_patch(model, where: str) -> int:
  """The side of a model's square patches (what distances are measured in)."""
  patch = model.token_pixels
  if patch[0] != patch[1]:
    raise ValueError(f"{where}: non-square patches {patch} are not supported.")
  return patch[0]


class AttentionDistance(protocol.Analysis):
  """One pass: per block and head, the attention distance summed over images."""

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    if config.cls not in CLS_CONVENTIONS:
      raise ValueError(f"config.cls={config.cls!r} is not one of {CLS_CONVENTIONS}.")
    self.config, self.m = config, models["vit"]
    self.patch = square_patch(self.m.model, "config.models.vit")
    layers = [a for a in self.m.model.attention() if a.weights in self.m.names]
    if not layers:
      raise ValueError("config.models.vit.capture selects no attention weights "
                       "(`blockNN/attn/weights`).")
    self.names, self.blocks = [a.weights for a in layers], [a.block for a in layers]
    missing = [b for b in config.plot_blocks if b not in self.blocks]
    if missing:
      raise ValueError(f"config.plot_blocks {missing} are not among the captured blocks {self.blocks}.")
    self.points = {"vit": self.names}
    self.ceiling = distance_matrix(self.m.model.grid, self.patch)

  def step(self, forward, labels, mask) -> dict:
    del labels
    out = forward("vit")
    dist = jnp.asarray(self.ceiling, jnp.float32)
    per = jnp.stack([mean_distance(out[n], dist, self.m.model.num_prefix_tokens, self.config.cls)
                     for n in self.names])  # (L, B, H)
    return {"distance": jnp.einsum("lbh,b->lh", per, mask)}

  def finalize(self, sums):
    mean = sums[0][0]["distance"] / self.config.num_examples
    summary = {"analysis": "attention_distance", "checkpoint": self.m.path, "label": self.m.label,
               "cls": self.config.cls, "num_examples": self.config.num_examples,
               "patch_size": self.patch, "grid": list(self.m.model.grid), "blocks": self.blocks,
               "prefix_tokens": list(self.m.model.prefix_tokens),  # left out: spatial queries, keys
               "mean_distance_px": mean.tolist(), "uniform_ceiling_px": float(self.ceiling.mean())}
    return {"mean_distance": mean, "blocks": np.asarray(self.blocks)}, summary

  def plot(self, arrays, summary, workdir: str) -> None:
    plotting.attention_distance(arrays["mean_distance"], summary["blocks"],
                                list(self.config.plot_blocks) or None, self.m.label,
                                summary["uniform_ceiling_px"],
                                results.workdir_path(workdir, "attention_distance.png"))


def _local_and_global(s: dict) -> declaration.Verdict:
  """The lowest block's heads span local to global (nearest below half the uniform
  distance, farthest above 0.8 of it); the highest block's are all global."""
  mean, ceiling = np.asarray(s["mean_distance_px"]), s["uniform_ceiling_px"]
  if len(mean) < 2:
    return None
  low, high = mean[0], mean[-1]
  shown = low.min() < 0.5 * ceiling and low.max() > 0.8 * ceiling and high.min() > 0.8 * ceiling
  return shown, (f"uniform {ceiling:.1f} px; block {s['blocks'][0]}: {low.min():.1f}-{low.max():.1f} px; "
                 f"block {s['blocks'][-1]}: {high.min():.1f}-{high.max():.1f} px")


def key_numbers(s: dict) -> list[tuple[str, str]]:
  mean = np.asarray(s["mean_distance_px"])
  return [("uniform-attention distance (px)", f"{s['uniform_ceiling_px']:.1f}"),
          (f"block {s['blocks'][0]}: heads from / to (px)", f"{mean[0].min():.1f} / {mean[0].max():.1f}"),
          (f"block {s['blocks'][-1]}: heads from / to (px)", f"{mean[-1].min():.1f} / {mean[-1].max():.1f}")]


DECLARATION = declaration.Declaration(
    name="attention_distance", build=AttentionDistance,
    models=declaration.Models(required=("vit",)), needs=(("vit", "attention"), ("vit", "tokens")),
    defaults=DEFAULTS, layers=("block*/attn/weights",),
    figures="Figs 3, 4, C.5, C.6", key_numbers=key_numbers,
    findings=(declaration.Finding(
        "With large pre-training data, lower ViT blocks have both local and global heads; "
        "higher blocks attend globally, near the uniform-attention distance (here: the lowest "
        "block's heads reach below half and above 0.8 of the uniform distance, the highest "
        "block's all lie above 0.8 of it). Trained on ImageNet alone, lower blocks lose their "
        "local heads.", _local_and_global),))
