"""CKA between subsets of first-block ViT heads and lower ResNet layers (paper Fig 5).

Pass 1: mean attention distance of every head of `config.block` (the
attention_distance analysis). Heads are sorted from most local to most global
and cut into sliding windows of `config.subset_size` heads (stride
`config.subset_stride`). Pass 2: minibatch CKA between each subset's
representation and each ResNet layer of `config.model_y.capture`.

Tap point (`config.tap`; the paper leaves it open): "heads" (default) takes the
subset's per-head outputs before the output projection, flattened over tokens
(CLS excluded) and head channels; "projected" passes only the subset's heads
through the block's output projection (bias excluded).
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
from vitcnn_jax.analyses import attention_distance as ad

TAPS = ("heads", "projected")


def subsets(order: np.ndarray, size: int, stride: int) -> list[list[int]]:
  if not 1 <= size <= len(order):
    raise ValueError(f"config.subset_size={size} must be in 1..{len(order)} heads.")
  if stride < 1:
    raise ValueError(f"config.subset_stride={stride} must be >= 1.")
  return [order[i:i + size].tolist() for i in range(0, len(order) - size + 1, stride)]


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  if config.tap not in TAPS:
    raise ValueError(f"config.tap={config.tap!r} is not one of {TAPS}.")
  vit = pipeline.load_model(config, "model_x")
  res = pipeline.load_model(config, "model_y")
  if vit.model.family != "vit" or res.model.family != "bit":
    raise ValueError("config.model_x must be a ViT and config.model_y a BiT ResNet.")
  if not 0 <= config.block < vit.model.depth:
    raise ValueError(f"config.block={config.block} is outside 0..{vit.model.depth - 1}.")
  blk = f"block{config.block:02d}"
  prefix = vit.model.num_prefix_tokens
  dist = jnp.asarray(ad.distance_matrix(vit.model.grid, int(np.ravel(vit.model.patch_size)[0])),
                     jnp.float32)
  mesh = parallel.mesh()
  pv, pr = parallel.replicate(mesh, vit.params), parallel.replicate(mesh, res.params)
  source = pipeline.make_source(config.data)
  pipeline.check_batching(config.num_examples, config.batch_size)
  indices = data.sample(len(source), config.num_examples, config.seed, 0)
  res_names = list(res.names)

  @jax.jit
  def distances(params, images, mask):
    _, out = vit.model.apply({"params": params}, preprocess.to_model_range(images),
                             capture=f"{blk}/attn/weights")
    return ad.mean_distance(out[f"{blk}/attn/weights"], dist, prefix, "drop").T @ mask

  vit.names = [f"{blk}/attn/weights"]
  total = np.zeros(vit.model.num_heads)
  steps = pipeline.num_steps(config.num_examples, config.batch_size)
  bar = progress.Bar(2 * steps, "head subsets", enabled=jax.process_index() == 0)
  for batch in pipeline.steps(mesh, source, indices, [vit], config.batch_size):
    total += np.asarray(distances(pv, batch.images[0], batch.mask), np.float64)
    bar.update(1, batch.examples)
  head_dist = total / config.num_examples
  groups = subsets(np.argsort(head_dist, kind="stable"), config.subset_size, config.subset_stride)
  out_kernel = vit.params["Transformer"][f"encoderblock_{config.block}"][
      "MultiHeadDotProductAttention_0"]["out"]["kernel"]

  @jax.shard_map(mesh=mesh, in_specs=(jax.sharding.PartitionSpec(), jax.sharding.PartitionSpec(),
                                      jax.sharding.PartitionSpec(parallel.AXIS),
                                      jax.sharding.PartitionSpec(parallel.AXIS),
                                      jax.sharding.PartitionSpec(parallel.AXIS)),
                 out_specs=jax.sharding.PartitionSpec())
  def local(pv, pr, img_v, img_r, mask):
    _, ov = vit.model.apply({"params": pv}, preprocess.to_model_range(img_v), capture=f"{blk}/attn/heads")
    heads = ov[f"{blk}/attn/heads"][:, prefix:]  # (B, N, H, hd)
    if config.tap == "heads":
      reps = [heads[:, :, g] for g in groups]
    else:
      reps = [jnp.einsum("bnhd,hdo->bno", heads[:, :, g], out_kernel[jnp.asarray(g)]) for g in groups]
    _, orr = res.model.apply({"params": pr}, preprocess.to_model_range(img_r), capture=res_names)
    return jax.lax.psum(cka.hsic_matrix(reps + [orr[n] for n in res_names], mask), parallel.AXIS)

  step = jax.jit(local)
  vit.names, res.names = [f"{blk}/attn/heads"], res_names
  hsic = 0.0
  for batch in pipeline.steps(mesh, source, indices, [vit, res], config.batch_size):
    hsic = hsic + np.asarray(step(pv, pr, batch.images[0], batch.images[1], batch.mask), np.float64)
    bar.update(1, batch.examples)
  bar.close()
  labels = [f"heads{g}" for g in groups]
  full = cka.cka_from_hsic(hsic, labels + res_names)
  sub_cka = full[:len(groups), len(groups):]
  sub_dist = [float(head_dist[g].mean()) for g in groups]
  summary = {"analysis": "head_subsets", "block": config.block, "tap": config.tap,
             "head_distance_px": head_dist.tolist(), "subsets": groups,
             "subset_distance_px": sub_dist, "resnet_layers": res_names,
             "cka": sub_cka.tolist(), "num_examples": config.num_examples}
  if jax.process_index() == 0:
    results.write_npz(results.workdir_path(workdir, "head_subsets.npz"), cka=sub_cka,
                      subset_distance=np.asarray(sub_dist), head_distance=head_dist)
    results.write_json(results.workdir_path(workdir, "head_subsets.json"), summary)
    plotting.head_subsets(np.asarray(sub_dist), sub_cka, res_names, f"{vit.label} block {config.block}",
                          res.label, results.workdir_path(workdir, "head_subsets.png"))
    print(f"Wrote head_subsets.{{npz,json,png}} to {workdir}")
  return summary
