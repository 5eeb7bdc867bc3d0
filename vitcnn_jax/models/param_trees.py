"""Parameter trees: as flat `a/b/c` names (the key style of npz checkpoints)
and back, and drawn at random for a model's shapes."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
from flax import traverse_util
import jax
import numpy as np


def flatten(tree: dict) -> dict[str, Any]:
  """A parameter tree as {"a/b/c": array}, the key style of npz checkpoints."""
  return traverse_util.flatten_dict(tree, sep="/")


def unflatten(flat: dict[str, Any]) -> dict:
  return traverse_util.unflatten_dict(flat, sep="/")


def random_params(model: nn.Module, images, seed: int = 0) -> dict:
  """Parameters of `model` at the shapes its init gives for `images`, drawn with
  NumPy: normals over sqrt(fan-in), norm scales near one, biases near zero. For
  random-init benchmarks and tests: Flax's compiled init costs seconds a model
  (a random generator per array), a fresh draw here none."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)["params"]

  def draw(path, leaf) -> np.ndarray:
    name, shape = getattr(path[-1], "key", ""), leaf.shape
    if name == "scale":
      value = 1 + 0.1 * rng.standard_normal(shape)
    elif name == "bias":
      value = 0.1 * rng.standard_normal(shape)
    else:
      value = rng.standard_normal(shape) / np.sqrt(max(1, int(np.prod(shape[:-1]))))
    return value.astype(leaf.dtype)
  return jax.tree_util.tree_map_with_path(draw, shapes)
