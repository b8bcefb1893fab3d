"""Votes, self-consistency rate, exact MV accuracy curves and probit fits against brute-force references."""

import collections
import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxlab.tts import self_consistency as sc


def _ref_vote(row, m, weights=None, tie="first"):
  """Plain-Python majority vote: ties to the earliest answer ("first") or the smallest option ("min")."""
  tot = collections.defaultdict(float)
  for i, a in enumerate(row):
    if a >= 0:
      tot[a] += 1.0 if weights is None else weights[i]
  if not tot:
    return -1
  best = max(tot.values())
  tied = [a for a in tot if tot[a] == best]
  if tie == "min":
    return min(tied)
  return next(a for a in row if a in tied)


@pytest.mark.parametrize("tie", ["first", "min"])
def test_vote_matches_python_reference(tie):
  rng = np.random.default_rng(0)
  answers = rng.integers(-1, 4, size=(300, 9)).astype(np.int32)
  budgets = rng.integers(0, 10, size=300)
  weights = rng.integers(1, 4, size=(300, 9)).astype(np.float32)   # small integers: exact float ties
  got = np.asarray(sc.vote(answers, 4, budget_k=budgets, tie_break=tie))
  want = [_ref_vote(r[:b], 4, tie=tie) for r, b in zip(answers, budgets)]
  np.testing.assert_array_equal(got, want)
  got_w = np.asarray(sc.weighted_vote(answers, weights, 4, tie_break=tie))
  want_w = [_ref_vote(r, 4, w, tie) for r, w in zip(answers, weights)]
  np.testing.assert_array_equal(got_w, want_w)


def test_vote_rejects_unknown_tie_break():
  with pytest.raises(ValueError, match="tie_break"):
    sc.vote(np.zeros((1, 2), np.int32), 2, tie_break="random")


def test_sc_rate_masks_and_unknown_labels():
  pred = jnp.array([0, 1, 2, -1, 3])
  labels = jnp.array([0, 2, 2, -1, -2])            # -1 unknown (skipped), -2 unmatched (counts, never right)
  assert float(sc.sc_rate(pred, labels)) == pytest.approx(2 / 4)
  assert float(sc.sc_rate(pred, labels, jnp.array([1, 1, 0, 1, 0], bool))) == pytest.approx(1 / 2)


def _brute_curve(theta, k, label):
  total = 0.0
  for seq in itertools.product(range(len(theta)), repeat=k):
    c = np.bincount(seq, minlength=len(theta))
    if c[label] == c.max():
      total += np.prod([theta[s] for s in seq]) / np.sum(c == c.max())
  return total


@pytest.mark.parametrize("m", [2, 3, 4])
def test_mv_curve_equals_enumeration(m):
  rng = np.random.default_rng(m)
  theta = rng.dirichlet(np.ones(m))
  for label in range(m):
    got = sc.mv_accuracy_curve(theta, 6, label)
    want = [_brute_curve(theta, k, label) for k in range(1, 7)]
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_mv_curve_two_options_closed_form():
  p, k = 0.62, np.arange(1, 81)
  want = stats.binom.sf(k / 2, k, p) + 0.5 * stats.binom.pmf(k / 2, k, p)   # pmf is 0 at non-integers
  np.testing.assert_allclose(sc.mv_accuracy_curve([p, 1 - p], 80), want, rtol=1e-10, atol=1e-14)


def test_mv_curve_many_options_monte_carlo():
  rng = np.random.default_rng(1)
  theta = rng.dirichlet(np.ones(10) * 0.7)
  k, draws = 15, 100_000
  samples = rng.choice(10, size=(draws, k), p=theta)
  counts = np.stack([(samples == j).sum(1) for j in range(10)], 1)
  top = counts.max(1, keepdims=True)
  label = int(np.argmax(theta))
  mc = np.mean((counts[:, label] == top[:, 0]) / (counts == top).sum(1))
  assert sc.mv_accuracy_curve(theta, k, label)[-1] == pytest.approx(mc, abs=0.006)


def test_mv_curve_bad_input():
  with pytest.raises(ValueError, match="theta"):
    sc.mv_accuracy_curve([-0.1, 1.1], 3)
  with pytest.raises(ValueError, match="k_max"):
    sc.mv_accuracy_curve([0.5, 0.5], 0)


def test_probit_fit_recovers_parameters_and_matches_linregress():
  k = np.arange(3, 41)
  a, b = sc.probit_fit(k, stats.norm.cdf(0.35 * np.sqrt(k) - 0.2))
  assert (a, b) == pytest.approx((0.35, -0.2), abs=1e-9)
  rng = np.random.default_rng(0)
  acc = np.clip(stats.norm.cdf(0.2 * np.sqrt(k) + 0.1) + rng.normal(0, 0.01, k.shape), 0.01, 0.99)
  ref = stats.linregress(np.sqrt(k), stats.norm.ppf(acc))
  assert sc.probit_fit(k, acc) == pytest.approx((ref.slope, ref.intercept), rel=1e-9)


def test_probit_gain_is_stable_when_saturated():
  k = np.arange(1, 30)
  direct = sc.probit_curve(k + 1, 0.3, 0.1) - sc.probit_curve(k, 0.3, 0.1)
  np.testing.assert_allclose(sc.probit_gain(k, 0.3, 0.1), direct, rtol=1e-9, atol=1e-15)
  g = sc.probit_gain(np.array([100.0, 101.0]), 3.0, 5.0)      # Phi(35) == 1.0 in float64
  assert np.all(g > 0) and np.all(np.isfinite(g)) and g[0] > g[1]
  assert sc.probit_gain(4.0, -0.5, 0.0) < 0


def test_vote_default_is_the_smallest_option():
  tied = np.array([[2, 1, 1, 2], [3, 3, 0, 0]], np.int32)
  np.testing.assert_array_equal(sc.vote(tied, 4), [1, 0])
  np.testing.assert_array_equal(sc.vote(tied, 4, tie_break="first"), [2, 3])


def test_budget_saving_first_budgets_and_spend():
  base = {4: 0.9, 8: 1.0, 12: 0.99, 16: 1.0}          # not monotone: the FIRST budget at the level counts
  meth = {4: 0.95, 8: 0.99, 12: 1.0, 16: 1.0}
  got = sc.budget_saving({4: 1.0, 8: 1.0}, {4: 3.5, 8: 7.0}, base)
  assert got == {"base_budget": 8, "method_budget": 4, "method_spend": 3.5, "saving": 1 - 3.5 / 8,
                 "nominal_saving": 0.5}
  got = sc.budget_saving(meth, {b: b - 0.5 for b in meth}, base)
  assert got["method_budget"] == 12 and got["saving"] == pytest.approx(1 - 11.5 / 8)   # negative: the method is worse
  got = sc.budget_saving(meth, {b: float(b) for b in meth}, base, level=0.95)
  assert (got["base_budget"], got["method_budget"], got["saving"]) == (8, 4, 0.5)
  never = sc.budget_saving({4: 0.5}, {4: 4.0}, base)
  assert never["method_budget"] is None and never["saving"] is None and never["base_budget"] == 8
  assert sc.first_budget_reaching({}, 1.0) is None
