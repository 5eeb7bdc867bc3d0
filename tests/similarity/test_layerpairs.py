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
    got = chunk.products(jnp.asarray(rows), layerpairs.examples_last(jnp.asarray(cols)), "highest")
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


def test_permuted_reindexes_rows_and_columns():
  rng = np.random.default_rng(0)
  mats = rng.standard_normal((3, 6, 6)).astype(np.float32)
  order = rng.permutation(6)
  np.testing.assert_array_equal(layerpairs.permuted(jnp.asarray(mats), jnp.asarray(order)),
                                mats[:, order][:, :, order])


@pytest.mark.parametrize("entries", [24, 29])  # whole slices of 8, and five entries past them
def test_squared_differences_term_by_term(monkeypatch, entries):
  monkeypatch.setattr(layerpairs, "SLICE_BYTES", 8 * 3 * 8)  # 3 layers: 8 entries a slice
  rng = np.random.default_rng(entries)
  x, y = (rng.standard_normal((3, entries)).astype(np.float32) for _ in range(2))
  fx, fy = (rng.uniform(0.5, 2, (3, 3)).astype(np.float32) for _ in range(2))
  got = layerpairs.squared_differences(*map(jnp.asarray, (x, y, fx, fy)))
  a, b = fx[:, :, None].astype(np.float64) * x[:, None], fy[:, :, None].astype(np.float64) * y[None]
  want = np.sum((a - b) ** 2, -1)
  # each term: the two products, their difference and its square rounded (within 4 eps of
  # (|a| + |b|)²); the float32 sum of `entries` terms within entries eps of their sum
  bound = (entries + 4) * np.finfo(np.float32).eps * np.sum((np.abs(a) + np.abs(b)) ** 2, -1)
  assert np.all(np.abs(np.asarray(got, np.float64) - want) <= bound)


@pytest.mark.parametrize("reindex", [False, True])
def test_symmetric_squared_differences_are_the_full_matrices(monkeypatch, reindex):
  """Symmetric matrices, each off-diagonal entry once and doubled: the sum over all
  n² entries of the full matrices of every pair of the stack, the column layers'
  examples re-indexed by `order` (the null)."""
  monkeypatch.setattr(layerpairs, "SLICE_BYTES", 8 * 3 * 8)  # 3 layers: 8 entries a slice
  rng = np.random.default_rng(7)
  n = 7
  m = rng.standard_normal((3, n, n))
  mats = (m + np.swapaxes(m, 1, 2)).astype(np.float32)
  fx, fy = (rng.uniform(0.5, 2, (3, 3)).astype(np.float32) for _ in range(2))
  order = rng.permutation(n) if reindex else None
  got = layerpairs.symmetric_squared_differences(
      *map(jnp.asarray, (mats, fx, fy)), order=None if order is None else jnp.asarray(order))
  moved = mats if order is None else mats[:, order][:, :, order]
  a = fx[:, :, None].astype(np.float64) * mats.reshape(3, 1, -1)
  b = fy[:, :, None].astype(np.float64) * moved.reshape(1, 3, -1)
  want = np.sum((a - b) ** 2, -1)
  # as `test_squared_differences_term_by_term`, over at most n² terms (doubling is exact)
  bound = (n * n + 4) * np.finfo(np.float32).eps * np.sum((np.abs(a) + np.abs(b)) ** 2, -1)
  assert np.all(np.abs(np.asarray(got, np.float64) - want) <= bound)
