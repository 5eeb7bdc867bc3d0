"""Skip-connection norm ratio ||z|| / ||f(z)|| (paper Figs 7, E.1, E.2).

ViT and MLP-Mixer: for every block, sublayer (attention or token mixing, MLP or
channel mixing) and token, z is the sublayer's input carried by the skip
connection and f(z) its long branch (App. H for the Mixer); ResNet-v2: for
every unit, z is the shortcut and f(z) the conv branch, per spatial position.
Ratios (and the cosine similarity between branch and output, Fig E.2) are
averaged over images; a zero branch gives an infinite ratio, never NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax import plotting
from vitcnn_jax import results

# Per token-model family: (sublayer, skip input z, branch f(z)) of every block.
SUBLAYERS = {"vit": (("attn", "in", "attn/out"), ("mlp", "attn/residual", "mlp/out")),
             "mixer": (("token", "in", "token_mlp/out"), ("channel", "token_mlp/residual",
                                                          "channel_mlp/out"))}
BIT_POINTS = ("shortcut", "conv3")


def ratio_and_cosine(z: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per position (last axis = channels): ||z|| / ||f|| and cos(f, z + f)."""
  hp = jax.lax.Precision.HIGHEST
  zn = jnp.sqrt(jnp.einsum("...c,...c->...", z, z, precision=hp))
  fn = jnp.sqrt(jnp.einsum("...c,...c->...", f, f, precision=hp))
  ratio = jnp.where(fn > 0, zn / jnp.where(fn > 0, fn, 1.0), jnp.inf)
  out = z + f
  on = jnp.sqrt(jnp.einsum("...c,...c->...", out, out, precision=hp))
  den = fn * on
  cos = jnp.where(den > 0, jnp.einsum("...c,...c->...", f, out, precision=hp) / jnp.where(den > 0, den, 1.0), 0.0)
  return ratio, cos


def _masked_sum(x: jax.Array, mask: jax.Array, axis: int) -> jax.Array:
  """Sum over the examples axis of the valid rows only: a padding row's infinite
  ratio times a zero mask would be NaN."""
  shape = [1] * x.ndim
  shape[axis] = -1
  return jnp.where(mask.reshape(shape) > 0, x, 0.0).sum(axis=axis)


def _token_names(family: str, depth: int) -> list[str]:
  return [f"block{b:02d}/{p}" for b in range(depth) for _, z, f in SUBLAYERS[family] for p in (z, f)]


def _bit_units(names: list[str]) -> list[str]:
  return sorted({n.rsplit("/", 1)[0] for n in names if n.endswith("/conv3")})


MODELS, OPTIONAL_MODELS, ONE_OF = (), ("vit", "mixer", "resnet"), ("vit", "mixer")
TOKEN_MODELS = ("vit", "mixer")


class SkipRatio:
  """One pass: ratios and cosines summed over images (ViT and Mixer per token,
  ResNet per unit)."""
  name, title, repeats, labels = "skip_ratio", "skip ratio", 1, False

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    self.config, self.bit = config, models.get("resnet")
    self.tokens = {k: models[k] for k in TOKEN_MODELS if k in models}
    self.depth, self.points = {}, {}
    for k, m in self.tokens.items():
      if m.model.family != k:
        raise ValueError(f"config.models.{k} must be a {k} checkpoint, got a {m.model.family} one.")
      self.depth[k] = m.model.depth if k == "vit" else m.model.num_blocks
      self.points[k] = _token_names(k, self.depth[k])
    self.units = []
    if self.bit is not None:
      if self.bit.model.family != "bit":
        raise ValueError(f"config.models.resnet must be a BiT ResNet, got a {self.bit.model.family} checkpoint.")
      self.units = _bit_units(self.bit.names)
      self.points["resnet"] = [f"{u}/{p}" for u in self.units for p in BIT_POINTS]

  def passes(self):
    return [self]

  def step(self, forward, labels, mask) -> dict:
    del labels
    sums = {}
    for k in self.tokens:
      out = forward(k)
      pairs = [(out[f"block{b:02d}/{z}"], out[f"block{b:02d}/{f}"])
               for b in range(self.depth[k]) for _, z, f in SUBLAYERS[k]]
      r, c = (jnp.stack(v) for v in zip(*[ratio_and_cosine(z, f) for z, f in pairs]))  # (2 depth, B, T)
      sums[f"{k}_ratio"], sums[f"{k}_cosine"] = _masked_sum(r, mask, 1), _masked_sum(c, mask, 1)
    if self.bit is not None:
      out = forward("resnet")
      r, c = zip(*[ratio_and_cosine(out[f"{u}/shortcut"], out[f"{u}/conv3"]) for u in self.units])
      sums["bit_ratio"] = _masked_sum(jnp.stack([x.mean(axis=(1, 2)) for x in r]), mask, 1)
      sums["bit_cosine"] = _masked_sum(jnp.stack([x.mean(axis=(1, 2)) for x in c]), mask, 1)
    return sums

  def finalize(self, sums):
    s, n = sums[0][0], self.config.num_examples
    summary, arrays = {"analysis": "skip_ratio", "num_examples": n}, {}
    for k, m in self.tokens.items():
      ratio = s[f"{k}_ratio"].reshape(self.depth[k], 2, -1) / n  # (block, sublayer, token)
      prefix = m.model.num_prefix_tokens
      summary[k] = {"checkpoint": m.path, "label": m.label,
                    "sublayers": [name for name, _, _ in SUBLAYERS[k]],
                    "cls_ratio": ratio[:, :, 0].tolist() if prefix else None,
                    "spatial_ratio": ratio[:, :, prefix:].mean(axis=-1).tolist()}
      arrays[f"{k}_ratio"] = ratio
      arrays[f"{k}_cosine"] = s[f"{k}_cosine"].reshape(self.depth[k], 2, -1) / n
    if self.bit is not None:
      summary["bit"] = {"checkpoint": self.bit.path, "label": self.bit.label, "units": self.units,
                        "ratio": (s["bit_ratio"] / n).tolist(), "cosine": (s["bit_cosine"] / n).tolist()}
      arrays.update(bit_ratio=s["bit_ratio"] / n, bit_cosine=s["bit_cosine"] / n,
                    bit_units=np.asarray(self.units))
    return arrays, summary

  def plot(self, arrays, summary, workdir: str) -> None:
    bit = (arrays["bit_ratio"], self.bit.label) if self.bit is not None else None
    for k, m in self.tokens.items():
      plotting.skip_ratio(arrays[f"{k}_ratio"], arrays[f"{k}_cosine"], m.model.num_prefix_tokens,
                          self.config.plot_tokens, m.label, bit,
                          [name for name, _, _ in SUBLAYERS[k]],
                          results.workdir_path(workdir, "skip_ratio.png" if k == "vit"
                                               else f"skip_ratio_{k}.png"))


build = SkipRatio
