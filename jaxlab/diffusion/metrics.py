"""Distances between sample sets, distance to a union of subspaces, and log-log rate fits.

* `w1_exact`: the exact 1-Wasserstein distance between two empirical measures (network simplex of POT,
  `ot.emd2` on the Euclidean cost matrix; host-side numpy, float64). O(n^2) memory: use up to n ~ 10^4.
* `w1_sinkhorn`: entropic OT (ott-jax Sinkhorn, Euclidean cost) for larger n; its transport cost
  <P, C> approaches W1 as epsilon -> 0.
* `sliced_w1`: mean over random unit directions of the 1-D W1 of the projections (dimension-free rate
  ~ n^{-1/2}; a sanity metric, it cannot show the n^{-1/k} rate).
* `nearest_subspace`: distance ||x - U_m U_m^T x|| to the nearest of M subspaces and its index.
* `loglog_slope`: least-squares slope of log(value) on log(n) with a t-based confidence interval
  (scipy.stats.linregress).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from jaxlab.errors import DataError, require


def _pair(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not len(a) or not len(b):
    raise DataError(f"expected two non-empty sample sets (n, dim) and (m, dim), got {a.shape} and {b.shape}")
  return a, b


def w1_exact(a_nd, b_md, num_iter_max: int = 10_000_000) -> float:
  """Exact W1 between the uniform empirical measures of a (n, dim) and b (m, dim) (POT network simplex).

  Raises:
    MissingDependencyError: POT is not installed (pip install -e '.[ot]').
    DataError: bad shapes.
  """
  ot = require("ot", "ot")
  a, b = _pair(a_nd, b_md)
  cost = ot.dist(a, b, metric="euclidean")
  return float(ot.emd2(np.full(len(a), 1.0 / len(a)), np.full(len(b), 1.0 / len(b)), cost,
                       numItermax=num_iter_max))


def w1_sinkhorn(a_nd, b_md, epsilon: float = 1e-3, max_iterations: int = 5000) -> float:
  """Entropic approximation of W1 (ott-jax Sinkhorn with Euclidean cost): the transport cost <P, C>.

  Args:
    a_nd, b_md: sample sets (uniform weights).
    epsilon: entropic regularisation, relative to the mean cost (ott's `relative_epsilon="mean"`).
    max_iterations: Sinkhorn iterations cap.
  """
  require("ott", "ot")
  from ott.geometry import costs, pointcloud  # pylint: disable=g-import-not-at-top
  from ott.solvers import linear  # pylint: disable=g-import-not-at-top
  a, b = _pair(a_nd, b_md)
  geom = pointcloud.PointCloud(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32),
                               cost_fn=costs.Euclidean(), epsilon=epsilon, relative_epsilon="mean")
  out = linear.solve(geom, max_iterations=max_iterations)
  return float(out.transport_cost_at_geom(geom))


def sliced_w1(key: jax.Array, a_nd: jax.Array, b_nd: jax.Array, num_projections: int = 128) -> jax.Array:
  """Sliced W1 between two equal-size sample sets: mean over random unit directions of sorted-projection gaps.

  Args:
    key: PRNG key for the directions.
    a_nd, b_nd: (n, dim) sample sets of the same size.
    num_projections: number of random directions.

  Returns:
    scalar float32.
  """
  if a_nd.ndim != 2 or a_nd.shape != b_nd.shape:
    raise DataError(f"sliced_w1 needs two sample sets of the same shape (n, dim), got {a_nd.shape}, {b_nd.shape}")
  theta = jax.random.normal(key, (a_nd.shape[1], num_projections), jnp.float32)
  theta = theta / jnp.linalg.norm(theta, axis=0, keepdims=True)
  pa, pb = jnp.sort(a_nd @ theta, axis=0), jnp.sort(b_nd @ theta, axis=0)
  return jnp.mean(jnp.abs(pa - pb))


def nearest_subspace(x_nd: jax.Array, bases_mdk: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Distance to the nearest of M subspaces (orthonormal bases (M, D, k)) and its index.

  Returns:
    (dist (n,) float32, index (n,) int32).
  """
  if x_nd.ndim != 2 or bases_mdk.ndim != 3 or x_nd.shape[1] != bases_mdk.shape[1]:
    raise DataError(f"expected x (n, D) and bases (M, D, k), got {x_nd.shape} and {bases_mdk.shape}")
  coef = jnp.einsum("nd,mdk->nmk", x_nd, bases_mdk)
  proj = jnp.einsum("nmk,mdk->nmd", coef, bases_mdk)
  dist = jnp.linalg.norm(x_nd[:, None, :] - proj, axis=-1)
  return jnp.min(dist, 1), jnp.argmin(dist, 1).astype(jnp.int32)


def assignment_frequencies(index_n, m: int) -> np.ndarray:
  """(M,) fraction of points assigned to each subspace."""
  return np.bincount(np.asarray(index_n), minlength=m)[:m] / max(1, np.asarray(index_n).size)


def loglog_slope(ns, values, confidence: float = 0.95) -> dict:
  """Fits log(value) = intercept + slope * log(n) by least squares.

  Returns:
    {"slope", "intercept", "stderr", "lo", "hi", "r"}: the slope's t-interval at `confidence` (nan width
    with only two points).
  """
  with np.errstate(divide="ignore", invalid="ignore"):
    x, y = np.log(np.asarray(ns, np.float64)), np.log(np.asarray(values, np.float64))
  if x.shape != y.shape or x.size < 2 or not np.all(np.isfinite(y)):
    raise DataError(f"loglog_slope needs >= 2 positive values of matching length, got n={ns}, values={values}")
  fit = stats.linregress(x, y)
  dof = x.size - 2
  half = stats.t.ppf(0.5 + confidence / 2, dof) * fit.stderr if dof > 0 else float("nan")
  return {"slope": float(fit.slope), "intercept": float(fit.intercept), "stderr": float(fit.stderr),
          "lo": float(fit.slope - half), "hi": float(fit.slope + half), "r": float(fit.rvalue)}
