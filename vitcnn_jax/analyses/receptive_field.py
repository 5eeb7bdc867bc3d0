"""Effective receptive fields (paper Figs 6, C.1-C.4).

For each layer: the absolute value of the gradient of the feature map's centre
location with respect to the input image, averaged over channels (we
differentiate the channel mean, i.e. back-propagate 1/C at the centre, as Luo et
al. 2017), summed over RGB and averaged over images. Layers are the model's
stem map, if it has one (a ResNet's root conv), and every residual connection
(`Anatomy.residuals`) after the add (ViT `attn/residual` and `out`, Mixer
`token_mlp/residual` and `out`, ResNet unit `out`) or, with
`config.pre_residual`, its branch before it (`attn/out`, `mlp/out`,
`token_mlp/out`, `channel_mlp/out`, `conv3`). The centre of an even grid is
position (h // 2, w // 2). All layers come from one batched backward pass
(jacrev over the per-layer scalars).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax.models import representations
from vitcnn_jax.models import sizes
from vitcnn_jax.plotting import receptive_field
from vitcnn_jax.plotting import style
from vitcnn_jax.run import declaration
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results

DEFAULTS = {
    "num_examples": 32,  # the paper: 32 randomly selected images
    "batch_size": 8,  # per device (any size gives the same result)
    "seed": 0,
    "pre_residual": False,  # True: the branches, before the residual add (Fig C.4)
}


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
  """The stem map (if any), then each residual's output (or, `pre_residual`, branch)."""
  stem = [model.stem] if model.stem else []
  return stem + [r.branch if pre_residual else r.out for r in model.residuals()]


class ReceptiveField(protocol.Analysis):
  """One pass: per model and layer, |d centre / d input| summed over images."""

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    self.config, self.models = config, models
    self.points = {k: layer_names(m.model, config.pre_residual) for k, m in models.items()}

  def step(self, forward, labels, mask) -> dict:
    del labels
    sums = {}
    for key, names in self.points.items():
      model = self.models[key].model
      sums[key] = gradient_maps(lambda x, key=key: forward(key, x), names, forward.inputs(key),
                                model.grid, model.num_prefix_tokens, mask)
    return sums

  def finalize(self, sums):
    arrays, summary = {}, {"analysis": "receptive_field", "num_examples": self.config.num_examples,
                           "pre_residual": self.config.pre_residual, "models": {}}
    for key, m in self.models.items():
      arrays[f"{key}_maps"] = sums[0][0][key] / self.config.num_examples
      arrays[f"{key}_names"] = np.asarray(self.points[key])
      arrays[f"{key}_grid"] = self._grids(m)
      radius, offset = zip(*map(extent, arrays[f"{key}_maps"]))
      summary["models"][key] = {"checkpoint": m.path, "label": m.label, "layers": self.points[key],
                                "input_size": sizes.to_pair(m.model.image_size)[0],
                                "stem": m.model.stem, "tokens": m.model.grid is not None,
                                "token_pixels": m.model.token_pixels and max(m.model.token_pixels),
                                "half_mass_radius_px": list(radius), "peak_offset_px": list(offset)}
    return arrays, summary

  def _grids(self, m) -> np.ndarray:
    """(layers, 2): each layer's feature-map size (a token model's token grid)."""
    if m.model.grid is not None:
      return np.tile(np.asarray(m.model.grid), (len(self.points[m.name]), 1))
    shapes = representations.point_shapes(m.model, m.params, self.points[m.name])
    return np.asarray([shapes[n].shape[1:3] for n in self.points[m.name]])

  def plot(self, arrays, summary, workdir: str, figures: style.Figures) -> list:
    return [receptive_field.maps([(m.label, self.points[k], arrays[f"{k}_maps"], arrays[f"{k}_grid"])
                                  for k, m in self.models.items()],
                                 results.workdir_path(workdir, "receptive_field.png"), figures)]


def extent(m: np.ndarray) -> tuple[float, float]:
  """(radius around its centre of mass holding half of a map's mass; distance of its
  peak from the image centre), in pixels: how far a layer sees, and where."""
  h, w = m.shape
  ys, xs = np.mgrid[:h, :w]
  total = float(m.sum())
  if total <= 0:
    return 0.0, 0.0
  cy, cx = float((m * ys).sum()) / total, float((m * xs).sum()) / total
  r = np.hypot(ys - cy, xs - cx).ravel()
  order = np.argsort(r, kind="stable")
  inside = np.cumsum(m.ravel()[order])
  radius = float(r[order][np.searchsorted(inside, 0.5 * total)])
  py, px = np.unravel_index(np.argmax(m), m.shape)
  return radius, float(np.hypot(py - (h - 1) / 2, px - (w - 1) / 2))


def _blocks_only(e: dict, key: str) -> list[float]:
  """A model's values at its residual layers (its stem map left out)."""
  return e[key][1:] if e["stem"] else e[key]


def _global_early(s: dict) -> declaration.Verdict | declaration.Variants:
  """On the first block, as the finding reads it, and on the mean of the lowest quarter."""
  def check(reading: str) -> declaration.Verdict:
    low = {e["label"]: (e["tokens"], declaration.ends(_blocks_only(e, "half_mass_radius_px"), reading)[0])
           for e in s["models"].values()}
    return declaration.above({k: r for k, (t, r) in low.items() if t},
                             {k: r for k, (t, r) in low.items() if not t}, " px")
  return declaration.each("lower", ("first and last", "quarters"), check)


def _centred(s: dict) -> declaration.Verdict:
  tokens = {e["label"]: (max(e["peak_offset_px"]), e["token_pixels"]) for e in s["models"].values()
            if e["tokens"]}
  if not tokens:
    return None
  return (all(off <= 1.5 * patch for off, patch in tokens.values()),
          ", ".join(f"{k}: at most {off:.1f} px (patch {patch} px)" for k, (off, patch) in tokens.items()))


def _grows(s: dict) -> declaration.Verdict | declaration.Variants:
  """First unit against last, as the finding reads it, and lowest quarter against highest."""
  maps = {e["label"]: _blocks_only(e, "half_mass_radius_px") for e in s["models"].values()
          if not e["tokens"]}
  if not maps:
    return None

  def check(reading: str) -> declaration.Verdict:
    got = {k: declaration.ends(v, reading) for k, v in maps.items()}
    return (all(high > low for low, high in got.values()),
            ", ".join(f"{k}: {low:.1f} -> {high:.1f} px" for k, (low, high) in got.items()))
  return declaration.each("ends", ("first and last", "quarters"), check)


def key_numbers(s: dict) -> list[tuple[str, str]]:
  return [(f"{e['label']}: half-mass radius, first / last layer (px)",
           f"{_blocks_only(e, 'half_mass_radius_px')[0]:.1f} / {e['half_mass_radius_px'][-1]:.1f}")
          for e in s["models"].values()]


DECLARATION = declaration.Declaration(
    name="receptive_field", build=ReceptiveField, models=declaration.Models(any_names=True),
    needs=(("*", "residuals"),),
    defaults=DEFAULTS, layers="all", figures="Figs 6, C.1-C.4", key_numbers=key_numbers,
    findings=(
        declaration.Finding(
            "ViT receptive fields are more global than a ResNet's from the lowest layers on "
            "(here: the radius around its centre of mass that holds half of the first block's "
            "gradient is larger for every model with tokens than for every feature-map model).",
            _global_early),
        declaration.Finding(
            "... yet remain centred on the token's own position (here: every layer's peak lies "
            "within 1.5 patches of the image centre).", _centred),
        declaration.Finding(
            "ResNet receptive fields grow gradually with depth (here: the half-mass radius of "
            "the last unit is larger than the first unit's).", _grows)))
