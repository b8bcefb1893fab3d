"""Asynchronous Q-learning: a numpy brute-force replay of the update, closed forms, budgets, chunking."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.rl import tabular as tb
from jaxlab.rl.tabular import q_learning

S, A = 3, 2


def _np_trimmed(x, eps, delta):
  n = len(x)
  z, z2 = np.asarray(x[: n // 2], np.float64), np.sort(np.asarray(x[n // 2:], np.float64))
  if len(z) == 0:
    return z2[0]
  m = len(z2)
  zeta = 8 * eps + 24 * math.log(4 / delta) / n
  lo, hi = max(math.floor(zeta * m), 1) - 1, math.ceil((1 - zeta) * m) - 1
  if lo > hi or hi < 0:
    lo = hi = (m - 1) // 2
  return np.mean(np.clip(z, z2[lo], z2[min(hi, m - 1)]))


def _np_mom(x, b):
  k = len(x) // b
  return np.mean(x) if k == 0 else np.median(np.asarray(x[: k * b], np.float64).reshape(k, b).mean(1))


def _reference(spec, mdp, q_star, eps, mag, model, budget, key, steps):
  """Plain-Python async Q-learning with the same per-step uniforms (independent of the jnp update code)."""
  p_sa, r_sa, gamma = np.asarray(mdp.p), np.asarray(mdp.r), float(mdp.gamma)
  u, noise = (np.asarray(v) for v in q_learning.step_randomness(spec, key, jnp.arange(steps)))
  sub = q_star < q_star.max(1, keepdims=True) - 1e-6 * (1 + np.abs(q_star).max())
  e_count = len(spec.estimators)
  q = np.zeros((e_count, S, A))
  hist = {(s, a): [] for s in range(S) for a in range(A)}
  cnt, pair_bad = np.zeros((S, A), int), np.zeros((S, A), int)
  all_bad, s = 0, 0
  block = int(np.clip(math.floor(0.25 / max(eps, 1e-12)), 1, spec.mom_max_block))
  first = max(spec.burn_in, 1)
  for t in range(steps):
    a = min(int(u[t, 0] * A), A - 1)
    if spec.behaviour == "eps_greedy" and u[t, 1] >= spec.behaviour_eps:
      a = int(np.argmax(q[spec.behaviour_from, s]))
    cdf = np.cumsum(p_sa[s, a])
    s2 = min(int(np.sum(cdf < u[t, 2] * cdf[-1])), S - 1)
    r = float(r_sa[s, a]) + float(noise[t])
    cnt[s, a] += 1
    n = cnt[s, a]
    if model == "bernoulli":
      bad = u[t, 3] < eps
    else:
      ok = (pair_bad[s, a] + 1 <= eps * n + 1e-5 * n) if budget == "per_pair" else \
          (all_bad + 1 <= eps * (t + 1) + 1e-5 * (t + 1))
      bad = ok and (model == "big" or sub[s, a])
    bad = bad and eps > 0
    r = mag if bad else r
    pair_bad[s, a] += bad
    all_bad += bad
    hist[s, a].append(r)
    kept = np.array(hist[s, a][: spec.capacity], np.float32)
    tm = _np_trimmed(kept, eps, spec.delta)
    est = {"vanilla": r, "mean": np.mean(hist[s, a]), "median": np.median(kept), "mom": _np_mom(kept, block),
           "trimmed": tm, "trimmed_known": np.clip(tm, *spec.known_range)}
    if n >= first:
      k = n - first
      alpha = {"rescaled_linear": 1 / (1 + (1 - gamma) * k), "linear": 1 / (1 + k),
               "polynomial": (1 + k) ** -spec.step_power, "constant": spec.step_constant}[spec.step_size]
      for e, name in enumerate(spec.estimators):
        q[e, s, a] += alpha * (est[name] + gamma * q[e, s2].max() - q[e, s, a])
    s = s2
  return q, cnt, pair_bad, all_bad


@pytest.fixture(scope="module")
def small_mdp():
  mdp = tb.random_mdp(jax.random.key(11), S, A, 0.8)
  return mdp, np.asarray(tb.value_iteration(mdp), np.float64)


STEPS = 300
SPECS = {  # one compile each; the adversary is data, so each spec replays several adversaries from its cache
    "uniform": dict(step_size="rescaled_linear", behaviour="uniform", burn_in=3),
    "eps_greedy": dict(step_size="polynomial", behaviour="eps_greedy", burn_in=0),
}
CASES = [
    dict(spec="uniform", model="big", budget="per_pair", eps=0.1),
    dict(spec="uniform", model="bernoulli", budget="per_pair", eps=0.1),
    dict(spec="eps_greedy", model="big", budget="global", eps=0.2),
    dict(spec="eps_greedy", model="targeted", budget="per_pair", eps=0.25),
]


def _spec(name):
  return tb.QLearningSpec(estimators=tb.ESTIMATORS, capacity=16, delta=0.2, behaviour_eps=0.3, behaviour_from=4,
                          known_range=(0.0, 1.0), noise_scale=0.3, **SPECS[name])


def _np_eligible(q_star):
  return q_star < q_star.max(1, keepdims=True) - 1e-6 * (1 + np.abs(q_star).max())


def _run1(spec, mdp, q_star, adv, key, state=None, length=STEPS):
  """One trajectory through the jitted batched runner (a batch of 1 built with numpy: no eager jax ops)."""
  one = lambda x: np.asarray(x)[None]  # noqa: E731
  state = tb.init_state(spec, S, A) if state is None else state
  out = tb.run_batch(spec, jax.tree.map(one, state), jax.tree.map(one, mdp), jax.tree.map(one, adv),
                     one(_np_eligible(q_star)), one(jax.random.key_data(key)), length)
  return jax.tree.map(lambda x: np.asarray(x)[0], out)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['spec']}-{c['model']}-{c['budget']}")
def test_scan_matches_numpy_replay(small_mdp, case):
  mdp, q_star = small_mdp
  spec, key = _spec(case["spec"]), jax.random.key(3)
  adv = tb.Adversary.create(case["eps"], 50.0, case["model"], case["budget"])
  state = _run1(spec, mdp, q_star, adv, key)
  q, cnt, pair_bad, all_bad = _reference(spec, mdp, q_star, case["eps"], 50.0, case["model"], case["budget"], key,
                                         STEPS)
  np.testing.assert_array_equal(np.asarray(state.hist.count).reshape(S, A), cnt)
  np.testing.assert_array_equal(np.asarray(state.pair_corrupted).reshape(S, A), pair_bad)
  assert int(state.all_corrupted) == all_bad > 0
  assert cnt.max() > spec.capacity  # frozen histories exercised
  np.testing.assert_allclose(np.asarray(state.q), q, rtol=2e-4, atol=2e-4 * (1 + np.abs(q).max()))


def test_budgets_are_front_loaded_and_targeted_hits_only_suboptimal_pairs(small_mdp):
  mdp, q_star = small_mdp
  spec, key = _spec("uniform"), jax.random.key(0)
  elig = _np_eligible(q_star)
  st = _run1(spec, mdp, q_star, tb.Adversary.create(0.1, 5.0, "big", "per_pair"), key)
  np.testing.assert_array_equal(st.pair_corrupted, np.floor(0.1 * np.asarray(st.hist.count) + 1e-9))
  st = _run1(spec, mdp, q_star, tb.Adversary.create(0.1, 5.0, "big", "global"), key)
  assert int(st.all_corrupted) == STEPS // 10
  st = _run1(spec, mdp, q_star, tb.Adversary.create(0.1, 5.0, "targeted", "per_pair"), key)
  bad = np.asarray(st.pair_corrupted).reshape(S, A)
  assert np.all(bad[~elig] == 0) and np.all(bad[elig] > 0)


def test_bernoulli_corruption_closed_form(small_mdp):
  """With i.i.d. corruption the observed reward has mean (1 - eps) r + eps M: non-robust Q -> Q* of that MDP."""
  mdp, q_star = small_mdp
  spec = _spec("uniform")
  eps, mag = 0.2, 5.0
  adv = tb.Adversary.create(eps, mag, "bernoulli")
  st = None
  for i in range(100):  # 30000 steps in cached 300-step chunks
    st = _run1(spec, mdp, q_star, adv, jax.random.key(1), st)
  shifted = tb.MDP(mdp.p, (1 - eps) * mdp.r + eps * mag, mdp.gamma)
  q_shift = np.asarray(tb.value_iteration(shifted))
  q_mean = np.asarray(st.q[tb.ESTIMATORS.index("mean")])
  # The history mean is unbiased for (1 - eps) r + eps M; its noise (std ~1.8 per sample, ~5000 samples per pair,
  # times 1 / (1 - gamma) = 5) leaves ~0.1 of error, far below the 4.5 shift.
  assert np.abs(q_shift - q_star).max() > 3.0
  assert np.abs(q_mean - q_shift).max() < 0.3
  q_vanilla = np.asarray(st.q[tb.ESTIMATORS.index("vanilla")])   # raw-reward Q-learning: same fixed point
  assert np.abs(q_vanilla - q_shift).max() < 0.3


def test_step_sizes():
  k = jnp.arange(4)
  g = jnp.float32(0.9)
  def alpha(**kw):
    return np.asarray(tb.step_size(tb.QLearningSpec(**kw), k, g))
  np.testing.assert_allclose(alpha(step_size="rescaled_linear"), 1 / (1 + 0.1 * np.arange(4)), rtol=1e-6)
  np.testing.assert_allclose(alpha(step_size="linear"), 1 / (1 + np.arange(4)), rtol=1e-6)
  np.testing.assert_allclose(alpha(step_size="polynomial", step_power=0.7), (1 + np.arange(4.0)) ** -0.7, rtol=1e-6)
  np.testing.assert_allclose(alpha(step_size="constant", step_constant=0.3), 0.3, rtol=1e-6)


def test_bad_specs_raise():
  with pytest.raises(ValueError, match="estimators"):
    tb.QLearningSpec(estimators=("median", "huber"))
  with pytest.raises(ValueError, match="step_size"):
    tb.QLearningSpec(step_size="cosine")
  with pytest.raises(ValueError, match="corruption model"):
    tb.Adversary.create(0.1, 1.0, "random")


def test_chunked_runs_are_bit_identical(small_mdp):
  # (Sharded == single device over the batch axis: tests/experiments/test_robust_q.py.)
  mdp, q_star = small_mdp
  spec = _spec("uniform")
  key = jax.random.key(2)
  adv = tb.Adversary.create(0.1, 20.0, "big", "per_pair")
  whole = _run1(spec, mdp, q_star, adv, key)
  half = _run1(spec, mdp, q_star, adv, key, length=STEPS // 2)
  np.testing.assert_array_equal(whole.q, _run1(spec, mdp, q_star, adv, key, half, length=STEPS // 2).q)
