"""Localization: CKA between each output token and each raw input patch (Figs 9, 10, D.1-D.3).

ViT tokens are those of one layer without CLS (row-major); a ResNet "token" is
every channel at one spatial position of a chosen feature map. Input patches
tile the image on the same grid as the tokens (pixels flattened, in [-1, 1]).
Minibatch CKA (unbiased HSIC summed over minibatches) for every token x patch
pair at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax import cka
from vitcnn_jax import data
from vitcnn_jax import parallel
from vitcnn_jax import pipeline
from vitcnn_jax import plotting
from vitcnn_jax import preprocess
from vitcnn_jax import progress
from vitcnn_jax import results


def to_tokens(act: jax.Array, prefix: int) -> tuple[jax.Array, tuple[int, int] | None]:
  """(B,h,w,C) maps or (B,T,C) tokens -> (B, N, C) spatial tokens and their grid."""
  if act.ndim == 4:
    return act.reshape(act.shape[0], -1, act.shape[-1]), act.shape[1:3]
  return act[:, prefix:], None


def to_patches(images: jax.Array, grid: tuple[int, int]) -> jax.Array:
  """(B,H,W,3) -> (B, gh*gw, ph*pw*3), row-major patches on `grid`."""
  b, h, w, c = images.shape
  gh, gw = grid
  if h % gh or w % gw:
    raise ValueError(f"Image {h}x{w} does not tile into a {gh}x{gw} grid of patches.")
  x = images.reshape(b, gh, h // gh, gw, w // gw, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, gh * gw, -1)


def token_patch_hsic(tokens: jax.Array, patches: jax.Array, mask: jax.Array) -> jax.Array:
  """(N+P, N+P) HSIC1 matrix over [tokens..., patches...] for one minibatch."""
  acts = [tokens[:, i] for i in range(tokens.shape[1])] + [patches[:, j] for j in range(patches.shape[1])]
  return cka.hsic_matrix(acts, mask)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  m = pipeline.load_model(config, "model")
  layer = config.layer
  if layer not in m.names:
    raise ValueError(f"config.layer={layer!r} is not a representation point of {m.path}; "
                     f"e.g. {m.names[-3:]} (configs/inspect.py lists them).")
  prefix = m.model.num_prefix_tokens
  m.names = [layer]
  size = m.size
  probe = jax.eval_shape(lambda p, x: m.model.apply({"params": p}, x, capture=layer)[1][layer],
                         m.params, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
  grid = tuple(probe.shape[1:3]) if len(probe.shape) == 4 else tuple(m.model.grid)
  n_tokens = grid[0] * grid[1]

  @jax.jit
  def step(params, images, mask):
    x = preprocess.to_model_range(images)
    _, out = m.model.apply({"params": params}, x, capture=layer)
    tokens, _ = to_tokens(out[layer], prefix)
    return token_patch_hsic(tokens, to_patches(x, grid), mask)

  pipeline.check_batching(config.num_examples, config.batch_size)
  source = pipeline.make_source(config.data)
  indices = data.sample(len(source), config.num_examples, config.seed, 0)
  mesh = parallel.mesh()
  params = parallel.replicate(mesh, m.params)
  hsic = np.zeros((2 * n_tokens, 2 * n_tokens))
  bar = progress.Bar(pipeline.num_steps(config.num_examples, config.batch_size), "localization",
                     enabled=jax.process_index() == 0)
  for batch in pipeline.steps(mesh, source, indices, [m], config.batch_size):
    hsic += np.asarray(step(params, batch.images[0], batch.mask), np.float64)
    bar.update(1, batch.examples)
  bar.close()
  names = [f"token{i}" for i in range(n_tokens)] + [f"patch{j}" for j in range(n_tokens)]
  full = cka.cka_from_hsic(hsic, names)
  tok_patch = full[:n_tokens, n_tokens:]
  default = [(grid[0] // 4) * grid[1] + grid[1] // 4, (grid[0] // 2) * grid[1] + grid[1] // 2]
  tokens = list(config.tokens) or default  # a token off-centre and the centre one
  bad = [t for t in tokens if not 0 <= t < n_tokens]
  if bad:
    raise ValueError(f"config.tokens {bad} are outside 0..{n_tokens - 1} ({grid[0]}x{grid[1]} grid).")
  summary = {"analysis": "localization", "checkpoint": m.path, "label": m.label, "layer": layer,
             "grid": list(grid), "num_examples": config.num_examples, "tokens": tokens,
             "own_patch_cka_mean": float(np.mean(np.diag(tok_patch)))}
  if jax.process_index() == 0:
    results.write_npz(results.workdir_path(workdir, "localization.npz"), cka=tok_patch,
                      grid=np.asarray(grid))
    results.write_json(results.workdir_path(workdir, "localization.json"), summary)
    plotting.localization(tok_patch, grid, tokens, f"{m.label} {layer}",
                          results.workdir_path(workdir, "localization.png"))
    print(f"Wrote localization.{{npz,json,png}} to {workdir}")
  return summary
