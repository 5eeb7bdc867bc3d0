"""`layerpairs.pairwise`: every pair of layers i <= j once, each chunk's products
equal to each pair's own, for even and odd layer counts."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from vitcnn_jax.similarity import layerpairs


@pytest.mark.parametrize("num", [1, 5, 6])  # one layer, odd and even counts
def test_every_pair_once_with_its_own_product(num):
  rng = np.random.default_rng(num)
  rows, cols = (rng.standard_normal((num, 7, k)).astype(np.float32) for k in (3, 4))
  ids = {"id": jnp.arange(num)}
  seen = []

  def fn(x, y, chunk):
    a, b = jnp.asarray(rows)[x["id"]], jnp.asarray(cols)[y["id"]]
    got = chunk.products(jnp.asarray(rows), jnp.asarray(cols), "highest")
    want = jnp.einsum("pnr,pns->prs", a, b, precision="highest")
    # each float32 sum of n = 7 terms within n eps sum |a||b| of the exact one: the two within twice that
    bound = 2 * 7 * np.finfo(np.float32).eps * jnp.einsum("pnr,pns->prs", jnp.abs(a), jnp.abs(b),
                                                          precision="highest")
    seen.append(chunk.col.shape[0])
    return {"pair": 1000 * x["id"] + y["id"], "row": x["id"], "row~": y["id"],
            "err": (jnp.abs(got - want) / bound).max((1, 2))}

  out = layerpairs.pairwise(fn, num, ids)
  i, j = np.indices((num, num))
  np.testing.assert_array_equal(out["pair"], 1000 * np.minimum(i, j) + np.maximum(i, j))
  np.testing.assert_array_equal(out["row"], i)  # below the diagonal: the reversed pair's value
  assert float(np.max(out["err"])) <= 1.0
  assert seen == [num + 1]  # L + 1 pairs a chunk


def test_nothing_gathered_per_pair():
  """A measure that reads only whole stacks (the shape metric alone) gathers nothing per pair."""
  out = layerpairs.pairwise(lambda x, y, chunk: {"col": chunk.col}, 5, {})
  i, j = np.indices((5, 5))
  np.testing.assert_array_equal(out["col"], np.maximum(i, j))
