"""Node strata for branching data: K-means over per-node summary features, the number of strata by the elbow rule,
strata ordered by mean depth (stratum 0 = the most upstream).

SC-MILP (Lu, Ma, Tao, ICML 2026, arXiv 2511.21107) groups branch-and-bound nodes by their feature distributions
with unsupervised clustering (K-means, m chosen by the elbow method; public summaries of the paper, no code) and
re-estimates the groups during training. Here:

* `standardize(x)`: per-feature z-scores (constant features left at 0), the space K-means runs in.
* `elbow(inertias, ks)`: the smallest k after which one more cluster lowers the within-cluster sum of squares by
  less than a quarter (the curve's elbow; robust to several large early drops, where a largest-second-difference
  knee stops at the first).
* `fit_strata(x, depth, ks, seed)`: K-means (scikit-learn, k-means++ with `n_init` restarts) for each k, the
  elbow's k, and labels renumbered so that stratum means of depth increase.
* `Strata.assign(x)`: the nearest centre for new nodes (test data, re-estimation during training).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass
class Strata:
  """A fitted stratification.

  Attributes:
    k: the number of strata.
    centers: (k, F) centres in standardised space, ordered by mean depth.
    mean: (F,) and scale: (F,): the standardisation.
    inertias: {k: within-cluster sum of squares} of every k tried.
    depth_means: (k,) mean depth per stratum (increasing).
  """
  k: int
  centers: np.ndarray
  mean: np.ndarray
  scale: np.ndarray
  inertias: dict
  depth_means: np.ndarray

  def assign(self, x: np.ndarray) -> np.ndarray:
    """(N,) stratum of each row of `x` (N, F): the nearest centre."""
    z = (np.asarray(x, np.float64) - self.mean) / self.scale
    d = ((z[:, None, :] - self.centers[None]) ** 2).sum(-1)
    return np.argmin(d, axis=1)


def standardize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(z, mean, scale) with z = (x - mean) / scale and scale = 1 where a feature is constant."""
  x = np.asarray(x, np.float64)
  mean, sd = x.mean(0), x.std(0)
  scale = np.where(sd > 1e-12, sd, 1.0)
  return (x - mean) / scale, mean, scale


def elbow(inertias: Sequence[float], ks: Sequence[int], min_gain: float = 0.25) -> int:
  """The elbow of a decreasing within-cluster SSE curve over increasing `ks`: the smallest k after which one more
  cluster lowers the SSE by less than `min_gain` of its value (the last k when every step still gains)."""
  ks, v = list(ks), np.asarray(inertias, np.float64)
  if len(ks) != len(v) or len(ks) < 3:
    raise ValueError(f"elbow needs >= 3 (k, inertia) pairs, got {len(ks)} ks and {len(v)} inertias")
  for i in range(len(ks) - 1):
    if v[i] <= 0 or (v[i] - v[i + 1]) < min_gain * v[i]:
      return ks[i]
  return ks[-1]


def fit_strata(x: np.ndarray, depth: np.ndarray, ks: Sequence[int] = tuple(range(2, 9)), seed: int = 0,
               n_init: int = 4, k: int | None = None) -> Strata:
  """K-means strata of node features `x` (N, F) with `depth` (N,) for the ordering.

  Args:
    x, depth: per-node summary features and depths.
    ks: the candidate numbers of strata (the elbow picks one) unless `k` is given.
    seed: K-means seed.
    n_init: K-means restarts per k.
    k: a fixed number of strata (coarse-to-fine schedules pass it).
  """
  from sklearn.cluster import KMeans  # pylint: disable=g-import-not-at-top
  z, mean, scale = standardize(x)
  depth = np.asarray(depth, np.float64)
  tried = [k] if k is not None else [kk for kk in ks if kk <= len(z)]
  fits = {kk: KMeans(n_clusters=kk, n_init=n_init, random_state=seed).fit(z) for kk in tried}
  inertias = {kk: float(f.inertia_) for kk, f in fits.items()}
  best = k if k is not None else (elbow([inertias[kk] for kk in tried], tried) if len(tried) >= 3 else tried[0])
  f = fits[best]
  depth_means = np.array([depth[f.labels_ == j].mean() if np.any(f.labels_ == j) else np.inf for j in range(best)])
  order = np.argsort(depth_means, kind="stable")
  return Strata(best, f.cluster_centers_[order], mean, scale, inertias, depth_means[order])
