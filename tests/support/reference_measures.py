"""Float64 NumPy references of representational similarity measures, written from
the papers' definitions on the features themselves (no Gram-matrix identities),
so that they are independent of the library's Gram-based streaming sums.

Every function takes `xs, ys`: lists of per-minibatch float64 arrays (n_b, d_x)
and (n_b, d_y) holding the same examples (minibatch sizes may differ), and
returns the measure aggregated over the minibatches as its docstring says.
k-NN measures assume data without ties in the cosine similarities.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.linalg

Batches = Sequence[np.ndarray]


# --- helpers ------------------------------------------------------------------


def _pairs(xs: Batches, ys: Batches) -> list[tuple[np.ndarray, np.ndarray]]:
  assert len(xs) == len(ys) and len(xs) > 0, (len(xs), len(ys))
  out = []
  for x, y in zip(xs, ys):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    assert x.ndim == 2 and y.ndim == 2 and len(x) == len(y), (x.shape, y.shape)
    out.append((x, y))
  return out


def _centre(x: np.ndarray) -> np.ndarray:
  return x - x.mean(axis=0)


def _rank(s: np.ndarray, shape: tuple[int, ...]) -> int:
  """Numerical rank from singular values `s` (descending) of a matrix of `shape`."""
  if len(s) == 0 or s[0] == 0:
    return 0
  return int(np.sum(s > max(shape) * np.finfo(np.float64).eps * s[0]))


def _principal(xc: np.ndarray, dims: int | None, variance: float | None = None) -> np.ndarray:
  """Centred features projected on their top principal directions, Xc V_k.

  k = the smallest number of top components whose squared singular values reach
  `variance` of the total (all non-zero ones when `variance` is None), at most `dims`.
  """
  _, s, vt = np.linalg.svd(xc, full_matrices=False)
  k = _rank(s, xc.shape)
  if variance is not None and k > 0:
    cum = np.cumsum(s[:k] ** 2)
    k = int(np.argmax(cum / cum[-1] >= variance)) + 1
  if dims is not None:
    k = min(k, dims)
  return xc @ vt[:k].T


def _inv_sqrt(c: np.ndarray) -> np.ndarray:
  w, v = np.linalg.eigh(c)
  return (v / np.sqrt(w)) @ v.T


def _cca(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Canonical correlations of centred, full-column-rank `a`, `b` (descending, the
  min(width) of them) and the matching canonical weight vectors of `a` (columns),
  by whitening the sample covariances: svd(Caa^-1/2 Cab Cbb^-1/2)."""
  n = len(a)
  caa, cbb, cab = a.T @ a / (n - 1), b.T @ b / (n - 1), a.T @ b / (n - 1)
  wa = _inv_sqrt(caa)
  u, rho, _ = np.linalg.svd(wa @ cab @ _inv_sqrt(cbb))
  k = min(a.shape[1], b.shape[1])
  return rho[:k], wa @ u[:, :k]


def _distances(x: np.ndarray) -> np.ndarray:
  """Euclidean distances between the rows of x, pair by pair."""
  return np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))


def _cosines(x: np.ndarray) -> np.ndarray:
  u = x / np.linalg.norm(x, axis=1, keepdims=True)
  return (u[:, None, :] * u[None, :, :]).sum(-1)


def _neighbours(cos: np.ndarray, k: int) -> list[list[int]]:
  """For each example, the k most cosine-similar OTHER examples, most similar first."""
  n = len(cos)
  assert 0 < k < n, (k, n)
  out = []
  for i in range(n):
    others = [j for j in range(n) if j != i]
    others.sort(key=lambda j: -cos[i, j])
    out.append(others[:k])
  return out


def _off_diagonal_pairs(n: int) -> list[tuple[int, int]]:
  return [(i, j) for i in range(n) for j in range(n) if i != j]


# --- CCA family and Procrustes ---------------------------------------------------


def procrustes(xs: Batches, ys: Batches) -> float:
  """Orthogonal Procrustes distance on centred, Frobenius-normalised features
  (Ding, Denain & Steinhardt 2021): per minibatch d_b = min_Q ||Xn Q - Yn||_F over
  orthogonal Q (the narrower layer zero-padded); sqrt(mean_b d_b^2)."""
  sq = []
  for x, y in _pairs(xs, ys):
    xn, yn = _centre(x), _centre(y)
    xn, yn = xn / np.linalg.norm(xn), yn / np.linalg.norm(yn)
    d = max(xn.shape[1], yn.shape[1])
    xn = np.pad(xn, ((0, 0), (0, d - xn.shape[1])))
    yn = np.pad(yn, ((0, 0), (0, d - yn.shape[1])))
    q, _ = scipy.linalg.orthogonal_procrustes(xn, yn)
    sq.append(np.sum((xn @ q - yn) ** 2))
  return float(np.sqrt(np.mean(sq)))


def svcca(xs: Batches, ys: Batches, variance: float = 0.99, dims: int | None = None) -> float:
  """SVCCA (Raghu et al. 2017): per minibatch, each layer's centred features on
  the fewest top singular directions that keep `variance` of the squared singular
  values (at most `dims`), then the mean of the min(k_x, k_y) canonical
  correlations; mean over minibatches."""
  values = []
  for x, y in _pairs(xs, ys):
    xr = _principal(_centre(x), dims, variance)
    yr = _principal(_centre(y), dims, variance)
    rho, _ = _cca(xr, yr)
    values.append(np.mean(rho))
  return float(np.mean(values))


def pwcca(xs: Batches, ys: Batches, dims: int | None = None) -> float:
  """Projection-weighted CCA (Morcos, Raghu & Bengio 2018), l2 weights: per
  minibatch each layer on its top min(dims, rank) principal components; the unit
  canonical variates h_i of the FIRST layer weigh rho_i by w_i = sum_j <h_i, x_j>^2
  over the centred features x_j of xs: sum w rho / sum w; mean over minibatches."""
  values = []
  for x, y in _pairs(xs, ys):
    xc = _centre(x)
    xr, yr = _principal(xc, dims), _principal(_centre(y), dims)
    rho, a = _cca(xr, yr)
    h = xr @ a
    h = h / np.linalg.norm(h, axis=0)
    w = np.array([sum(float(h[:, i] @ xc[:, j]) ** 2 for j in range(xc.shape[1])) for i in range(len(rho))])
    values.append(np.sum(w * rho) / np.sum(w))
  return float(np.mean(values))


def eigenspace_overlap(xs: Batches, ys: Batches, dims: int | None = None) -> float:
  """Eigenspace overlap score (May et al. 2019) on UNCENTRED features: U = the top
  k = min(dims, rank) left singular vectors; ||U_x' U_y||_F^2 / max(k_x, k_y);
  mean over minibatches."""
  values = []
  for x, y in _pairs(xs, ys):
    us = []
    for z in (x, y):
      u, s, _ = np.linalg.svd(z, full_matrices=False)
      k = _rank(s, z.shape)
      if dims is not None:
        k = min(k, dims)
      us.append(u[:, :k])
    ux, uy = us
    values.append(np.sum((ux.T @ uy) ** 2) / max(ux.shape[1], uy.shape[1]))
  return float(np.mean(values))


# --- distance based ----------------------------------------------------------------


def _dcov_term(a: np.ndarray, b: np.ndarray, estimator: str) -> float:
  """One minibatch's V_b (biased) or U_b (unbiased) statistic of distance matrices a, b."""
  n = len(a)
  if estimator == "biased":
    ca = a - a.mean(0, keepdims=True) - a.mean(1, keepdims=True) + a.mean()
    cb = b - b.mean(0, keepdims=True) - b.mean(1, keepdims=True) + b.mean()
    return float(np.mean(ca * cb))
  if estimator == "unbiased":
    assert n > 3, n

    def u_centre(d):
      out = np.zeros_like(d)
      rows, cols, total = d.sum(1), d.sum(0), d.sum()
      for k, l in _off_diagonal_pairs(n):
        out[k, l] = d[k, l] - rows[k] / (n - 2) - cols[l] / (n - 2) + total / ((n - 1) * (n - 2))
      return out

    ua, ub = u_centre(a), u_centre(b)
    return float(sum(ua[k, l] * ub[k, l] for k, l in _off_diagonal_pairs(n)) / (n * (n - 3)))
  raise ValueError(f"estimator must be 'biased' or 'unbiased', not {estimator!r}")


def distance_correlation(xs: Batches, ys: Batches, estimator: str = "biased") -> float:
  """Distance correlation (Szekely, Rizzo & Bakirov 2007; unbiased: Szekely &
  Rizzo 2014) of the raw features: S(X, Y) = sum over minibatches of the double-
  centred (V) or U-centred (U) statistic; sqrt(max(S(X,Y), 0) / sqrt(S(X,X) S(Y,Y)))."""
  sxy = sxx = syy = 0.
  for x, y in _pairs(xs, ys):
    a, b = _distances(x), _distances(y)
    sxy += _dcov_term(a, b, estimator)
    sxx += _dcov_term(a, a, estimator)
    syy += _dcov_term(b, b, estimator)
  return float(np.sqrt(max(sxy, 0.) / np.sqrt(sxx * syy)))


def rsm_difference(xs: Batches, ys: Batches) -> float:
  """Root-mean-square difference of the Euclidean distance matrices over ordered
  pairs i != j within each minibatch."""
  total, count = 0., 0
  for x, y in _pairs(xs, ys):
    dx, dy = _distances(x), _distances(y)
    for i, j in _off_diagonal_pairs(len(x)):
      total += (dx[i, j] - dy[i, j]) ** 2
      count += 1
  return float(np.sqrt(total / count))


# --- k-NN neighbourhoods -----------------------------------------------------------


def knn_jaccard(xs: Batches, ys: Batches, k: int) -> float:
  """Mean Jaccard similarity of each example's k cosine-nearest other examples
  within its minibatch in the two layers."""
  values = []
  for x, y in _pairs(xs, ys):
    for nx, ny in zip(_neighbours(_cosines(x), k), _neighbours(_cosines(y), k)):
      values.append(len(set(nx) & set(ny)) / len(set(nx) | set(ny)))
  return float(np.mean(values))


def rank_similarity(xs: Batches, ys: Batches, k: int) -> float:
  """Rank similarity (Wang et al. 2022, IEEE TKDE, "Towards understanding the
  instability of network embedding"): over the common k-NN J of an example,
  sum 2 / ((1 + |r_j - r'_j|)(r_j + r'_j)) normalised by sum_{t<=|J|} 1/t (0 for
  empty J); mean over all examples."""
  values = []
  for x, y in _pairs(xs, ys):
    for nx, ny in zip(_neighbours(_cosines(x), k), _neighbours(_cosines(y), k)):
      rx = {j: r + 1 for r, j in enumerate(nx)}
      ry = {j: r + 1 for r, j in enumerate(ny)}
      common = set(nx) & set(ny)
      if not common:
        values.append(0.)
        continue
      num = sum(2 / ((1 + abs(rx[j] - ry[j])) * (rx[j] + ry[j])) for j in common)
      values.append(num / sum(1 / t for t in range(1, len(common) + 1)))
  return float(np.mean(values))


def second_order_cosine(xs: Batches, ys: Batches, k: int, distances: bool = False) -> float:
  """Second-order cosine similarity (Hamilton, Leskovec & Jurafsky 2016): cosine
  between an example's cosine similarities to the union of its k-NN in both layers,
  one vector per layer; mean over all examples. `distances=True` uses cosine
  distances 1 - cos instead (the variant of ReSi's code)."""
  values = []
  for x, y in _pairs(xs, ys):
    cx, cy = _cosines(x), _cosines(y)
    for i, (nx, ny) in enumerate(zip(_neighbours(cx, k), _neighbours(cy, k))):
      union = sorted(set(nx) | set(ny))
      vx, vy = cx[i, union], cy[i, union]
      if distances:
        vx, vy = 1 - vx, 1 - vy
      values.append(vx @ vy / (np.linalg.norm(vx) * np.linalg.norm(vy)))
  return float(np.mean(values))


# --- statistics of each layer alone --------------------------------------------------


def _magnitude(xs: Batches) -> float:
  total, count = 0., 0
  for x in xs:
    x = np.asarray(x, np.float64)
    for i, j in _off_diagonal_pairs(len(x)):
      total += float(x[i] @ x[j])
      count += 1
  return float(np.sqrt(max(total / count, 0.)))


def magnitude_difference(xs: Batches, ys: Batches) -> float:
  """|m(X) - m(Y)|, m = sqrt(max(mean over ordered pairs i != j within minibatches of
  <x_i, x_j>, 0)): an unbiased estimate of the mean's squared norm, square-rooted."""
  _pairs(xs, ys)
  return abs(_magnitude(xs) - _magnitude(ys))


def _concentricity(xs: Batches) -> float:
  values = []
  for x in xs:
    x = np.asarray(x, np.float64)
    mu = x.mean(0)
    values.extend(x @ mu / (np.linalg.norm(x, axis=1) * np.linalg.norm(mu)))
  return float(np.mean(values))


def concentricity_difference(xs: Batches, ys: Batches) -> float:
  """|c(X) - c(Y)|, c = mean over examples of the cosine between the example and the
  mean of its own minibatch (raw features)."""
  _pairs(xs, ys)
  return abs(_concentricity(xs) - _concentricity(ys))


def _uniformity(xs: Batches, t: float) -> float:
  total, count = 0., 0
  for x in xs:
    x = np.asarray(x, np.float64)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    for i, j in _off_diagonal_pairs(len(x)):
      total += np.exp(-t * np.sum((u[i] - u[j]) ** 2))
      count += 1
  return float(np.log(total / count))


def uniformity_difference(xs: Batches, ys: Batches, t: float = 2.) -> float:
  """|u(X) - u(Y)|, u = log of the mean over ordered pairs i != j within minibatches
  of exp(-t ||x^_i - x^_j||^2), x^ = x / ||x|| (Wang & Isola 2020)."""
  _pairs(xs, ys)
  return abs(_uniformity(xs, t) - _uniformity(ys, t))


def np_gulp_squared(x: np.ndarray, y: np.ndarray, lam: float) -> float:
  """Boix-Adserà et al. (2022): the squared GULP distance from the covariances of
  the layers centred and scaled to unit total variance (as GULP's code does)."""
  n = len(x)
  xs, ys = ((a - a.mean(0)) * np.sqrt(n) / np.linalg.norm(a - a.mean(0)) for a in (x, y))
  cxx, cyy, cxy = xs.T @ xs / n, ys.T @ ys / n, xs.T @ ys / n
  rx, ry = np.linalg.inv(cxx + lam * np.eye(len(cxx))), np.linalg.inv(cyy + lam * np.eye(len(cyy)))
  return float(np.trace(rx @ cxx @ rx @ cxx) + np.trace(ry @ cyy @ ry @ cyy)
               - 2 * np.trace(rx @ cxy @ ry @ cxy.T))
