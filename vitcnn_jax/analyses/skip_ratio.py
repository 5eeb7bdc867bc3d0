"""Skip-connection norm ratio ||z|| / ||f(z)|| (paper Figs 7, E.1, E.2).

ViT: for every block, sublayer (attention, MLP) and token, z is the sublayer's
input carried by the skip connection and f(z) its long branch; ResNet-v2: for
every unit, z is the shortcut and f(z) the conv branch, per spatial position.
Ratios (and the cosine similarity between branch and output, Fig E.2) are
averaged over images; a zero branch gives an infinite ratio, never NaN.
"""

from __future__ import annotations

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

VIT_SUBLAYERS = (("attn", "in", "attn/out"), ("mlp", "attn/residual", "mlp/out"))
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


def _vit_names(depth: int) -> list[str]:
  return [f"block{b:02d}/{p}" for b in range(depth) for _, z, f in VIT_SUBLAYERS for p in (z, f)]


def _bit_units(names: list[str]) -> list[str]:
  return sorted({n.rsplit("/", 1)[0] for n in names if n.endswith("/conv3")})


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  vit = pipeline.load_model(config, "model_x")
  if vit.model.family != "vit":
    raise ValueError(f"config.model_x must be a ViT, got a {vit.model.family} checkpoint.")
  vit.names = _vit_names(vit.model.depth)
  models = [vit]
  bit = None
  if config.get("model_y"):
    bit = pipeline.load_model(config, "model_y")
    if bit.model.family != "bit":
      raise ValueError(f"config.model_y must be a BiT ResNet, got a {bit.model.family} checkpoint.")
    units = _bit_units(bit.names)
    bit.names = [f"{u}/{p}" for u in units for p in BIT_POINTS]
    models.append(bit)
  depth = vit.model.depth

  @jax.jit
  def step(params, images, mask):
    stats = []
    for m, p, x in zip(models, params, images):
      _, out = m.model.apply({"params": p}, preprocess.to_model_range(x), capture=m.names)
      if m is vit:
        pairs = [(out[f"block{b:02d}/{z}"], out[f"block{b:02d}/{f}"])
                 for b in range(depth) for _, z, f in VIT_SUBLAYERS]
        r, c = zip(*[ratio_and_cosine(z, f) for z, f in pairs])  # each (B, T)
        r, c = jnp.stack(r), jnp.stack(c)  # (2 * depth, B, T)
        stats += [jnp.einsum("lbt,b->lt", r, mask), jnp.einsum("lbt,b->lt", c, mask)]
      else:
        r, c = zip(*[ratio_and_cosine(out[f"{u}/shortcut"], out[f"{u}/conv3"]) for u in units])
        r = jnp.stack([x.mean(axis=(1, 2)) for x in r])  # (U, B): mean over positions
        c = jnp.stack([x.mean(axis=(1, 2)) for x in c])
        stats += [r @ mask, c @ mask]
    return stats

  source = pipeline.make_source(config.data)
  pipeline.check_batching(config.num_examples, config.batch_size)
  indices = data.sample(len(source), config.num_examples, config.seed, 0)
  mesh = parallel.mesh()
  params = [parallel.replicate(mesh, m.params) for m in models]
  bar = progress.Bar(pipeline.num_steps(config.num_examples, config.batch_size), "skip ratio",
                     enabled=jax.process_index() == 0)
  sums = None
  for batch in pipeline.steps(mesh, source, indices, models, config.batch_size):
    got = [np.asarray(s, np.float64) for s in step(params, batch.images, batch.mask)]
    sums = got if sums is None else [a + b for a, b in zip(sums, got)]
    bar.update(1, batch.examples)
  bar.close()
  n = config.num_examples
  ratio = sums[0].reshape(depth, 2, -1) / n  # (block, sublayer, token)
  cos = sums[1].reshape(depth, 2, -1) / n
  prefix = vit.model.num_prefix_tokens
  spatial = ratio[:, :, prefix:].mean(axis=-1)
  summary = {"analysis": "skip_ratio", "num_examples": n,
             "vit": {"checkpoint": vit.path, "label": vit.label, "sublayers": ["attn", "mlp"],
                     "cls_ratio": ratio[:, :, 0].tolist() if prefix else None,
                     "spatial_ratio": spatial.tolist()}}
  arrays = {"vit_ratio": ratio, "vit_cosine": cos}
  if bit is not None:
    summary["bit"] = {"checkpoint": bit.path, "label": bit.label, "units": units,
                      "ratio": (sums[2] / n).tolist(), "cosine": (sums[3] / n).tolist()}
    arrays.update(bit_ratio=sums[2] / n, bit_cosine=sums[3] / n, bit_units=np.asarray(units))
  if jax.process_index() == 0:
    results.write_npz(results.workdir_path(workdir, "skip_ratio.npz"), **arrays)
    results.write_json(results.workdir_path(workdir, "skip_ratio.json"), summary)
    plotting.skip_ratio(ratio, cos, prefix, config.plot_tokens, vit.label,
                        (np.asarray(summary["bit"]["ratio"]), bit.label) if bit else None,
                        results.workdir_path(workdir, "skip_ratio.png"))
    print(f"Wrote skip_ratio.{{npz,json,png}} to {workdir}")
  return summary
