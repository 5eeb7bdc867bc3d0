"""Effective receptive fields (paper Figs 6, C.1-C.4).

For each layer: the absolute value of the gradient of the feature map's centre
location with respect to the input image, averaged over channels (we
differentiate the channel mean, i.e. back-propagate 1/C at the centre, as Luo et
al. 2017), summed over RGB and averaged over images. Layers are taken after the
residual add (ViT `attn/residual` and `out`, ResNet unit `out`) or, with
`config.pre_residual`, before it (`attn/out`, `mlp/out`, ResNet `conv3`).
The centre of an even grid is position (h // 2, w // 2). All layers come from
one batched backward pass (jacrev over the per-layer scalars).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax import data
from vitcnn_jax import parallel
from vitcnn_jax import pipeline
from vitcnn_jax import plotting
from vitcnn_jax import preprocess
from vitcnn_jax import progress
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
  if model.family == "vit":
    pts = ("attn/out", "mlp/out") if pre_residual else ("attn/residual", "out")
    return [f"block{b:02d}/{p}" for b in range(model.depth) for p in pts]
  if model.family == "bit":
    from vitcnn_jax.models import bit as bit_lib  # pylint: disable=g-import-not-at-top
    units = [f"block{b}/unit{u:02d}" for b, n in enumerate(bit_lib.block_sizes(model.depth), 1)
             for u in range(1, n + 1)]
    return ["root/conv"] + [f"{u}/{'conv3' if pre_residual else 'out'}" for u in units]
  raise ValueError(f"Receptive fields are defined here for ViT and BiT, not {model.family}.")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  keys = ["model_x"] + (["model_y"] if config.get("model_y") else [])
  models = [pipeline.load_model(config, k) for k in keys]
  source = pipeline.make_source(config.data)
  if config.num_examples < 1:
    raise ValueError(f"config.num_examples={config.num_examples} must be >= 1.")
  indices = data.sample(len(source), config.num_examples, config.seed, 0)
  mesh = parallel.mesh()
  out = {}
  summary = {"analysis": "receptive_field", "num_examples": config.num_examples,
             "pre_residual": config.pre_residual, "models": {}}
  for m in models:
    names = layer_names(m.model, config.pre_residual)
    grid = m.model.grid if m.model.family == "vit" else None
    prefix = m.model.num_prefix_tokens

    @jax.jit
    def step(params, images, mask, m=m, names=names, grid=grid, prefix=prefix):
      feats = lambda x: m.model.apply({"params": params}, x, capture=names)[1]
      return gradient_maps(feats, names, preprocess.to_model_range(images), grid, prefix, mask)

    m.names = names
    params = parallel.replicate(mesh, m.params)
    total = 0.0
    bar = progress.Bar(pipeline.num_steps(config.num_examples, config.batch_size),
                       f"receptive field {m.label}", enabled=jax.process_index() == 0)
    for batch in pipeline.steps(mesh, source, indices, [m], config.batch_size):
      total = total + np.asarray(step(params, batch.images[0], batch.mask), np.float64)
      bar.update(1, batch.examples)
    bar.close()
    maps = total / config.num_examples
    out[m.key] = (m, names, maps)
    summary["models"][m.key] = {"checkpoint": m.path, "label": m.label, "layers": names,
                                "input_size": common.to_pair(m.model.image_size)[0]}
  if jax.process_index() == 0:
    arrays = {}
    for key, (m, names, maps) in out.items():
      arrays[f"{key[-1]}_maps"] = maps
      arrays[f"{key[-1]}_names"] = np.asarray(names)
    results.write_npz(results.workdir_path(workdir, "receptive_field.npz"), **arrays)
    results.write_json(results.workdir_path(workdir, "receptive_field.json"), summary)
    plotting.receptive_fields([(m.label, names, maps) for m, names, maps in out.values()],
                              results.workdir_path(workdir, "receptive_field.png"))
    print(f"Wrote receptive_field.{{npz,json,png}} to {workdir}")
  return summary
