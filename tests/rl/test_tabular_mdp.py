"""Random MDPs, value iteration and policy evaluation against brute-force numpy references."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxlab.rl import tabular as tb
from jaxlab.rl.tabular import mdp as mdp_lib


def _np_mdp(mdp):
  return np.asarray(mdp.p, np.float64), np.asarray(mdp.r, np.float64), float(mdp.gamma)


def _np_value_iteration(p, r, gamma, iters=5000):
  q = np.zeros_like(r)
  for _ in range(iters):
    q = r + gamma * p @ q.max(1)
  return q


def _np_policy_q(p, r, gamma, pol):
  s = np.arange(len(pol))
  v = np.linalg.solve(np.eye(len(pol)) - gamma * p[s, pol], r[s, pol])
  return r + gamma * p @ v


@pytest.mark.parametrize("a", [0.5, 2.0])
def test_gamma_sampler_matches_scipy(a):
  u = jax.random.uniform(jax.random.key(7), (2 * mdp_lib.GAMMA_ROUNDS + 1, 20000))
  g = np.asarray(mdp_lib.gamma_from_uniforms(u, a), np.float64)
  assert stats.kstest(g, stats.gamma(a).cdf).pvalue > 1e-3
  assert abs(g.mean() - a) < 4 * np.sqrt(a / len(g))


def test_random_mdp_is_a_valid_mdp():
  mdp = tb.random_mdp(jax.random.key(0), 7, 3, 0.9, concentration=0.5, reward_low=-1.0, reward_high=2.0)
  p, r, gamma = _np_mdp(mdp)
  assert p.shape == (7, 3, 7) and r.shape == (7, 3) and gamma == pytest.approx(0.9)
  assert np.all(p >= 0)
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
  assert r.min() >= -1.0 and r.max() <= 2.0
  # Dirichlet(0.5 * 1_S) rows: each entry is Beta(0.5, 0.5 (S - 1)) (KS test against scipy over many MDPs).
  ps = jax.vmap(lambda k: tb.random_mdp(k, 4, 2, 0.9).p)(jax.random.split(jax.random.key(1), 1000))
  entries = np.asarray(ps, np.float64)[:, :, :, 0].ravel()
  assert stats.kstest(entries, stats.beta(0.5, 1.5).cdf).pvalue > 1e-3


@pytest.mark.parametrize("gamma", [0.5, 0.9, 0.99])
def test_value_iteration_matches_numpy_loop_and_policy_enumeration(gamma):
  mdp = tb.random_mdp(jax.random.key(2), 4, 3, gamma)
  p, r, g = _np_mdp(mdp)
  q_star = np.asarray(tb.value_iteration(mdp), np.float64)
  np.testing.assert_allclose(q_star, _np_value_iteration(p, r, g, iters=20000 if gamma > 0.95 else 3000),
                             rtol=2e-4, atol=2e-4 / (1 - gamma))
  # Brute force over all A^S deterministic policies: V* is their pointwise maximum.
  values = np.array([_np_policy_q(p, r, g, np.array(pol)).max(1) * 0 + _np_policy_q(p, r, g, np.array(pol))[
      np.arange(4), np.array(pol)] for pol in itertools.product(range(3), repeat=4)])
  np.testing.assert_allclose(q_star.max(1), values.max(0), rtol=2e-4, atol=1e-4 / (1 - gamma))


def test_policy_evaluation_matches_linear_solve_and_bellman_iteration():
  mdp = tb.random_mdp(jax.random.key(3), 6, 2, 0.8)
  p, r, g = _np_mdp(mdp)
  pol = np.array([0, 1, 1, 0, 1, 0])
  q = np.asarray(tb.policy_evaluation(mdp, jnp.asarray(pol)), np.float64)
  np.testing.assert_allclose(q, _np_policy_q(p, r, g, pol), rtol=1e-5, atol=1e-5)
  qi = np.zeros_like(r)  # iterate the Bellman expectation operator of pol
  for _ in range(500):
    qi = r + g * p @ qi[np.arange(6), pol]
  np.testing.assert_allclose(q, qi, rtol=1e-5, atol=1e-5)


def test_errors_suboptimality_and_suboptimal_pairs():
  mdp = tb.random_mdp(jax.random.key(4), 5, 3, 0.9)
  p, r, g = _np_mdp(mdp)
  q_star = tb.value_iteration(mdp)
  assert float(tb.suboptimality(mdp, q_star, q_star)) == pytest.approx(0.0, abs=1e-5)
  assert float(tb.q_error(q_star + 0.25, q_star)) == pytest.approx(0.25, abs=1e-6)
  worst = jnp.argmin(q_star, -1)
  q_bad = jax.nn.one_hot(worst, 3)  # greedy = the worst action everywhere
  pol = np.asarray(worst)
  want = (np.asarray(q_star, np.float64).max(1) - _np_policy_q(p, r, g, pol)[np.arange(5), pol]).max()
  assert float(tb.suboptimality(mdp, q_bad, q_star)) == pytest.approx(want, rel=1e-4)
  assert want > 0
  sub = np.asarray(tb.suboptimal_pairs(q_star))
  np.testing.assert_array_equal(sub, np.asarray(q_star) < np.asarray(q_star).max(1, keepdims=True) - 1e-5)
  assert np.all(sub.sum(1) == 2)  # exactly one optimal action per state (no ties in a random MDP)


def test_vmapped_over_mdps_equals_one_by_one():
  keys = jax.random.split(jax.random.key(5), 2)
  mdps = jax.vmap(lambda k: tb.random_mdp(k, 4, 3, 0.9))(keys)
  batched = jax.vmap(tb.value_iteration)(mdps)
  for i, k in enumerate(keys):
    np.testing.assert_allclose(batched[i], tb.value_iteration(tb.random_mdp(k, 4, 3, 0.9)), rtol=1e-5, atol=1e-5)
