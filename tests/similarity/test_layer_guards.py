"""Layers no measure can compare (constant over the examples, all zero, or
overflowed to inf) are refused by name for every measure family, as linear CKA
refuses them; a measure's non-finite cell between good layers is named too."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from conftest import ROOT

from support.library_sums import related_layers
from vitcnn_jax.similarity import layer_checks
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import scales

# Every measure but linear CKA (which `test_faults_numerics` covers): one spec, one compile.
OTHERS = measures.Spec(tuple(m for m in measures.NAMES if m != "linear_cka"), cca_dims=3, knn_k=3)
N = 16
NAMES = ["x", "y", "odd"]


@functools.lru_cache(maxsize=1)
def _step():
  return jax.jit(functools.partial(measures.minibatch_sums, spec=OTHERS))


def _values(odd: np.ndarray) -> dict[str, np.ndarray]:
  """Every measure of two varied layers and `odd`, over one minibatch of N rows."""
  x, y, _ = related_layers(n=N)
  acts = [a.astype(np.float32) for a in (x, y, odd)]
  got = jax.device_get(_step()(acts, np.ones(N, np.float32), key=jax.random.PRNGKey(0)))
  sums = scales.unscale(got, measures.SCALES)
  return measures.values({k: np.asarray(v, np.float64) for k, v in sums.items()}, NAMES, OTHERS, N)


def test_varied_layers_give_finite_values_for_every_measure():
  got = _values(1.0 + 0.8 * related_layers(n=N)[0][:, ::2])
  assert set(OTHERS.names) <= set(got) and all(np.isfinite(got[m]).all() for m in OTHERS.names)


@pytest.mark.parametrize("odd, why", [
    (np.zeros((N, 6)), "constant over the examples"),  # an all-zero layer
    (np.tile(np.linspace(-3, 5, 6), (N, 1)), "constant over the examples"),  # a layer equal to its bias
    (np.where(np.arange(6) == 2, np.inf, np.ones((N, 6))), "overflowed"),  # one feature at inf
], ids=["zero", "bias", "inf"])
def test_a_layer_no_measure_can_compare_is_refused_by_name(odd, why):
  with pytest.raises(FloatingPointError, match=rf"rbf_cka, .*uniformity_difference: .*layer 'odd'.*{why}"):
    _values(odd)


def test_a_measure_s_non_finite_cell_between_good_layers_is_named():
  sums = {"hsic": np.eye(3) + 0.5, "moments": np.ones(3), "mean_cca": np.full((3, 3), 0.5),
          "subspace_count": np.ones((3, 3))}
  sums["mean_cca"][0, 1] = np.nan  # as a decomposition that did not converge leaves it
  with pytest.raises(FloatingPointError, match=r"mean_cca: 1 of 9 layer pairs are not finite \('x' x 'y'\)"):
    measures.values(sums, NAMES, measures.Spec(("mean_cca",)), N)


def test_no_nan_or_inf_is_written_without_saying_where(tmp_path, capsys):
  """The last net: results that hold NaN or inf say where, in the json and the log."""
  import json
  from vitcnn_jax.run import driver
  arrays = {"ok": np.ones(3), "cka_a_b": np.array([[1.0, np.nan], [np.inf, 0.5]]), "ids": np.arange(3)}
  summary = {"mean": 0.5, "models": {"a": {"scores": [0.1, float("nan")]}}}
  driver.write(str(tmp_path), "x", summary, arrays)
  got = json.loads((tmp_path / "x.json").read_text())
  assert got["non_finite"] == {"npz:cka_a_b": 2, "json:models.a.scores[1]": 1}
  assert "x's results hold NaN or inf values at ['json:models.a.scores[1]', 'npz:cka_a_b']" in capsys.readouterr().out
  driver.write(str(tmp_path), "y", {"mean": 0.5}, {"ok": np.ones(3)})
  assert "non_finite" not in json.loads((tmp_path / "y.json").read_text())


def test_the_real_pair_s_canonical_correlations_are_finite_and_exact():
  """The cause of the real report's NaN mean CCA, SVCCA and PWCCA between the
  ResNet and the ViT: `real_pair_cca_product.npy` is the (127, 127) product of
  two layers' orthonormal factors (real DINOv2-S/14 x ResNet-50-1by2 on the photo
  crops, a minibatch of 256), for which LAPACK's divide-and-conquer SVD with
  vectors, XLA:CPU's default, gave NaN (values alone were right). `lapack.svd`
  takes the QR-based one; the singular values (clustered at 1) and the factors
  are within float32 rounding of float64: a backward-stable SVD moves each value
  and the reconstruction by at most about n u ||m||_2, here bounded by 4 n u."""
  import os
  from vitcnn_jax.similarity import lapack
  from vitcnn_jax.similarity import subspaces
  m = np.load(os.path.join(ROOT, "tests", "support", "real_pair_cca_product.npy"))
  u, s, vt = jax.jit(lapack.svd)(m[None])
  want = np.linalg.svd(m.astype(np.float64), compute_uv=False)
  bound = 4 * len(m) * layer_checks.U32 * want[0]
  assert np.abs(np.asarray(s[0], np.float64) - want).max() <= bound
  assert np.abs((np.asarray(u[0], np.float64) * np.asarray(s[0])) @ np.asarray(vt[0]) - m).max() <= bound
  w = np.ones((1, len(m)), np.float32)  # every component kept, equal weights: PWCCA is mean CCA
  got = jax.jit(subspaces._pwcca)(m[None], w, w)
  assert abs(float(got["cca"][0]) - want.sum()) <= len(m) * bound
  assert abs(float(got["pwcca"][0]) - want.mean()) <= bound
