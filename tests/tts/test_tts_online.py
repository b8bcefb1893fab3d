"""Online PETS policy: count-pattern buckets, pi_q(t), greedy plan vs brute force, the budget ledger."""

import collections
import itertools
import math

import numpy as np
import pytest

from jaxlab.tts import online, self_consistency as sc


def test_count_patterns():
  assert online.count_patterns(4, 4) == [(4,), (3, 1), (2, 2), (2, 1, 1), (1, 1, 1, 1)]
  assert online.count_patterns(4, 2) == [(4,), (3, 1), (2, 2)]
  assert len(online.count_patterns(6, 6)) == 11                               # partition number p(6)


def test_bucket_of_matches_counter():
  rng = np.random.default_rng(0)
  rows = rng.integers(0, 4, (500, 4))
  pats = online.count_patterns(4, 4)
  want = [pats.index(tuple(sorted(collections.Counter(r.tolist()).values(), reverse=True))) for r in rows]
  np.testing.assert_array_equal(online.bucket_of(rows, 4), want)


def test_bucket_probs_match_hypergeometric_enumeration():
  pool = np.array([[0] * 5 + [1] * 3 + [2] * 2])                             # 10 answers
  exact = np.zeros(5)
  pats = online.count_patterns(4, 3)
  subsets = list(itertools.combinations(range(10), 4))
  for s in subsets:
    exact[pats.index(tuple(sorted(collections.Counter(pool[0, list(s)].tolist()).values(), reverse=True)))] += 1
  exact /= len(subsets)
  est = online.bucket_probs(pool, np.array([10]), 3, k0=4, draws=20_000, seed=1)[0]
  np.testing.assert_allclose(est, exact[:len(est)], atol=0.012)


def _model(pi, ab):
  ab = np.asarray(ab, float)
  return online.BucketModel(online.count_patterns(4, 4)[:len(pi)], np.asarray(pi, float), ab[:, 0], ab[:, 1])


def test_greedy_plan_is_optimal_for_equal_bucket_probabilities():
  # With equal pi_t every answer costs the same, so greedy on concave gains is optimal: compare with
  # exhaustive search over all plans within the budget.
  ab = [(0.8, 0.5), (0.3, -0.2), (0.15, -0.1)]
  model = _model([1 / 3] * 3, ab)
  b_max, bbar = 14, 9
  plan = online.greedy_bucket_plan(model, bbar, b_max=b_max, k0=4)
  value = lambda p: sum(sc.probit_curve(p[t], *ab[t]) for t in range(3))  # noqa: E731
  best = max(value(p) for p in itertools.product(range(4, b_max + 1), repeat=3) if sum(p) <= 3 * bbar)
  assert value(plan) == pytest.approx(best, abs=1e-12)
  assert plan.sum() <= 3 * bbar


def test_greedy_plan_respects_the_budget_and_is_maximal():
  rng = np.random.default_rng(0)
  for trial in range(20):
    pi = rng.dirichlet(np.ones(5))
    model = _model(pi, np.c_[rng.uniform(0.05, 1.0, 5), rng.uniform(-1.0, 1.0, 5)])
    bbar = float(rng.uniform(4, 30))
    plan = online.greedy_bucket_plan(model, bbar, b_max=64, k0=4)
    spent = math.fsum(pi * plan)
    assert spent <= bbar + 1e-12 and plan.min() >= 4 and plan.max() <= 64
    # No bucket below the cap can take one more answer within the budget.
    assert all(plan[t] == 64 or spent + pi[t] > bbar + 1e-12 for t in range(5)), trial


def test_greedy_plan_fills_every_bucket_at_the_cap():
  # pi_t summing to 1 only up to rounding must not leave a bucket one answer short at avg_budget = b_max
  # (with a tied pool that answer decides whether the vote can reach the label).
  pi = np.array([0.1, 0.2, 0.3, 0.15, 0.25]) * (1 + 2e-16)
  assert math.fsum(pi * 64) > 64
  model = _model(pi, [(0.8, 0.5), (0.5, 0.2), (0.3, 0.0), (0.2, -0.2), (0.1, -0.3)])
  np.testing.assert_array_equal(online.greedy_bucket_plan(model, 64, b_max=64, k0=4), [64] * 5)


def test_greedy_plan_unseen_buckets_and_errors():
  model = _model([0.5, 0.5, 0.0], [(0.5, 0.0), (0.2, 0.0), (np.nan, np.nan)])
  plan = online.greedy_bucket_plan(model, 10.7, b_max=64, k0=4)
  assert plan[2] == 4                         # official rule: an unseen bucket keeps the warm-up only
  with pytest.raises(ValueError, match="avg_budget"):
    online.greedy_bucket_plan(model, 3.0)
  with pytest.raises(ValueError, match="kind"):
    online.greedy_bucket_plan(model, 8.0, kind="spline")


def test_streaming_policy_ledger_caps_the_realised_spend():
  rng = np.random.default_rng(0)
  answers = rng.integers(0, 4, (200, 64))
  answers[:50, :4] = [0, 1, 2, 3]                                            # an adversarial start: hard buckets
  lengths = np.full(200, 64)
  plan = np.array([4, 10, 20, 30, 64])
  free, buckets = online.streaming_policy(answers, lengths, plan, 4)
  np.testing.assert_array_equal(free, plan[buckets])
  for bbar in (4, 8, 12.5, 16):
    capped, _ = online.streaming_policy(answers, lengths, plan, 4, avg_budget=bbar)
    assert capped.min() >= 4 and np.all(capped <= free)
    prefix_means = np.cumsum(capped) / np.arange(1, 201)
    assert np.all(prefix_means <= bbar), bbar                                 # at every point of the stream


def test_calibrate_recovers_probit_parameters_of_identical_questions():
  theta = np.array([0.55, 0.25, 0.15, 0.05])
  pool = np.repeat(np.array([0] * 55 + [1] * 25 + [2] * 15 + [3] * 5)[None], 6, 0)
  model = online.calibrate(pool, np.full(6, 100), np.zeros(6, int), 4, draws=500, seed=0, curve_k_max=64)
  a, b = sc.probit_fit(np.arange(3, 41), sc.mv_accuracy_curve(theta, 40)[2:])
  seen = model.pi_t > 0
  np.testing.assert_allclose(model.a_t[seen], a, rtol=1e-9)
  np.testing.assert_allclose(model.b_t[seen], b, rtol=1e-9)
  np.testing.assert_allclose(model.curves_tk[seen], np.broadcast_to(sc.mv_accuracy_curve(theta, 64), (seen.sum(), 64)))
  assert model.pi_t.sum() == pytest.approx(1.0)
