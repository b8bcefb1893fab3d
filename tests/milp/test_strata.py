"""Node strata: the elbow finds the number of well-separated blobs, the K-means fit matches scikit-learn's inertia,
strata are ordered by depth, and `assign` reproduces the training labels."""

import numpy as np
import pytest

from jaxlab.milp import strata


def _blobs(k, n=60, seed=0):
  rng = np.random.default_rng(seed)
  centers = rng.normal(0, 10, (k, 3))
  labels = np.repeat(np.arange(k), n)
  x = centers[labels] + rng.normal(0, 0.5, (k * n, 3))
  return x, labels


@pytest.mark.parametrize("k", [3, 4, 5])
def test_elbow_recovers_the_number_of_blobs(k):
  x, labels = _blobs(k, seed=k)
  depth = labels * 2.0 + 1.0
  s = strata.fit_strata(x, depth, ks=range(2, 9), seed=0)
  assert s.k == k
  assert np.all(np.diff(s.depth_means) > 0)          # stratum 0 = the shallowest
  got = s.assign(x)
  # each blob is one stratum; the strata are numbered by depth, which here is the blob id
  assert (got == labels).all()


def test_inertia_matches_sklearn_and_fixed_k():
  from sklearn.cluster import KMeans
  x, _ = _blobs(3, seed=9)
  s = strata.fit_strata(x, np.zeros(len(x)), k=3, seed=1)
  z, _, _ = strata.standardize(x)
  ref = KMeans(n_clusters=3, n_init=4, random_state=1).fit(z)
  assert s.k == 3 and s.inertias[3] == pytest.approx(ref.inertia_, rel=1e-9)


def test_elbow_and_standardize_edge_cases():
  assert strata.elbow([100, 40, 35, 33, 32], [2, 3, 4, 5, 6]) == 3
  with pytest.raises(ValueError, match=">= 3"):
    strata.elbow([1.0, 0.5], [2, 3])
  z, mean, scale = strata.standardize(np.array([[1.0, 5.0], [3.0, 5.0]]))
  assert scale[1] == 1.0 and np.allclose(z[:, 1], 0) and np.allclose(z[:, 0], [-1, 1])
