"""Procrustes, SVCCA, PWCCA, eigenspace overlap, distance correlation, the RSM
difference, the k-NN measures and the descriptive differences against the float64
references of `reference_measures.py` (written on the features from the papers'
definitions), over unequal padded minibatches; their invariances; the degenerate
wide layer; the null; layer matching."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from support import reference_measures as ref
from support.library_sums import SIZES, batch_slices, padded_sums, related_layers
from support.library_sums import values_of_one
from support.numerics import assert_close, likely, worst
import vitcnn_jax
from vitcnn_jax.similarity import descriptive
from vitcnn_jax.similarity import matching
from vitcnn_jax.similarity import measures
from vitcnn_jax.similarity import neighbours

NEW = ("procrustes", "svcca", "pwcca", "eigenspace_overlap", "distance_correlation",
       "rsm_difference") + neighbours.NAMES + descriptive.FAMILY.names
DIMS, K = 5, 4
# Relative error of a Gram entry (of its largest diagonal): up to 24 features, 16 rows,
# the centring and scaling; 8 times that for what an eigh of 16 rows adds, as in test_subspaces.
GRAM = 2 * (likely(24, 16) + worst(16))
NOISE = 8 * GRAM
SEED = 27  # data whose neighbours are apart by more than float32 can move them (checked)


def _reference(m: str, xs, ys, estimator: str) -> float:
  fn = getattr(ref, m)
  if m in ("svcca",):
    return fn(xs, ys, variance=0.99, dims=DIMS)
  if m in ("pwcca", "eigenspace_overlap"):
    return fn(xs, ys, dims=DIMS)
  if m == "distance_correlation":
    return fn(xs, ys, estimator=estimator)
  if m in neighbours.NAMES:
    return fn(xs, ys, k=K)
  return fn(xs, ys)


def _gaps(a: np.ndarray, dims: int, centred: bool = True) -> tuple[float, float]:
  """(relative eigengap at component `dims`, largest over smallest nonzero eigenvalue)."""
  z = a - a.mean(0) if centred else a
  s = np.linalg.svd(z, compute_uv=False) ** 2
  s = s[s > 1e-10 * s[0]]
  return (s[dims - 1] - s[dims]) / s[0] if len(s) > dims else 1.0, s[0] / s[-1]


def _conditioning(acts, rows_list) -> dict[str, float]:
  """From float64, how far each measure's inputs are from where float32 rounding
  could change a discrete choice, and how much a rounding of a Gram moves it."""
  c = {"gap": np.inf, "gap_raw": np.inf, "spread": 1.0, "dist": 1.0, "cos_margin": np.inf,
       "variance_margin": np.inf, "norm": 1.0}
  for rows in rows_list:
    for a in acts:
      x = a[rows]
      gap, spread = _gaps(x, DIMS)
      c["gap"], c["spread"] = min(c["gap"], gap), max(c["spread"], spread)
      c["gap_raw"] = min(c["gap_raw"], _gaps(x, DIMS, centred=False)[0])
      s = np.linalg.svd(x - x.mean(0), compute_uv=False) ** 2
      share = np.cumsum(s[:DIMS]) / s.sum()  # only the components SVCCA may keep decide
      c["variance_margin"] = min(c["variance_margin"], np.abs(share - 0.99).min())
      g = (x - x.mean(0)) @ (x - x.mean(0)).T
      sq = np.diag(g)[:, None] + np.diag(g)[None, :] - 2 * g
      c["dist"] = max(c["dist"], g.diagonal().max() / sq[~np.eye(len(x), dtype=bool)].min())
      raw = x @ x.T
      c["norm"] = max(c["norm"], raw.diagonal().max() / raw.diagonal().min())
      cos = raw / np.sqrt(np.outer(raw.diagonal(), raw.diagonal()))
      np.fill_diagonal(cos, -np.inf)
      top = -np.sort(-cos, axis=1)[:, :K + 1]
      c["cos_margin"] = min(c["cos_margin"], np.diff(-top, axis=1).min())
  return c


def _bounds(c: dict, values: dict) -> dict[str, float]:
  """Each measure's absolute float32 bound, from a Gram entry's relative error (GRAM,
  or NOISE where an eigh is taken) and the data's conditioning (`_conditioning`)."""
  cos_noise = cos_error(c)
  # A squared distance loses up to 4 GRAM of the largest diagonal: a distance up to half
  # that over the smallest squared distance, relatively.
  dist_rel = 2 * GRAM * c["dist"]
  return {
      "procrustes": NOISE * np.sqrt(c["spread"]) / max(values["procrustes"], 0.1),  # as shape_metric
      "svcca": NOISE / c["gap"], "pwcca": 2 * NOISE / c["gap"],  # Davis-Kahan, as mean_cca
      "eigenspace_overlap": NOISE / c["gap_raw"],
      # CKA's ratio of three inner products of distance matrices (cka_bound), then its root.
      "distance_correlation": 3 * (dist_rel + likely(16 * 16)) / max(values["distance_correlation"], 0.1),
      # RMS(δD_x - δD_y) <= dist_rel (RMS D_x + RMS D_y); then the cancellation of
      # C_xx + C_yy - 2 C_xy, inner products of n² terms, under the root.
      "rsm_difference": dist_rel * values["rms_d"] + 4 * likely(16 * 16) * values["rms_d"] ** 2
                        / (2 * max(values["rsm_difference"], 1e-3)),
      # Same neighbours (margins checked): sums over 44 examples of rows of k.
      "knn_jaccard": worst(44, K * K), "rank_similarity": worst(44, K * K),
      "second_order_cosine": 4 * cos_noise + worst(44, 2 * K),
      # A mean of Gram entries off by GRAM of the largest; |√a - √b| <= min(√|a-b|, |a-b| / √b).
      "magnitude_difference": sum(min(np.sqrt(GRAM * values["raw_scale"]), GRAM * values["raw_scale"]
                                      / max(m, 1e-30)) for m in values["magnitudes"]),
      "concentricity_difference": 2 * cos_noise * values["mean_ratio"],
      "uniformity_difference": 2 * (2 * 2.0 * cos_noise + worst(16 * 16)),
  }


def cos_error(c: dict) -> float:
  """A cosine G_ij / (G_ii G_jj)^½ from Gram entries each off by GRAM of the largest
  diagonal: the numerator's error over the norms, and the norms' own."""
  return 2 * GRAM * c["norm"]


def _well_posed(c: dict) -> None:
  """The float32 bounds hold only away from discrete choices: neighbour order (two
  cosines each off by `cos_error`), and SVCCA's 99% boundary (each eigenvalue off by
  NOISE of the largest, Weyl, so a share of the first DIMS by DIMS NOISE)."""
  assert c["cos_margin"] > 2 * cos_error(c), c["cos_margin"]
  assert c["variance_margin"] > 2 * DIMS * NOISE, c["variance_margin"]


def _pair_bounds(xs, ys, c: dict, want: dict) -> dict[str, float]:
  rms = lambda zs: np.sqrt(np.mean(np.concatenate([np.sum((z[:, None] - z[None]) ** 2, -1).ravel() for z in zs])))
  extra = {"rms_d": rms(xs) + rms(ys), "magnitudes": [ref._magnitude(xs), ref._magnitude(ys)],
           "raw_scale": max(np.max(np.sum(a ** 2, 1)) for a in xs + ys),
           "mean_ratio": max(np.max(np.linalg.norm(a, axis=1)) / np.linalg.norm(a.mean(0))
                             for a in xs + ys)}
  return _bounds(c, {**want, **extra})


def _close(seed: int) -> list[np.ndarray]:
  """The first layer, the same plus noise of 1e-3 of its scale (close layers, where
  a difference of large sums would cancel), and the third."""
  x, _, z = related_layers(seed)
  return [x, x + 1e-3 * np.random.default_rng(seed).standard_normal(x.shape), z]


@pytest.mark.parametrize("estimator, data",
                         [("unbiased", related_layers), ("biased", related_layers), ("unbiased", _close)],
                         ids=["unbiased", "biased", "close layers"])
def test_each_equals_its_definition_over_unequal_padded_minibatches(estimator, data):
  acts = data(SEED)
  spec = measures.Spec(("linear_cka",) + NEW, estimator=estimator, cca_dims=DIMS, knn_k=K)
  got = padded_sums(acts, SIZES, spec)
  values = measures.values(got, ["x", "y", "z"], spec, sum(SIZES))
  rows_list = batch_slices(len(acts[0]), SIZES)
  c = _conditioning(acts, rows_list)
  _well_posed(c)
  for i, j in [(0, 1), (1, 0), (0, 2), (1, 2), (2, 2)]:
    xs, ys = [acts[i][r] for r in rows_list], [acts[j][r] for r in rows_list]
    want = {m: _reference(m, xs, ys, estimator) for m in NEW}
    bounds = _pair_bounds(xs, ys, c, want)
    for m in NEW:
      assert_close(values[m][i, j], want[m], bounds[m], f"{m} {i}-{j} {estimator}")


def test_the_neighbour_measures_where_k_leaves_a_part_block_of_examples():
  """They take k examples at a time: 13 with k = 4 end in a block padded with 3
  examples that have no neighbours, which must add nothing."""
  acts = related_layers(SEED)
  xs, ys = [acts[0][:13]], [acts[1][:13]]
  c = _conditioning(acts, [np.arange(13)])
  assert c["cos_margin"] > 2 * cos_error(c), c["cos_margin"]  # the same neighbours as float64
  got = values_of_one([xs[0], ys[0]], measures.Spec(neighbours.NAMES, knn_k=K))
  bounds = {"knn_jaccard": worst(13, K * K), "rank_similarity": worst(13, K * K),
            "second_order_cosine": 4 * cos_error(c) + worst(13, 2 * K)}
  for m in neighbours.NAMES:
    assert_close(got[m][0, 1], _reference(m, xs, ys, "unbiased"), bounds[m], m)


def test_second_order_cosine_is_hamiltons_not_resis():
  """Hamilton et al. compare cosine similarities; ReSi's code compares distances."""
  acts = related_layers(SEED)
  xs, ys = [acts[0][:16]], [acts[1][:16]]
  got = values_of_one([acts[0][:16], acts[1][:16]], measures.Spec(("second_order_cosine",), knn_k=K))
  assert_close(got["second_order_cosine"][0, 1], ref.second_order_cosine(xs, ys, K), 1e-4, "Hamilton")
  assert abs(got["second_order_cosine"][0, 1] - ref.second_order_cosine(xs, ys, K, distances=True)) > 0.01


def test_invariances():
  """Each measure unchanged by the maps its definition ignores, moved by one it does not."""
  rng = np.random.default_rng(8)
  n = 41
  x = rng.standard_normal((n, 6)) + 0.5
  y = x[:, :4] @ rng.standard_normal((4, 5)) + 0.6 * rng.standard_normal((n, 5))
  spec = measures.Spec(NEW, cca_dims=20, knn_k=K)
  base = values_of_one([x, y], spec)
  q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
  bound = 64 * (likely(6, n) + worst(n)) * 1e2  # conditioning of these small layers: see above
  scale_free = set(NEW) - {"rsm_difference", "magnitude_difference"}
  maps = {"orthogonal": (x @ q, set(NEW)), "permuted": (x[:, ::-1], set(NEW)),
          "scaled": (7.5 * x, scale_free)}
  for what, (moved, invariant) in maps.items():
    got = values_of_one([moved, y], spec)
    for m in invariant:
      assert_close(got[m][0, 1], base[m][0, 1], bound, f"{m} under {what} features")
  got = values_of_one([7.5 * x, y], spec)
  for m in ("rsm_difference", "magnitude_difference"):  # in the layers' units
    assert abs(got[m][0, 1] - base[m][0, 1]) > 0.1, m
  # A translation moves the uncentred measures, not the centred ones.
  got = values_of_one([x + 3.0, y], spec)
  for m in ("procrustes", "svcca", "pwcca", "distance_correlation", "rsm_difference"):
    assert_close(got[m][0, 1], base[m][0, 1], bound * 10, f"{m} under translation")
  for m in ("eigenspace_overlap", "knn_jaccard", "magnitude_difference", "concentricity_difference",
            "uniformity_difference"):
    assert abs(got[m][0, 1] - base[m][0, 1]) > 1e-3, m


def test_a_layer_as_wide_as_the_minibatch_is_reduced():
  """Independent layers of 40 features in minibatches of 16: whole, SVCCA, PWCCA and
  the eigenspace overlap (over the larger rank) would be 1 whatever the layers;
  through 7 components each they are what 7-dimensional subspaces give."""
  rng = np.random.default_rng(9)
  x, y = rng.standard_normal((16, 40)), rng.standard_normal((16, 40))
  assert ref.svcca([x], [y], variance=1.0) > 1 - 1e-9
  assert ref.pwcca([x], [y]) > 1 - 1e-9
  assert ref.eigenspace_overlap([x], [y]) > 1 - 1e-9
  got = values_of_one([x, y], measures.Spec(("svcca", "pwcca", "eigenspace_overlap"), cca_dims=7))
  for m in ("svcca", "pwcca", "eigenspace_overlap"):
    assert got[m][0, 1] < 0.9, (m, got[m][0, 1])
  assert_close(got["eigenspace_overlap"][0, 1], ref.eigenspace_overlap([x], [y], dims=7), 1e-3, "reduced")


def test_the_null_is_each_measure_with_one_layer_permuted():
  """`null/` is the measure with the column layer's examples in the key's order
  above the diagonal, the row layer's below it (PWCCA is one-way); the
  descriptive statistics ignore the order, so they have none."""
  acts = related_layers(3, n=16)
  spec = measures.Spec(NEW, cca_dims=DIMS, knn_k=K, null=True)
  key = jax.random.PRNGKey(7)
  order = np.asarray(measures.permutation(key, np.ones(16, np.float32)))
  sums = padded_sums(acts, [16], spec, key=key)
  null = measures.values(sums, ["a", "b", "c"], spec, 16, null=True)
  value = measures.values(sums, ["a", "b", "c"], spec, 16)
  moved = [a[order] for a in acts]
  c = _conditioning(acts + moved, [slice(0, 16)])
  _well_posed(c)
  plain = padded_sums(acts[:1] + moved, [16], measures.Spec(NEW, cca_dims=DIMS, knn_k=K))
  want = measures.values(plain, ["a", "a'", "b'", "c'"], measures.Spec(NEW, cca_dims=DIMS, knn_k=K), 16)
  for b in range(3):
    exact = {m: _reference(m, [acts[0]], [moved[b]], "unbiased") for m in NEW}
    bounds = _pair_bounds([acts[0]], [moved[b]], c, exact)
    for m in NEW:
      if not measures.REGISTRY[m].null:
        assert m not in null and m in value, m
      else:  # two float32 evaluations, each within its bound of the same exact value
        assert_close(null[m][0, b], want[m][0, b + 1], 2 * bounds[m], f"null {m} 0-{b}")
        if b:  # below the diagonal: the row layer's examples re-indexed (see layerpairs)
          assert_close(null[m][b, 0], want[m][b + 1, 0], 2 * bounds[m], f"null {m} {b}-0")
    assert abs(null["knn_jaccard"][0, b] - value["knn_jaccard"][0, b]) > 0.05  # a new order


def test_layer_matching():
  """The monotone alignment is the best order-keeping one (exhaustive on small maps);
  the best match is each row's argmax; distances flip both; the score of a map
  whose best alignment is its diagonal is the diagonal's mean."""
  import itertools
  rng = np.random.default_rng(0)
  for _ in range(50):
    r, c = rng.integers(1, 5, size=2)
    m = rng.standard_normal((r, c))
    best = max(sum(m[i, j] for i, j in enumerate(js)) for js in itertools.product(range(c), repeat=r)
               if all(a <= b for a, b in zip(js, js[1:])))
    path = matching.monotone(m)
    assert np.all(np.diff(path) >= 0)
    assert abs(m[np.arange(r), path].sum() - best) < 1e-12
    np.testing.assert_array_equal(matching.monotone(-m, distance=True), path)
    np.testing.assert_array_equal(matching.best(m), m.argmax(1))
  m = np.eye(4) + 0.1 * rng.random((4, 4))
  assert matching.score(m) == pytest.approx(np.diag(m).mean())
  m = np.array([[0.9, 0.8], [0.95, 0.1]])  # row 1's argmax (column 0) is behind row 0's (0)
  np.testing.assert_array_equal(matching.monotone(m), [0, 0])
  m = np.array([[0.2, 0.9, 0.1], [0.8, 0.3, 0.7]])  # argmax goes back: 1 then 0
  np.testing.assert_array_equal(matching.best(m), [1, 0])
  np.testing.assert_array_equal(matching.monotone(m), [1, 2])  # 0.9 + 0.7 beats 0.2 + 0.8


def test_svcca_keeps_the_fewest_components_of_99_percent_of_the_variance():
  """Layers whose top three components hold 99.7% of the variance (two hold 93%):
  SVCCA reads those three, not the seven components cca_dims allows."""
  rng = np.random.default_rng(4)
  basis = lambda n: np.linalg.qr(rng.standard_normal((n, n)))[0]
  sv = np.array([10, 6, 3, 0.5, 0.3, 0.2, 0.1, 0.1, 0.05, 0.05])
  x = (basis(16)[:, :10] * sv) @ basis(10)
  y = 0.5 * x[:, ::-1] + (basis(16)[:, :10] * sv) @ basis(10)
  got = values_of_one([x, y], measures.Spec(("svcca", "mean_cca"), cca_dims=7))
  want = ref.svcca([x], [y], variance=0.99, dims=7)
  assert abs(want - ref.svcca([x], [y], variance=1.0, dims=7)) > 0.02  # the rule matters here
  gap = min(_gaps(a, 3)[0] for a in (x, y))  # at the third component, the last kept
  assert_close(got["svcca"][0, 1], want, NOISE / gap, "svcca at 99%")


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_distance_correlation_weighs_unequal_minibatches_as_defined(estimator):
  """dCov² sums over minibatches of 16 and 6 examples: each minibatch's statistic
  with its own normalisation (1/n² or 1/(n(n-3)))."""
  acts = related_layers(SEED, n=22)
  spec = measures.Spec(("distance_correlation",), estimator=estimator)
  got = measures.values(padded_sums(acts, [16, 6], spec), ["x", "y", "z"], spec, 22)
  rows_list = batch_slices(22, [16, 6])
  c = _conditioning(acts, rows_list)
  for i, j in [(0, 1), (0, 2)]:
    want = ref.distance_correlation([acts[i][r] for r in rows_list], [acts[j][r] for r in rows_list],
                                    estimator)
    bound = 3 * (2 * GRAM * c["dist"] + likely(16 * 16)) / max(want, 0.1)
    assert_close(got["distance_correlation"][i, j], want, bound, f"dCor {i}-{j} {estimator}")


def _on_two_cores(code: str, env: dict[str, str]):
  """`code` run in a child process of one CPU device, on at most 2 of this machine's cores."""
  import subprocess
  import sys
  from conftest import ROOT
  code = "import os\nos.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])\n" + code
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, env=env)


@pytest.mark.parametrize("names,rows", [
    (("eigenspace_overlap", "cca_r2", "regression", "gulp"), 256),  # two eighs side by side
    (("shape_metric", "pwcca", "svcca"), 32)])  # the pair loop's SVDs, ordered by a barrier only
def test_the_step_s_lapack_calls_do_not_deadlock_on_two_cores(names, rows):
  """jaxlib's batched eigh and SVD block a thread of XLA's pool until the pool has
  run their batch: two side by side each held one of two pool threads waiting for
  the other. The step, in a process of its own on 2 cores, must finish its calls
  (both cases hung with calls ordered by an optimization_barrier alone)."""
  code = f"""
import functools, jax, jax.numpy as jnp, numpy as np
from vitcnn_jax.similarity import measures
rng = np.random.default_rng(0)
acts = [jnp.asarray(rng.normal(size=({rows}, 64)), jnp.float32) for _ in range(40)]
spec = measures.Spec({names!r}, cca_dims={rows // 2 - 1}, null=True)
f = jax.jit(functools.partial(measures.minibatch_sums, spec=spec))
for i in range(10):  # a deadlock is a race: more steps, more chances to show it
  jax.block_until_ready(f(acts, jnp.ones({rows}), key=jax.random.PRNGKey(i)))
print("done")
"""
  from conftest import device_env
  # A pool of one thread a core (vitcnn_jax's default of two would leave a thread
  # free, and hide the deadlock).
  got = _on_two_cores(code, {**device_env(1), "PJRT_NPROC": "2"})
  assert got.returncode == 0 and "done" in got.stdout, got.stderr[-2000:]


@pytest.mark.parametrize("given", [None, "3"])
def test_xla_s_cpu_pool_has_two_threads_a_core_unless_set(given):
  """Importing vitcnn_jax before jax starts sizes XLA's CPU pool at twice the cores
  (so that a LAPACK call waiting on its pool thread leaves every core working); a
  PJRT_NPROC of the user's stays. Counted: XLA's pool threads of a process on (at
  most) 2 cores."""
  code = """
import vitcnn_jax, jax.numpy as jnp
jnp.linalg.svd(jnp.ones((8, 4, 4)))[1].block_until_ready()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(len(os.sched_getaffinity(0)), os.environ["PJRT_NPROC"], names.count("tf_XLAEigen"))
"""
  from conftest import device_env
  env = {k: v for k, v in device_env(1).items() if k not in ("PJRT_NPROC", "NPROC")}
  got = _on_two_cores(code, env if given is None else {**env, "PJRT_NPROC": given})
  assert got.returncode == 0, got.stderr[-2000:]
  cores, *pool = got.stdout.split()
  threads = 2 * int(cores) if given is None else int(given)
  assert pool == [str(threads), str(threads)], got.stdout


@pytest.mark.parametrize("given", [None, "+individual_dot,+individual_convolution"])
def test_a_dot_or_convolution_alone_is_left_to_eigen_unless_the_user_chooses(given):
  """Importing vitcnn_jax before jax starts takes dots and convolutions that stand
  alone (a Gram, the all-pairs products, a network's k x k convolutions) from
  YNNPACK, which ran them at up to half Eigen's speed, and the installed jaxlib
  accepts the flag (an unknown one aborts the process); a user's own choice of
  YNNPACK's fusions stays. Read from each compiled program."""
  code = """
import vitcnn_jax, jax, jax.numpy as jnp
def library(f, *args):
  hlo = jax.jit(f).lower(*args).compile().as_text()
  return "ynn_fusion" in hlo[hlo.index("ENTRY"):]
x, w = jnp.ones((32, 4096)), jnp.ones((3, 3, 64, 64))
dot = library(lambda x: jnp.matmul(x, x.T, precision="highest"), x)
nhwc = ("NHWC", "HWIO", "NHWC")
conv = library(lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=nhwc),
               jnp.ones((4, 16, 16, 64)), w)
print(os.environ["XLA_FLAGS"].split()[-1], dot, conv)
"""
  from conftest import device_env
  env = device_env(1)
  flags = [f for f in env["XLA_FLAGS"].split() if "ynn_fusion_type" not in f]
  env["XLA_FLAGS"] = " ".join(flags + ([f"--xla_cpu_experimental_ynn_fusion_type={given}"] if given else []))
  got = _on_two_cores(code, env)
  assert got.returncode == 0, got.stderr[-2000:]
  last, dot, conv = got.stdout.split()
  if given is None:
    assert (last, dot, conv) == (vitcnn_jax.CPU_CONTRACTIONS, "False", "False"), got.stdout
  else:
    assert (last, dot, conv) == (f"--xla_cpu_experimental_ynn_fusion_type={given}", "True", "True"), got.stdout


def test_demo_measures_runs_every_measure():
  from configs import cka_vit_resnet
  assert tuple(cka_vit_resnet.get_config("demo_measures").measures) == measures.NAMES


def test_every_registered_measure_declares_itself():
  """The registry (`measures.FAMILIES`): each name once, in one family; a label of
  its own; its json text under default parameters; which are distances, which
  have no null and which count their clips, as the docs say."""
  names = [m.name for f in measures.FAMILIES for m in f.measures]
  assert tuple(names) == measures.NAMES and len(set(names)) == len(names)
  labels = [measures.REGISTRY[m].label for m in names]
  assert all(labels) and len(set(labels)) == len(labels)
  spec = measures.Spec(measures.NAMES)
  assert all(measures.describe(m, spec).endswith(")") for m in names)
  kinds = lambda key: {m for m in names if key(measures.REGISTRY[m])}
  assert kinds(lambda m: m.distance) == {"rsm_difference", "procrustes", "gulp", *descriptive.FAMILY.names}
  assert kinds(lambda m: not m.null) == set(descriptive.FAMILY.names)
  assert kinds(lambda m: m.clip) == {"distance_correlation", "magnitude_difference"}

