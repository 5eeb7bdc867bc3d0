"""How a layer's Gram and the flattened Grams' products are cut into cache slices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.numerics import assert_close, worst
from vitcnn_jax.similarity import grams


@pytest.mark.parametrize("columns, rows, want", [
    (802816, 32, 28672),  # BiT stage 1 at 32 rows: 28 slices, where 32768 would leave a tail
    (151296, 32, 25216),  # ViT-B/16 tokens: 6 slices
    (4096, 1000, 1024),  # ResNet-18 layer 1 at 1,000 rows
    (7919, 1, 7919),  # fits one slice
    (1000003, 8, 131072),  # prime: no divisor, the cap and a tail
])
def test_a_slice_divides_the_columns_where_a_divisor_is_near_the_cap(columns, rows, want):
  width = grams.slice_width(columns, rows)
  assert width == want
  assert 4 * rows * width <= grams.CACHE_SLICE_BYTES or width == 1


@pytest.mark.parametrize("columns", [960, 953], ids=["slices alone", "slices and a tail"])
def test_flat_products_in_slices_equal_one_float64_product(columns, monkeypatch):
  """Operands past `SLICED_PRODUCT_SLICES` cache slices are summed over slices of
  their columns (a loop, and a tail where no divisor fits): the same product as
  one dot, within float32's worst case for sums of `columns` terms."""
  monkeypatch.setattr(grams, "CACHE_SLICE_BYTES", 4 * 7 * 32)  # 7 rows: 32 columns a slice
  rng = np.random.default_rng(0)
  a = rng.standard_normal((3, columns)).astype(np.float32)
  b = rng.standard_normal((4, columns)).astype(np.float32)
  jitted = jax.jit(grams.flat_products)
  text = jitted.lower(jnp.asarray(a), jnp.asarray(b)).as_text()
  assert "while" in text  # sliced, not one dot
  got = jax.device_get(jitted(jnp.asarray(a), jnp.asarray(b)))
  want = a.astype(np.float64) @ b.astype(np.float64).T
  scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T
  # A slice or the tail left out would be off by about sqrt(32), far past this.
  assert_close(got, want, worst(columns) * scale.max(), "sliced product")


@pytest.mark.parametrize("rows, features", [(9, 96), (9, 95)], ids=["slices alone", "slices and a tail"])
def test_a_tall_gram_is_the_triangle_of_its_row_halves(rows, features, monkeypatch):
  """At `TRIANGLE_ROWS` rows and more than one slice, the Gram is summed as three
  blocks of its row halves and mirrored: exactly symmetric, and each entry within
  float32's worst case of the centred float64 Gram's: each centred feature within
  e of its own (the mean's sum of `rows` terms and division, the subtraction; |c|
  <= 2 max |x|), then each entry's `features` products and their sum."""
  monkeypatch.setattr(grams, "CACHE_SLICE_BYTES", 4 * rows * 32)  # 32 features a slice
  monkeypatch.setattr(grams, "TRIANGLE_ROWS", rows)
  x = np.random.default_rng(rows + features).standard_normal((rows, features)).astype(np.float32)
  mask = np.ones(rows, np.float32)
  mask[-1] = 0  # a padding row: zero row and column
  jitted = jax.jit(lambda x, m: grams.gram_and_mean(x, m))
  assert jitted.lower(x, mask).as_text().count("dot_general") >= 3 + 1  # three blocks and the mean
  gram, _ = jax.device_get(jitted(x, mask))
  np.testing.assert_array_equal(gram, gram.T)
  valid = x[:-1].astype(np.float64)
  c = np.zeros((rows, features))
  c[:-1] = valid - valid.mean(0)
  e = worst(rows + 2) * 2 * np.abs(valid).max()
  a = np.abs(c) + e
  s = np.abs(c).sum(1)
  bound = worst(features + 1) * (a @ a.T) + e * (s[:, None] + s[None, :]) + features * e ** 2
  err = np.abs(gram.astype(np.float64) - c @ c.T)
  assert np.all(err <= bound), f"Gram from row halves: {np.max(err / bound):.3g} of the bound"
