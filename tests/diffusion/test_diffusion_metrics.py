"""Diffusion metrics against scipy / brute force: exact W1, entropic W1, sliced W1, subspaces, slope fits."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, stats

from jaxlab.diffusion import data, metrics
from jaxlab.errors import ConfigError, DataError, MissingDependencyError


def test_w1_exact_equals_assignment_and_1d_closed_form():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(40, 3)), rng.normal(size=(40, 3)) + 0.5
  cost = np.linalg.norm(a[:, None] - b[None], axis=-1)
  r, c = optimize.linear_sum_assignment(cost)
  assert metrics.w1_exact(a, b) == pytest.approx(cost[r, c].mean(), rel=1e-9)
  u, v = rng.normal(size=(30, 1)), rng.exponential(size=(45, 1))
  assert metrics.w1_exact(u, v) == pytest.approx(stats.wasserstein_distance(u[:, 0], v[:, 0]), rel=1e-7)


@pytest.mark.slow  # ott-jax compile: ~8 s on 2 shared cores
def test_w1_sinkhorn_close_to_exact():
  rng = np.random.default_rng(1)
  a, b = rng.normal(size=(64, 4)), rng.normal(size=(64, 4)) + 1.0
  assert metrics.w1_sinkhorn(a, b, epsilon=1e-3) == pytest.approx(metrics.w1_exact(a, b), rel=0.03)


def test_sliced_w1_matches_scipy_per_projection():
  rng = np.random.default_rng(2)
  a, b = rng.normal(size=(50, 6)).astype(np.float32), rng.uniform(size=(50, 6)).astype(np.float32)
  key = jax.random.key(3)
  ours = float(metrics.sliced_w1(key, jnp.asarray(a), jnp.asarray(b), num_projections=16))
  theta = np.asarray(jax.random.normal(key, (6, 16), jnp.float32), np.float64)
  theta /= np.linalg.norm(theta, axis=0)
  ref = np.mean([stats.wasserstein_distance(a @ th, b @ th) for th in theta.T])
  assert ours == pytest.approx(ref, rel=1e-4)
  with pytest.raises(DataError, match="same shape"):
    metrics.sliced_w1(key, jnp.zeros((5, 2)), jnp.zeros((6, 2)))


def test_nearest_subspace_matches_least_squares():
  bases = data.random_subspaces(np.random.default_rng(0), 7, 2, 3)
  x = np.random.default_rng(4).normal(size=(20, 7)).astype(np.float32)
  dist, idx = metrics.nearest_subspace(jnp.asarray(x), bases)
  ref = np.array([[np.linalg.norm(xi - u @ np.linalg.lstsq(u, xi, rcond=None)[0]) for u in np.asarray(bases)]
                  for xi in x])
  np.testing.assert_allclose(np.asarray(dist), ref.min(1), rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(idx), ref.argmin(1))
  np.testing.assert_allclose(metrics.assignment_frequencies(np.array([0, 2, 2, 1]), 3), [0.25, 0.25, 0.5])


def test_union_samples_lie_on_their_subspaces():
  bases = data.random_subspaces(np.random.default_rng(1), 16, 3, 4)
  np.testing.assert_allclose(np.einsum("mdk,mdl->mkl", bases, bases), np.tile(np.eye(3), (4, 1, 1)), atol=1e-5)
  near = jax.jit(metrics.nearest_subspace)
  for coords in ("gaussian", "uniform"):
    x, lab = data.sample_union(np.random.default_rng(2), bases, 4000, coords)
    dist, idx = near(x, bases)
    assert float(dist.max()) < 1e-4
    np.testing.assert_array_equal(np.asarray(idx), np.asarray(lab))
    np.testing.assert_allclose(np.mean(np.sum(np.asarray(x) ** 2, -1)), 3.0, rtol=0.05)  # unit-variance coords
    np.testing.assert_allclose(metrics.assignment_frequencies(lab, 4), 0.25, atol=0.03)
    if coords == "uniform":
      c = np.einsum("nd,ndk->nk", x, bases[lab])
      assert np.abs(c).max() <= np.sqrt(3.0) + 1e-5
      assert stats.kstest(c[:, 0], stats.uniform(-3 ** .5, 2 * 3 ** .5).cdf).pvalue > 1e-3
  with pytest.raises(ConfigError, match="1 <= k <= D"):
    data.random_subspaces(np.random.default_rng(0), 2, 3, 1)


def test_loglog_slope_and_interval():
  ns = np.array([100, 200, 400, 800, 1600])
  assert metrics.loglog_slope(ns, 3.0 * ns ** -0.25)["slope"] == pytest.approx(-0.25, abs=1e-10)
  y = 2.0 * ns ** -0.5 * np.exp(np.array([0.05, -0.03, 0.02, -0.06, 0.01]))
  fit = metrics.loglog_slope(ns, y)
  x, ly = np.log(ns), np.log(y)
  slope, icpt = np.polyfit(x, ly, 1)
  se = np.sqrt(np.sum((ly - icpt - slope * x) ** 2) / 3 / np.sum((x - x.mean()) ** 2))
  assert fit["slope"] == pytest.approx(slope) and fit["stderr"] == pytest.approx(se)
  assert fit["hi"] - fit["slope"] == pytest.approx(stats.t.ppf(0.975, 3) * se)
  with pytest.raises(DataError, match="positive"):
    metrics.loglog_slope([1, 2], [1.0, 0.0])


def test_missing_pot_is_a_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "ot", None)
  with pytest.raises(MissingDependencyError, match=r"\.\[ot\]"):
    metrics.w1_exact(np.zeros((2, 2)), np.ones((2, 2)))
