"""Robust reward estimators against numpy / scipy, and the incremental history against the pure functions."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxlab.rl.tabular import estimators as est

C = 64


def _pad(x):
  out = np.zeros(C, np.float32)
  out[: len(x)] = x
  return jnp.asarray(out)


def _np_trimmed(x, eps, delta, ef=8.0, lf=24.0):
  """Brute-force Lugosi-Mendelson in float64: halves by arrival, thresholds from Z', clip Z."""
  x = np.asarray(x, np.float64)
  n = len(x)
  z, z2 = x[: n // 2], np.sort(x[n // 2:])
  m = len(z2)
  if len(z) == 0:
    return z2[0]
  zeta = ef * eps + lf * math.log(4 / delta) / n
  lo, hi = max(math.floor(zeta * m), 1) - 1, math.ceil((1 - zeta) * m) - 1
  if lo > hi or hi < 0:
    lo = hi = (m - 1) // 2
  return float(np.mean(np.clip(z, z2[lo], z2[min(hi, m - 1)])))


def _np_mom(x, block):
  k = len(x) // block
  if k == 0:
    return float(np.mean(x))
  return float(np.median(np.asarray(x[: k * block], np.float64).reshape(k, block).mean(1)))


jit_median = jax.jit(est.history_median)
jit_trimmed = jax.jit(est.trimmed_mean, static_argnums=(3,))
jit_mom = jax.jit(est.median_of_means)


@pytest.mark.parametrize("n", [1, 2, 7, 30, 64])
def test_median_and_mean_match_numpy(n):
  x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
  assert float(jit_median(_pad(x), n)) == pytest.approx(np.median(x), abs=1e-6)
  assert float(est.history_mean(_pad(x), n)) == pytest.approx(np.mean(x), abs=1e-5)


@pytest.mark.parametrize("n,eps,delta", [(1, 0.0, 0.1), (2, 0.1, 0.1), (9, 0.0, 0.5), (40, 0.01, 0.9),
                                         (64, 0.0, 0.99), (64, 0.02, 0.8), (63, 0.2, 0.05)])
def test_trimmed_mean_matches_bruteforce(n, eps, delta):
  x = np.random.default_rng(100 + n).standard_cauchy(n).astype(np.float32)
  got = float(jit_trimmed(_pad(x), n, eps, delta))
  assert got == pytest.approx(_np_trimmed(x, eps, delta), rel=1e-5, abs=1e-5)


def test_trimmed_mean_with_equal_halves_is_scipy_winsorized_mean():
  # With history = (y, y), Z = Z' = y, so the estimator is the winsorised mean of y at the trimming indices.
  y = np.random.default_rng(3).standard_normal(32).astype(np.float32)
  n, m = 64, 32
  lf = 0.5  # zeta = 8 * 0.01 + 0.5 * log(4 / delta) / 64
  zeta = 8 * 0.01 + lf * math.log(4 / 0.5) / n
  lo, hi = max(math.floor(zeta * m), 1) - 1, math.ceil((1 - zeta) * m) - 1
  assert 0 < lo < hi < m - 1
  want = stats.mstats.winsorize(y.astype(np.float64), limits=((lo + 0.5) / m, (m - 1 - hi) / m)).mean()
  got = est.trimmed_mean(_pad(np.concatenate([y, y])), jnp.int32(n), 0.01, 0.5, 8.0, lf)
  assert float(got) == pytest.approx(float(want), abs=1e-5)


@pytest.mark.parametrize("n,block", [(1, 4), (3, 4), (8, 4), (50, 3), (64, 1), (64, 16)])
def test_median_of_means_matches_numpy(n, block):
  x = np.random.default_rng(n * block).exponential(size=n).astype(np.float32)
  assert float(jit_mom(_pad(x), n, jnp.int32(block))) == pytest.approx(_np_mom(x, block), rel=1e-5)


def test_mom_block_size():
  np.testing.assert_array_equal(est.mom_block_size(jnp.array([0.0, 0.01, 0.05, 0.1, 0.2, 0.3]), 16),
                                [16, 16, 5, 2, 1, 1])


def test_sorted_insert_and_remove_with_duplicates():
  row = jnp.array([1.0, 2.0, 2.0, 5.0, jnp.inf, jnp.inf])
  np.testing.assert_array_equal(est.sorted_insert(row, 2.0), [1, 2, 2, 2, 5, np.inf])
  np.testing.assert_array_equal(est.sorted_insert(row, 0.0), [0, 1, 2, 2, 5, np.inf])
  np.testing.assert_array_equal(est.sorted_remove(row, 2.0), [1, 2, 5, np.inf, np.inf, np.inf])
  np.testing.assert_array_equal(est.sorted_insert(row, jnp.inf), row)   # +inf insert / remove are no-ops
  np.testing.assert_array_equal(est.sorted_remove(row, jnp.inf), row)


def test_incremental_history_equals_pure_estimators():
  """Pushes a corrupted stream into 3 pairs (past the capacity) and compares every estimator every step."""
  rng = np.random.default_rng(0)
  cap, pairs, steps = 24, 3, 90
  eps, delta, block = 0.1, 0.3, jnp.int32(2)
  names = est.ESTIMATORS
  xs = rng.normal(size=steps).astype(np.float32)
  xs[rng.random(steps) < 0.15] = 1e4
  ps = rng.integers(0, pairs, steps)

  @jax.jit
  def push_and_estimate(h, p, x):
    h = h.push(p, x, block)
    return h, h.estimates(p, x, names, jnp.float32(eps), block, delta, known_range=(-0.5, 0.5))

  h = est.RewardHistory.create(pairs, cap)
  seen = [[] for _ in range(pairs)]
  for p, x in zip(ps, xs):
    h, got = push_and_estimate(h, jnp.int32(p), jnp.float32(x))
    seen[p].append(float(x))
    kept = np.array(seen[p][:cap], np.float32)
    n = len(kept)
    np.testing.assert_array_equal(np.asarray(h.sorted_all[p])[:n], np.sort(kept))
    np.testing.assert_array_equal(np.asarray(h.sorted_z2[p])[: n - n // 2], np.sort(kept[n // 2:]))
    tm = _np_trimmed(kept, eps, delta)
    want = {"vanilla": x, "mean": np.mean(np.array(seen[p], np.float64)), "median": np.median(kept),
            "mom": _np_mom(kept, 2), "trimmed": tm, "trimmed_known": np.clip(tm, -0.5, 0.5)}
    np.testing.assert_allclose(np.asarray(got), [want[k] for k in names], rtol=2e-5, atol=2e-3)
  assert max(len(s) for s in seen) > cap  # the frozen-history path was exercised
  # A history built for a subset of the estimators keeps only the views those read, with the same estimates.
  sub = ("mean", "median")
  small = est.RewardHistory.create(pairs, cap, sub)
  assert small.sorted_z2.shape == small.blocks.shape == (pairs, 1) and small.capacity == cap
  push = jax.jit(lambda h, p, x: h.push(p, x, block, sub))
  for p, x in zip(ps, xs):
    small = push(small, jnp.int32(p), jnp.float32(x))
  for p in range(pairs):
    np.testing.assert_allclose(small.estimates(p, 0.0, sub, 0.1, block, delta),
                               h.estimates(p, 0.0, sub, 0.1, block, delta), rtol=1e-6)


def test_trimmed_mean_resists_contamination_the_mean_does_not():
  rng = np.random.default_rng(5)
  n, eps = 2000, 0.05
  x = rng.normal(size=n).astype(np.float32)
  bad = np.arange(n) % 20 == 19   # every 20th sample (a front-loaded eps = 0.05 budget) set to 10^6
  x[bad] = 1e6
  h = jnp.asarray(x)
  assert float(est.history_mean(h, n)) > 4e4
  tm = float(est.trimmed_mean(h, jnp.int32(n), eps, 0.01))
  med = float(est.history_median(h, jnp.int32(n)))
  # Bias of order eps * sigma (the median of an eps-contaminated N(0, 1) moves by ~ Phi^-1(1 / (2 (1 - eps)))).
  assert abs(tm) < 0.25 and abs(med) < 0.25
  assert abs(med - stats.norm.ppf(0.5 / (1 - eps))) < 0.1
