"""Mean attention distance per layer and head (paper Figs 3, 4, C.5, C.6).

For each head: the attention-weighted pixel distance between query and key
token centres on the image, averaged over queries and images; where the
tokens lie is the model's anatomy (`AttentionLayer.positions`): a ViT's patch
grid, or a Swin's windows with their shift undone (each block read against
the uniform attention of its own windows). CLS convention
(`config.cls`): "drop" (default; the convention of Kornblith's gist linked to
the paper's authors: CLS row and column removed, rows not renormalised, so
CLS attention mass counts as distance 0), or "renormalize" (rows rescaled to
sum to 1 over spatial keys).

Any number of models under any names (e.g. DINO against CLIP): the first in name
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
from vitcnn_jax.models import anatomy

DEFAULTS = {
    "num_examples": 5000,  # the paper: 5,000 ImageNet validation images
    "batch_size": 100,  # per device (any size gives the same result)
    "seed": 0,
    "cls": "drop",  # "drop" (authors' gist: no renormalisation) or "renormalize"
    "plot_blocks": (),  # blocks of the sorted-heads panel; (): first two and last two
}
CLS_CONVENTIONS = ("drop", "renormalize")


def distances(layer: anatomy.AttentionLayer) -> np.ndarray:
  """(windows, N, N) pixel distances between the centres of a layer's spatial tokens."""
  p = layer.positions
  return np.linalg.norm(p[:, :, None] - p[:, None, :], axis=-1)


def uniform_distance(layer: anatomy.AttentionLayer) -> float:
  """The mean distance of attention spread evenly over the keys each spatial query
  may attend (its window's, unmasked): the ceiling a layer's heads are read against."""
  d = distances(layer)
  allowed = np.ones(d.shape, bool) if layer.allowed is None else layer.allowed
  return float(((d * allowed).sum(-1) / allowed.sum(-1)).mean())


def mean_distance(weights: jax.Array, dist: jax.Array, num_prefix: int,
                  cls: str = "drop") -> jax.Array:
  """(B, H, T, T) attention, or (B, windows, H, T, T) within windows, and (windows,
  N, N) distances -> (B, H) mean distance over the spatial queries."""
  if weights.ndim == 4:
    weights = weights[:, None]
  w = weights[..., num_prefix:, num_prefix:]
  if cls == "renormalize":
    w = w / w.sum(axis=-1, keepdims=True)
  elif cls != "drop":
    raise ValueError(f"cls={cls!r} is not one of {CLS_CONVENTIONS}.")
  return jnp.einsum("bwhqk,wqk->bhwq", w, dist.reshape((-1,) + dist.shape[-2:]),
                    precision=jax.lax.Precision.HIGHEST).mean(axis=(2, 3))


def rows(s: dict) -> list[np.ndarray]:
  """A summary's per-block head distances (blocks may differ in heads)."""
  return [np.asarray(r, np.float64) for r in s["mean_distance_px"]]


def ceilings(s: dict) -> np.ndarray:
  """A summary's per-block uniform-attention distances."""
  return np.broadcast_to(np.asarray(s["uniform_ceiling_px"], np.float64), (len(s["blocks"]),))


class _Model:
  """One model's attention layers and the distances between their tokens."""

  def __init__(self, name: str, m, plot_blocks: tuple[int, ...]):
    self.name, self.m = name, m
    layers = [a for a in m.model.attention() if a.weights in m.names]
    if not layers:
      raise ValueError(f"config.models.{name}.capture selects no attention weights "
                       f"(e.g. `{m.model.attention()[0].weights}`).")
    self.layers = layers
    self.names, self.blocks = [a.weights for a in layers], [a.block for a in layers]
    missing = [b for b in plot_blocks if b not in self.blocks]
    if missing:
      raise ValueError(f"config.plot_blocks {missing} are not among the captured blocks "
                       f"{self.blocks} of config.models.{name}.")
    self.dist = [distances(a).astype(np.float32) for a in layers]
    self.heads = max(a.num_heads for a in layers)

  def summary(self, mean: np.ndarray) -> dict:
    model = self.m.model
    return {"checkpoint": self.m.path, "label": self.m.label, "blocks": self.blocks,
            "grid": model.grid and list(model.grid),  # None: maps that change across stages
            "token_pixels": model.token_pixels and list(model.token_pixels),
            "windowed": any(len(a.positions) > 1 for a in self.layers),
            "prefix_tokens": list(model.prefix_tokens),  # left out: spatial queries, keys
            "heads": [a.num_heads for a in self.layers],
            "mean_distance_px": [row[:a.num_heads].tolist() for row, a in zip(mean, self.layers)],
            "uniform_ceiling_px": [uniform_distance(a) for a in self.layers]}


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
      per = [mean_distance(out[n], jnp.asarray(d), layer.num_prefix, self.config.cls)
             for n, d, layer in zip(a.names, a.dist, a.layers)]  # (B, H) each
      per = jnp.stack([jnp.pad(p, ((0, 0), (0, a.heads - p.shape[1]))) for p in per])
      sums[f"distance/{a.name}"] = jnp.einsum("lbh,b->lh", per, mask)
    return sums

  def finalize(self, sums):
    per_model, arrays = {}, {}
    for a in self.models:
      mean = np.asarray(sums[0][0][f"distance/{a.name}"], np.float64) / self.config.num_examples
      for row, layer in zip(mean, a.layers):
        row[layer.num_heads:] = np.nan  # a stage of fewer heads
      per_model[a.name] = a.summary(mean)
      suffix = f"_{a.name}" if len(self.models) > 1 else ""
      arrays.update({f"mean_distance{suffix}": mean, f"blocks{suffix}": np.asarray(a.blocks),
                     f"uniform_distance{suffix}": np.asarray(per_model[a.name]["uniform_ceiling_px"])})
    first = self.models[0]
    summary = {"analysis": "attention_distance", **per_model[first.name],
               "cls": self.config.cls, "num_examples": self.config.num_examples}
    if len(self.models) > 1:
      summary["models"] = per_model
      arrays.update({k: arrays[f"{k}_{first.name}"]
                     for k in ("mean_distance", "blocks", "uniform_distance")})
    return arrays, summary

  def plot(self, arrays, summary, workdir: str) -> None:
    plot_blocks = list(self.config.plot_blocks) or None
    for i, a in enumerate(self.models):
      s = summary["models"][a.name] if i else summary
      name = "attention_distance" + (f"_{a.name}" if i else "")
      plotting.attention_distance(rows(s), s["blocks"], plot_blocks, a.m.label, ceilings(s),
                                  results.workdir_path(workdir, f"{name}.png"))
    if len(self.models) > 1:
      plotting.attention_distance_compare(
          [(rows(s), s["blocks"], s["label"], ceilings(s)) for s in summary["models"].values()],
          results.workdir_path(workdir, "attention_distance_compare.png"))


def _px(values: np.ndarray) -> str:
  """One distance, or the first and last block's where they differ (a Swin's stages)."""
  return f"{values[0]:.1f}" if np.ptp(values) < 0.05 else f"{values[0]:.1f} / {values[-1]:.1f}"


def _local_and_global(s: dict) -> declaration.Verdict:
  """The lowest block's heads span local to global (nearest below half its uniform
  distance, farthest above 0.8 of it); the highest block's are all global."""
  mean, ceiling = rows(s), ceilings(s)
  if len(mean) < 2:
    return None
  (low, high), (c0, c1) = (mean[0], mean[-1]), (ceiling[0], ceiling[-1])
  shown = low.min() < 0.5 * c0 and low.max() > 0.8 * c0 and high.min() > 0.8 * c1
  return shown, (f"uniform {_px(ceiling[[0, -1]])} px; block {s['blocks'][0]}: "
                 f"{low.min():.1f}-{low.max():.1f} px; "
                 f"block {s['blocks'][-1]}: {high.min():.1f}-{high.max():.1f} px")


def key_numbers(s: dict) -> list[tuple[str, str]]:
  mean, ceiling = rows(s), ceilings(s)
  what = "" if np.ptp(ceiling[[0, -1]]) < 0.05 else ", first / last block"
  return [(f"uniform-attention distance{what} (px)", _px(ceiling[[0, -1]])),
          (f"block {s['blocks'][0]}: heads from / to (px)", f"{mean[0].min():.1f} / {mean[0].max():.1f}"),
          (f"block {s['blocks'][-1]}: heads from / to (px)", f"{mean[-1].min():.1f} / {mean[-1].max():.1f}")]


DECLARATION = declaration.Declaration(
    name="attention_distance", build=AttentionDistance,
    models=declaration.Models(any_names=True), needs=(("*", "attention"),),
    defaults=DEFAULTS, layers="attention",
    figures="Figs 3, 4, C.5, C.6", key_numbers=key_numbers,
    findings=(declaration.Finding(
        "With large pre-training data, lower ViT blocks have both local and global heads; "
        "higher blocks attend globally, near the uniform-attention distance (here: the lowest "
        "block's heads reach below half and above 0.8 of the uniform distance, the highest "
        "block's all lie above 0.8 of it). Trained on ImageNet alone, lower blocks lose their "
        "local heads.", _local_and_global),))
