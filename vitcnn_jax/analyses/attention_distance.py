"""Mean attention distance per layer and head (paper Figs 3, 4, C.5, C.6).

For each head: the attention-weighted pixel distance between query and key
patch centres, averaged over queries and images. CLS convention
(`config.cls`): "drop" (default; the convention of Kornblith's gist linked to
the paper's authors: CLS row and column removed, rows not renormalised, so
CLS attention mass counts as distance 0), or "renormalize" (rows rescaled to
sum to 1 over spatial keys).

Any number of ViTs under any names (e.g. DINO against CLIP): the first in name
order is the paper's figure and the top-level results; each other one has its own figure,
arrays `mean_distance_NAME` and an entry of `summary["models"]`, and a
comparison figure shows them all against relative depth.
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


class _Model:
  """One model's attention layers and the distances between its patch centres."""

  def __init__(self, name: str, m, plot_blocks: tuple[int, ...]):
    self.name, self.m = name, m
    self.patch = square_patch(m.model, f"config.models.{name}")
    layers = [a for a in m.model.attention() if a.weights in m.names]
    if not layers:
      raise ValueError(f"config.models.{name}.capture selects no attention weights "
                       "(`blockNN/attn/weights`).")
    self.names, self.blocks = [a.weights for a in layers], [a.block for a in layers]
    missing = [b for b in plot_blocks if b not in self.blocks]
    if missing:
      raise ValueError(f"config.plot_blocks {missing} are not among the captured blocks "
                       f"{self.blocks} of config.models.{name}.")
    self.ceiling = distance_matrix(m.model.grid, self.patch)

  def summary(self, mean: np.ndarray) -> dict:
    return {"checkpoint": self.m.path, "label": self.m.label, "patch_size": self.patch,
            "grid": list(self.m.model.grid), "blocks": self.blocks,
            "prefix_tokens": list(self.m.model.prefix_tokens),  # left out: spatial queries, keys
            "mean_distance_px": mean.tolist(), "uniform_ceiling_px": float(self.ceiling.mean())}


class AttentionDistance(protocol.Analysis):
  """One pass: per model, block and head, the attention distance summed over
  images. The first model's (in name order) are also the top-level results
  (the paper's figure); with more, every model gets its own figure and one compares them."""

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    if config.cls not in CLS_CONVENTIONS:
      raise ValueError(f"config.cls={config.cls!r} is not one of {CLS_CONVENTIONS}.")
    self.config = config
    self.models = [_Model(k, m, tuple(config.plot_blocks)) for k, m in models.items()]
    self.points = {a.name: a.names for a in self.models}

  def step(self, forward, labels, mask) -> dict:
    del labels
    sums = {}
    for a in self.models:
      out = forward(a.name)
      dist = jnp.asarray(a.ceiling, jnp.float32)
      per = jnp.stack([mean_distance(out[n], dist, a.m.model.num_prefix_tokens, self.config.cls)
                       for n in a.names])  # (L, B, H)
      sums[f"distance/{a.name}"] = jnp.einsum("lbh,b->lh", per, mask)
    return sums

  def finalize(self, sums):
    means = {a.name: sums[0][0][f"distance/{a.name}"] / self.config.num_examples
             for a in self.models}
    first = self.models[0]
    per_model = {a.name: a.summary(means[a.name]) for a in self.models}
    summary = {"analysis": "attention_distance", **per_model[first.name],
               "cls": self.config.cls, "num_examples": self.config.num_examples}
    arrays = {"mean_distance": means[first.name], "blocks": np.asarray(first.blocks)}
    if len(self.models) > 1:
      summary["models"] = per_model
      for a in self.models:
        arrays[f"mean_distance_{a.name}"] = means[a.name]
        arrays[f"blocks_{a.name}"] = np.asarray(a.blocks)
    return arrays, summary

  def plot(self, arrays, summary, workdir: str) -> None:
    plot_blocks = list(self.config.plot_blocks) or None
    for i, a in enumerate(self.models):
      s = summary["models"][a.name] if i else summary
      name = "attention_distance" + (f"_{a.name}" if i else "")
      plotting.attention_distance(np.asarray(s["mean_distance_px"]), s["blocks"], plot_blocks,
                                  a.m.label, s["uniform_ceiling_px"],
                                  results.workdir_path(workdir, f"{name}.png"))
    if len(self.models) > 1:
      plotting.attention_distance_compare(
          [(np.asarray(s["mean_distance_px"]), s["blocks"], s["label"], s["uniform_ceiling_px"])
           for s in summary["models"].values()],
          results.workdir_path(workdir, "attention_distance_compare.png"))


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
    models=declaration.Models(any_names=True), needs=(("*", "attention"), ("*", "tokens")),
    defaults=DEFAULTS, layers=("block*/attn/weights",),
    figures="Figs 3, 4, C.5, C.6", key_numbers=key_numbers,
    findings=(declaration.Finding(
        "With large pre-training data, lower ViT blocks have both local and global heads; "
        "higher blocks attend globally, near the uniform-attention distance (here: the lowest "
        "block's heads reach below half and above 0.8 of the uniform distance, the highest "
        "block's all lie above 0.8 of it). Trained on ImageNet alone, lower blocks lose their "
        "local heads.", _local_and_global),))
