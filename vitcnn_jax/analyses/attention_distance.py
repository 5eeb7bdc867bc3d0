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

from vitcnn_jax import data
from vitcnn_jax import parallel
from vitcnn_jax import pipeline
from vitcnn_jax import plotting
from vitcnn_jax import preprocess
from vitcnn_jax import progress
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
    raise ValueError(f"config.cls={cls!r} is not one of {CLS_CONVENTIONS}.")
  return jnp.einsum("bhqk,qk->bhq", w, dist, precision=jax.lax.Precision.HIGHEST).mean(axis=-1)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  if config.cls not in CLS_CONVENTIONS:
    raise ValueError(f"config.cls={config.cls!r} is not one of {CLS_CONVENTIONS}.")
  m = pipeline.load_model(config, "model")
  if m.model.family != "vit":
    raise ValueError(f"config.model: attention distance needs a ViT, got a {m.model.family} checkpoint.")
  patch = common.to_pair(m.model.patch_size)
  if patch[0] != patch[1]:
    raise ValueError(f"config.model: non-square patches {patch} are not supported.")
  names = [n for n in m.names if n.endswith("/attn/weights") and not n.startswith("map/")]
  if not names:
    raise ValueError("config.model.capture selects no `blockNN/attn/weights`.")
  m.names = names
  prefix = m.model.num_prefix_tokens
  dist = jnp.asarray(distance_matrix(m.model.grid, patch[0]), jnp.float32)
  mesh = parallel.mesh()
  params = parallel.replicate(mesh, m.params)

  @jax.jit
  def step(params, images, mask):
    _, out = m.model.apply({"params": params}, preprocess.to_model_range(images), capture=names)
    per = jnp.stack([mean_distance(out[n], dist, prefix, config.cls) for n in names])  # (L, B, H)
    return jnp.einsum("lbh,b->lh", per, mask)

  source = pipeline.make_source(config.data)
  pipeline.check_batching(config.num_examples, config.batch_size)
  indices = data.sample(len(source), config.num_examples, config.seed, 0)
  bar = progress.Bar(pipeline.num_steps(config.num_examples, config.batch_size),
                     "attention distance", enabled=jax.process_index() == 0)
  total = np.zeros((len(names), m.model.num_heads))
  for batch in pipeline.steps(mesh, source, indices, [m], config.batch_size):
    total += np.asarray(step(params, batch.images[0], batch.mask), np.float64)
    bar.update(1, batch.examples)
  bar.close()
  mean = total / config.num_examples
  blocks = [int(n.split("/")[0][5:]) for n in names]
  summary = {"analysis": "attention_distance", "checkpoint": m.path, "label": m.label,
             "cls": config.cls, "num_examples": config.num_examples, "patch_size": patch[0],
             "grid": list(m.model.grid), "blocks": blocks, "mean_distance_px": mean.tolist(),
             "uniform_ceiling_px": float(distance_matrix(m.model.grid, patch[0]).mean())}
  if jax.process_index() == 0:
    results.write_npz(results.workdir_path(workdir, "attention_distance.npz"),
                      mean_distance=mean, blocks=np.asarray(blocks))
    results.write_json(results.workdir_path(workdir, "attention_distance.json"), summary)
    plotting.attention_distance(mean, blocks, list(config.plot_blocks) or None, m.label,
                                summary["uniform_ceiling_px"],
                                results.workdir_path(workdir, "attention_distance.png"))
    print(f"Wrote attention_distance.{{npz,json,png}} to {workdir}")
  return summary
