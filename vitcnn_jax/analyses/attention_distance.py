"""Mean attention distance per layer and head (paper Figs 3, 4, C.5, C.6).

For each head: the attention-weighted pixel distance between query and key
token centres on the image, averaged over queries and images; where the
tokens lie is the model's anatomy (`AttentionLayer.positions`): a ViT's patch
grid, or a Swin's windows with their shift undone (each block read against
the uniform attention of its own windows). CLS convention
(`config.cls`): "drop" (default; the convention of Kornblith's gist linked to
the paper's authors: CLS row and column removed, rows not renormalised, so
CLS attention mass counts as distance 0), or "renormalize" (rows rescaled to
sum to 1 over spatial keys). Both conventions are computed from the same pass,
with each head's attention mass on the prefix tokens (what `drop` counts as
distance 0), so that the finding's check shows whether its verdict rests on the
convention.

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

from vitcnn_jax.models import anatomy
from vitcnn_jax.plotting import attention
from vitcnn_jax.plotting import style
from vitcnn_jax.run import declaration
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results

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


def _windowed(weights: jax.Array) -> jax.Array:
  return weights[:, None] if weights.ndim == 4 else weights


def prefix_mass(weights: jax.Array, num_prefix: int) -> jax.Array:
  """(B, H): the attention the spatial queries give the prefix tokens (CLS,
  registers), averaged over those queries (and windows)."""
  w = _windowed(weights)[..., num_prefix:, :num_prefix]
  return w.sum(-1).mean(axis=(1, 3))


def mean_distance(weights: jax.Array, dist: jax.Array, num_prefix: int,
                  cls: str = "drop") -> jax.Array:
  """(B, H, T, T) attention, or (B, windows, H, T, T) within windows, and (windows,
  N, N) distances -> (B, H) mean distance over the spatial queries."""
  w = _windowed(weights)[..., num_prefix:, num_prefix:]
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

  def _key(self, name: str, cls: str) -> str:
    """The sum of a model's distances under `cls`: the config's convention unmarked."""
    return f"distance/{name}" + ("" if cls == self.config.cls else f"/{cls}")

  def step(self, forward, labels, mask) -> dict:
    del labels
    sums = {}
    for a in self.models:
      out = forward(a.name)
      summed = lambda per, a=a: jnp.einsum("lbh,b->lh", jnp.stack(  # (B, H) each, heads padded
          [jnp.pad(p, ((0, 0), (0, a.heads - p.shape[1]))) for p in per]), mask)
      for cls in CLS_CONVENTIONS:  # the config's convention, and the other for the findings' check
        sums[self._key(a.name, cls)] = summed(
            [mean_distance(out[n], jnp.asarray(d), layer.num_prefix, cls)
             for n, d, layer in zip(a.names, a.dist, a.layers)])
      sums[f"prefix/{a.name}"] = summed([prefix_mass(out[n], layer.num_prefix)
                                         for n, layer in zip(a.names, a.layers)])
    return sums

  def finalize(self, sums):
    per_model, arrays = {}, {}
    for a in self.models:
      averaged = lambda key: np.asarray(sums[0][0][key], np.float64) / self.config.num_examples
      by_cls = {cls: averaged(self._key(a.name, cls)) for cls in CLS_CONVENTIONS}
      prefix = averaged(f"prefix/{a.name}")
      for layer_rows in (*by_cls.values(), prefix):
        for row, layer in zip(layer_rows, a.layers):
          row[layer.num_heads:] = np.nan  # a stage of fewer heads
      per_model[a.name] = a.summary(by_cls[self.config.cls])
      heads = lambda rows, a=a: [row[:layer.num_heads].tolist() for row, layer in zip(rows, a.layers)]
      per_model[a.name].update(mean_distance_px_by_cls={cls: heads(v) for cls, v in by_cls.items()},
                               prefix_attention=heads(prefix))
      mean = by_cls[self.config.cls]
      suffix = f"_{a.name}" if len(self.models) > 1 else ""
      arrays.update({f"mean_distance{suffix}": mean, f"prefix_attention{suffix}": prefix,
                     f"blocks{suffix}": np.asarray(a.blocks),
                     f"uniform_distance{suffix}": np.asarray(per_model[a.name]["uniform_ceiling_px"])})
    first = self.models[0]
    summary = {"analysis": "attention_distance", **per_model[first.name],
               "cls": self.config.cls, "num_examples": self.config.num_examples}
    if len(self.models) > 1:
      summary["models"] = per_model
      arrays.update({k: arrays[f"{k}_{first.name}"]
                     for k in ("mean_distance", "prefix_attention", "blocks", "uniform_distance")})
    return arrays, summary

  def plot(self, arrays, summary, workdir: str, figures: style.Figures) -> list:
    plot_blocks = list(self.config.plot_blocks) or None
    out = []
    for i, a in enumerate(self.models):
      s = summary["models"][a.name] if i else summary
      name = "attention_distance" + (f"_{a.name}" if i else "")
      out.append(attention.distances(rows(s), s["blocks"], plot_blocks, a.m.label, ceilings(s),
                                     results.workdir_path(workdir, f"{name}.png"), figures))
    if len(self.models) > 1:
      out.append(attention.distances_compared(
          [(rows(s), s["blocks"], s["label"], ceilings(s)) for s in summary["models"].values()],
          results.workdir_path(workdir, "attention_distance_compare.png"), figures))
    return out


def _px(values: np.ndarray) -> str:
  """One distance, or the first and last block's where they differ (a Swin's stages)."""
  return f"{values[0]:.1f}" if np.ptp(values) < 0.05 else f"{values[0]:.1f} / {values[-1]:.1f}"


def _spread(rows: list[np.ndarray], ceiling: np.ndarray, blocks: list, which: list[int]) -> str:
  return "; ".join(f"block {blocks[i]}: {rows[i].min():.1f}-{rows[i].max():.1f} px "
                   f"(uniform {ceiling[i]:.1f})" for i in which)


def _lower_and_higher(count: int) -> dict[str, tuple[list[int], list[int]]]:
  """The readings of "lower" and "higher" blocks (indices among `count`), as the
  paper's Fig 3 (the two lowest and two highest) and by quarters, each once."""
  two, quarter = min(2, count // 2), max(1, count // 4)
  out = {"two lowest and highest": (list(range(two)), list(range(count - two, count))),
         "lowest and highest quarter": (list(range(quarter)), list(range(count - quarter, count)))}
  return out if two != quarter else dict(list(out.items())[:1])


def _local_and_global(s: dict) -> declaration.Verdict | declaration.Variants:
  """Under each CLS convention (the run's first) and reading of lower and higher
  blocks: the lower blocks' heads together reach below half and above 0.8 of
  their blocks' uniform distances; every head of every higher block lies above 0.8."""
  ceiling, own = ceilings(s), s.get("cls", "drop")
  by_cls = s.get("mean_distance_px_by_cls") or {own: s["mean_distance_px"]}
  if len(ceiling) < 2:
    return None
  prefix = s.get("prefix_attention")
  mass = (f"; attention on prefix tokens {np.nanmean(np.asarray(prefix[0], np.float64)):.1%} in block "
          f"{s['blocks'][0]}" if prefix and s.get("prefix_tokens") else "")
  out = {}
  for cls in sorted(by_cls, key=lambda c: c != own):
    rows_ = [np.asarray(r, np.float64) for r in by_cls[cls]]
    for reading, (low, high) in _lower_and_higher(len(rows_)).items():
      local = any(rows_[i].min() < 0.5 * ceiling[i] for i in low)
      far = any(rows_[i].max() > 0.8 * ceiling[i] for i in low)
      global_ = all(rows_[i].min() > 0.8 * ceiling[i] for i in high)
      out[f"cls={cls}, blocks={reading}"] = (
          local and far and global_, f"{_spread(rows_, ceiling, s['blocks'], low)}; ... "
          f"{_spread(rows_, ceiling, s['blocks'], high)}" + (mass if cls == "drop" else ""))
  return out if len(out) > 1 else next(iter(out.values()))


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
        "higher blocks attend globally, near the uniform-attention distance (here: the lower "
        "blocks' heads together reach below half and above 0.8 of the uniform distance, every "
        "head of the higher blocks lies above 0.8 of it; lower and higher as the paper's Fig 3, "
        "the two lowest and two highest blocks, and by quarters; under either CLS convention). "
        "Trained on ImageNet alone, lower blocks lose their local heads.", _local_and_global),))
