"""Gaussian KL against Monte Carlo and scipy, the McAllester / Catoni bounds by hand, the Gibbs loss by sampling,
and the gap decomposition."""

import math

import numpy as np
import pytest
from scipy import stats

from jaxlab.selection import gaps, pac_bayes


def _spd(rng, k, floor):
  a = rng.normal(size=(k, k))
  return a @ a.T + floor * np.eye(k)


def test_gaussian_kl_matches_monte_carlo():
  rng = np.random.default_rng(0)
  k = 4
  cq, cp = _spd(rng, k, 0.5), _spd(rng, k, 1.0)
  mq, mp = rng.normal(size=k), rng.normal(size=k)
  x = rng.multivariate_normal(mq, cq, size=200_000)
  log_ratio = stats.multivariate_normal(mq, cq).logpdf(x) - stats.multivariate_normal(mp, cp).logpdf(x)
  mc, se = log_ratio.mean(), log_ratio.std() / math.sqrt(len(x))
  kl = float(pac_bayes.gaussian_kl(mq, cq, mp, cp))
  assert abs(kl - mc) < 4 * se + 1e-3


def test_gaussian_kl_closed_form_cases_and_batching():
  rng = np.random.default_rng(1)
  k = 3
  cq, cp = _spd(rng, k, 0.5), _spd(rng, k, 1.0)
  mq, mp = rng.normal(size=k), rng.normal(size=k)
  # the textbook formula with explicit inverses and determinants (float64 numpy)
  inv = np.linalg.inv(cp)
  ref = 0.5 * (np.trace(inv @ cq) + (mp - mq) @ inv @ (mp - mq) - k + np.log(np.linalg.det(cp) / np.linalg.det(cq)))
  assert float(pac_bayes.gaussian_kl(mq, cq, mp, cp)) == pytest.approx(ref, rel=1e-4)
  assert float(pac_bayes.gaussian_kl(mp, cp, mp, cp)) == pytest.approx(0.0, abs=1e-5)
  batch = pac_bayes.gaussian_kl(np.stack([mq, mp]), np.stack([cq, cp]), mp, cp)   # batched Q, shared P
  np.testing.assert_allclose(np.asarray(batch), [ref, 0.0], rtol=1e-4, atol=1e-5)
  var_q, var_p = rng.uniform(0.2, 2, size=k), rng.uniform(0.2, 2, size=k)
  np.testing.assert_allclose(float(pac_bayes.diag_gaussian_kl(mq, var_q, mp, var_p)),
                             float(pac_bayes.gaussian_kl(mq, np.diag(var_q), mp, np.diag(var_p))), rtol=1e-5)


def test_bounds_by_hand():
  emp, kl, n, delta = 0.2, 5.0, 100, 0.05
  mca = emp + math.sqrt((kl + math.log(2 * math.sqrt(n) / delta)) / (2 * n))
  assert float(pac_bayes.mcallester_bound(emp, kl, n, delta)) == pytest.approx(mca, rel=1e-6)
  c = 1.5
  cat = (1 - math.exp(-c * emp - (kl + math.log(1 / delta)) / n)) / (1 - math.exp(-c))
  assert float(pac_bayes.catoni_bound(emp, kl, n, delta, c)) == pytest.approx(cat, rel=1e-6)
  # both shrink toward the empirical risk as n grows with KL fixed, and grow with KL
  big = [float(pac_bayes.catoni_bound(emp, kl, m, delta, c)) for m in (10, 100, 10_000)]
  assert big[0] > big[1] > big[2]
  assert float(pac_bayes.mcallester_bound(emp, 2 * kl, n)) > float(pac_bayes.mcallester_bound(emp, kl, n))
  with pytest.raises(ValueError, match="delta"):
    pac_bayes.catoni_bound(emp, kl, n, 1.5)
  with pytest.raises(ValueError, match="n=0"):
    pac_bayes.mcallester_bound(emp, kl, 0)


def test_gaussian_residual_loss_matches_sampling():
  rng = np.random.default_rng(2)
  for mean, var, tau in ((0.0, 1.0, 1.0), (1.3, 0.4, 0.7), (-2.0, 3.0, 2.0)):
    r = rng.normal(mean, math.sqrt(var), size=400_000)
    mc = np.mean(1 - np.exp(-r ** 2 / (2 * tau ** 2)))
    assert float(pac_bayes.gaussian_residual_loss(mean, var, tau)) == pytest.approx(mc, abs=3e-3)


def test_gap_decomposition_and_trends():
  train = np.array([[0.1, 0.0], [0.2, 0.1]])
  in_dist = np.array([[0.3, 0.5], [0.25, 0.2]])
  target = np.array([[0.9, 0.6], [0.8, 0.3]])
  g = gaps.decompose(train, in_dist, target)
  np.testing.assert_allclose(g["train"] + g["gen_gap"] + g["extrap_gap"], target)
  np.testing.assert_allclose(gaps.optimal_difficulty(target, [2, 5]), [5, 5])
  assert gaps.spearman([1, 2, 3, 4], [0.1, 0.3, 0.2, 0.9]) == pytest.approx(0.8)
  assert math.isnan(gaps.spearman([1, 2, 3], [1, 1, 1]))
  np.testing.assert_allclose(gaps.trend_over_difficulty([[1, 2, 3], [3, 2, 1]], [1, 2, 3]), [1.0, -1.0])
  assert gaps.is_nondecreasing([1, 1, 2]) and not gaps.is_nondecreasing([2, 1])
