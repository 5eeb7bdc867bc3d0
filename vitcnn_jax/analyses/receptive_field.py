"""Effective receptive fields (paper Figs 6, C.1-C.4).

For each layer: the absolute value of the gradient of the feature map's centre
location with respect to the input image, averaged over channels (we
differentiate the channel mean, i.e. back-propagate 1/C at the centre, as Luo et
al. 2017), summed over RGB and averaged over images. Layers are taken after the
residual add (ViT `attn/residual` and `out`, Mixer `token_mlp/residual` and
`out`, ResNet unit `out`) or, with `config.pre_residual`, before it (the
branches: `attn/out`, `mlp/out`, `token_mlp/out`, `channel_mlp/out`, `conv3`).
The centre of an even grid is position (h // 2, w // 2). All layers come from
one batched backward pass (jacrev over the per-layer scalars).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax import plotting
from vitcnn_jax import representations
from vitcnn_jax import results
from vitcnn_jax.models import common


def centre_value(act: jax.Array, grid: tuple[int, int] | None, prefix: int) -> jax.Array:
  """(B,) channel mean at the centre of a (B,h,w,C) map or of (B,T,C) tokens."""
  if act.ndim == 4:
    h, w = act.shape[1:3]
    return act[:, h // 2, w // 2].mean(axis=-1)
  gh, gw = grid
  return act[:, prefix + (gh // 2) * gw + gw // 2].mean(axis=-1)


def gradient_maps(features: Callable[[jax.Array], dict], names: list[str],
                  images: jax.Array, grid=None, prefix: int = 0,
                  weights: jax.Array | None = None) -> jax.Array:
  """(L, H, W): sum over images of |d centre / d input| summed over RGB.

  `weights` (B,) zero out padding images (their gradients would not be zero).
  """
  w = jnp.ones(images.shape[:1]) if weights is None else weights

  def scalars(x):
    out = features(x)
    return jnp.stack([(centre_value(out[n], grid, prefix) * w).sum() for n in names])

  jac = jax.jacrev(scalars)(images)  # (L, B, H, W, 3); images are independent
  return jnp.abs(jac).sum(axis=(1, 4))


def layer_names(model, pre_residual: bool) -> list[str]:
  if model.family in TOKEN_SUBLAYERS:
    pts = [f if pre_residual else s for s, f in TOKEN_SUBLAYERS[model.family]]
    depth = model.depth if model.family == "vit" else model.num_blocks
    return [f"block{b:02d}/{p}" for b in range(depth) for p in pts]
  if model.family == "bit":
    from vitcnn_jax.models import bit as bit_lib  # pylint: disable=g-import-not-at-top
    units = [f"block{b}/unit{u:02d}" for b, n in enumerate(bit_lib.block_sizes(model.depth), 1)
             for u in range(1, n + 1)]
    return ["root/conv"] + [f"{u}/{'conv3' if pre_residual else 'out'}" for u in units]
  raise ValueError(f"Receptive fields are defined here for ViT, Mixer and BiT, not {model.family}.")


# Per sublayer of a token model: the point after the residual add, the branch before it.
TOKEN_SUBLAYERS = {"vit": (("attn/residual", "attn/out"), ("out", "mlp/out")),
                   "mixer": (("token_mlp/residual", "token_mlp/out"), ("out", "channel_mlp/out"))}
MODELS = None  # any number of ViTs, Mixers and ResNets


class ReceptiveField:
  """One pass: per model and layer, |d centre / d input| summed over images."""
  name, title, repeats, labels = "receptive_field", "receptive field", 1, False

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    self.config, self.models = config, models
    self.points = {k: layer_names(m.model, config.pre_residual) for k, m in models.items()}

  def passes(self):
    return [self]

  def step(self, forward, labels, mask) -> dict:
    del labels
    sums = {}
    for key, names in self.points.items():
      model = self.models[key].model
      grid = model.grid if model.family in TOKEN_SUBLAYERS else None
      sums[key] = gradient_maps(lambda x, key=key: forward(key, x), names, forward.inputs(key),
                                grid, model.num_prefix_tokens, mask)
    return sums

  def finalize(self, sums):
    arrays, summary = {}, {"analysis": "receptive_field", "num_examples": self.config.num_examples,
                           "pre_residual": self.config.pre_residual, "models": {}}
    for key, m in self.models.items():
      arrays[f"{key}_maps"] = sums[0][0][key] / self.config.num_examples
      arrays[f"{key}_names"] = np.asarray(self.points[key])
      arrays[f"{key}_grid"] = self._grids(m)
      summary["models"][key] = {"checkpoint": m.path, "label": m.label, "layers": self.points[key],
                                "input_size": common.to_pair(m.model.image_size)[0]}
    return arrays, summary

  def _grids(self, m) -> np.ndarray:
    """(layers, 2): each layer's feature-map size (a token model's token grid)."""
    if m.model.family in TOKEN_SUBLAYERS:
      return np.tile(np.asarray(m.model.grid), (len(self.points[m.name]), 1))
    shapes = representations.point_shapes(m.model, m.params, self.points[m.name])
    return np.asarray([shapes[n].shape[1:3] for n in self.points[m.name]])

  def plot(self, arrays, summary, workdir: str) -> None:
    plotting.receptive_fields([(m.label, self.points[k], arrays[f"{k}_maps"], arrays[f"{k}_grid"])
                               for k, m in self.models.items()],
                              results.workdir_path(workdir, "receptive_field.png"))


build = ReceptiveField
