"""Which representation points a model has, in network order, without running it."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from vitcnn_jax.models import memo
from vitcnn_jax.models import param_trees
from vitcnn_jax.models import sizes


def point_shapes(model, params: Any, capture: str | Sequence[str] | None = None,
                 batch: int = 1) -> dict[str, jax.ShapeDtypeStruct]:
  """{name: shape} of every selected point, in the order the network makes them.

  Abstract evaluation only (no FLOPs), traced once per architecture, parameter
  shapes, selection and batch: loading, then an analysis, then a notebook's next
  call all ask again (a model with a list field, unhashable, is traced each time).
  """
  signature = tuple((k, tuple(np.shape(v)), np.dtype(v.dtype).str)
                    for k, v in param_trees.flatten(params).items())
  selection = capture if capture is None or isinstance(capture, str) else tuple(capture)
  return dict(_traced(model, signature, selection, batch))  # the caller's own copy


@memo.per_architecture
def _traced(model, signature: tuple, capture, batch: int) -> dict[str, jax.ShapeDtypeStruct]:
  """jit and eval_shape sort dict keys, so the order is read from the Python dict
  while it is traced."""
  params = param_trees.unflatten({k: jax.ShapeDtypeStruct(shape, np.dtype(dtype))
                                  for k, shape, dtype in signature})
  size = sizes.to_pair(model.image_size)
  images = jax.ShapeDtypeStruct((batch, *size, 3), np.float32)
  order: list[str] = []

  def forward(p, x):
    _, out = model.apply({"params": p}, x, capture=capture)
    order.extend(out)
    return out

  shapes = jax.eval_shape(forward, params, images)
  return {name: shapes[name] for name in order}
