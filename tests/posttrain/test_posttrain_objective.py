"""GRPO objective pieces against independent references: advantages (the Tunix formulas as plain loops),
loss aggregation (loops), the one-step-bandit policy gradient (closed form), clipping, KL estimators (exact
categorical KL), masks (exactly zero gradient), rewards and the arithmetic task (brute force)."""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.posttrain import arith, rewards
from jaxlab.posttrain.advantages import group_advantages, multi_reward_advantages
from jaxlab.posttrain.grpo import GRPOConfig, aggregate, grpo_loss, kl_estimate


def _loop_advantages(r, g, kind):
  out = []
  for s in range(0, len(r), g):
    grp = [float(x) for x in r[s:s + g]]
    m = sum(grp) / g
    for i, x in enumerate(grp):
      if kind == "grpo":
        out.append((x - m) / (statistics.stdev(grp) + 1e-6))
      elif kind == "rloo":
        out.append(x - (sum(grp) - x) / (g - 1))
      else:
        out.append(x - m)
  return np.asarray(out)


@pytest.mark.parametrize("kind", ["grpo", "rloo", "drgrpo"])
def test_advantages_match_tunix_formulas(kind):
  r = np.random.default_rng(0).normal(size=24)
  np.testing.assert_allclose(group_advantages(r, 4, kind), _loop_advantages(r, 4, kind), rtol=1e-5, atol=1e-6)


def test_zero_variance_group_gets_zero_advantage():
  r = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
  for kind in ("grpo", "rloo", "drgrpo"):
    adv = group_advantages(r, 3, kind)
    assert np.all(adv[:3] == 0.0) and np.any(adv[3:] != 0.0)


def test_per_reward_normalize_is_the_weighted_sum_of_component_advantages():
  rng = np.random.default_rng(1)
  comps = np.stack([rng.integers(0, 2, 16), rng.normal(size=16) * 0.01], axis=1)
  w = (1.0, 0.5)
  want = w[0] * _loop_advantages(comps[:, 0], 4, "grpo") + w[1] * _loop_advantages(comps[:, 1], 4, "grpo")
  np.testing.assert_allclose(multi_reward_advantages(comps, w, 4, per_reward_normalize=True), want, rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_allclose(multi_reward_advantages(comps, w, 4), _loop_advantages(comps @ np.array(w), 4, "grpo"),
                             rtol=1e-4, atol=1e-5)


def test_advantage_errors():
  with pytest.raises(ValueError, match="groups"):
    group_advantages(np.zeros(5), 2)
  with pytest.raises(ValueError, match="num_generations"):
    group_advantages(np.zeros(4), 1)
  with pytest.raises(ValueError, match="NaN"):
    group_advantages(np.array([0.0, np.nan]), 2)
  with pytest.raises(ValueError, match="estimator"):
    group_advantages(np.zeros(4), 2, "ppo")


def _loop_aggregate(x, m, mode):
  rows = [(x[b][m[b] > 0]) for b in range(x.shape[0])]
  nonempty = [r for r in rows if r.size]
  if mode == "token-mean":
    return sum(r.sum() for r in rows) / max(sum(r.size for r in rows), 1)
  if mode == "sequence-mean-token-mean":
    return sum(r.mean() for r in nonempty) / len(nonempty)
  if mode == "sequence-mean-token-scale":
    return sum(r.sum() / x.shape[1] for r in nonempty) / len(nonempty)
  return sum(r.sum() for r in nonempty) / len(nonempty)


@pytest.mark.parametrize("mode", ["token-mean", "sequence-mean-token-mean", "sequence-mean-token-scale",
                                  "seq-mean-token-sum", "sequence-mean-token-sum-norm", "dr_grpo", "bnpo"])
def test_aggregation_modes_match_loops(mode):
  rng = np.random.default_rng(2)
  x = rng.normal(size=(5, 7)).astype(np.float32)
  m = (rng.random((5, 7)) < 0.6).astype(np.float32)
  m[3] = 0.0                                           # an empty row does not count
  canon = {"dr_grpo": "sequence-mean-token-scale", "bnpo": "token-mean"}.get(mode, mode)
  np.testing.assert_allclose(float(aggregate(jnp.asarray(x), jnp.asarray(m), mode)), _loop_aggregate(x, m, canon),
                             rtol=1e-5)


def test_bandit_policy_gradient_closed_form():
  # One-token prompts and completions, softmax policy pi = softmax(theta) over V tokens, ratio 1, beta 0:
  # grad L = -(1/N) sum_i A_i grad log pi(a_i) = -(1/N) sum_i A_i (e_{a_i} - pi).
  v, n = 6, 12
  rng = np.random.default_rng(3)
  theta = jnp.asarray(rng.normal(size=v), jnp.float32)
  actions = rng.integers(0, v, n)
  adv = jnp.asarray(rng.normal(size=n), jnp.float32)
  cfg = GRPOConfig(num_generations=4, beta=0.0)

  def loss(th):
    lp = jax.nn.log_softmax(th)[actions]
    return grpo_loss(lp[:, None], None, None, adv, jnp.ones((n, 1)), cfg)[0]

  pi = np.asarray(jax.nn.softmax(theta), np.float64)
  want = -np.mean([float(adv[i]) * (np.eye(v)[actions[i]] - pi) for i in range(n)], axis=0)
  np.testing.assert_allclose(np.asarray(jax.grad(loss)(theta)), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("adv,log_ratio,clipped", [(1.0, 0.5, True), (1.0, 0.1, False), (1.0, -0.5, False),
                                                   (-1.0, -0.5, True), (-1.0, -0.1, False), (-1.0, 0.5, False)])
def test_clip_zeroes_the_gradient_outside_the_trust_region(adv, log_ratio, clipped):
  # ratio = exp(log_ratio): 1.65 > 1 + eps_high (A > 0: clipped), 0.61 < 1 - eps (A < 0: clipped); moving
  # the other way (A > 0 with ratio < 1 - eps, A < 0 with ratio > 1 + eps) keeps the unclipped gradient.
  cfg = GRPOConfig(num_generations=2, beta=0.0, epsilon=0.2, epsilon_high=0.28)
  lp = jnp.asarray([[-1.0]])
  old = lp - log_ratio
  g = jax.grad(lambda x: grpo_loss(x, old, None, jnp.asarray([adv]), jnp.ones((1, 1)), cfg)[0])(lp)
  assert (float(g[0, 0]) == 0.0) == clipped
  if not clipped:
    assert float(g[0, 0]) == pytest.approx(-adv * np.exp(log_ratio), rel=1e-5)


def test_dual_clip_bounds_negative_advantage_loss():
  cfg = GRPOConfig(num_generations=2, beta=0.0, epsilon_c=3.0)
  lp, old = jnp.asarray([[0.0]]), jnp.asarray([[-3.0]])          # ratio e^3 ~ 20 with A < 0
  loss, _ = grpo_loss(lp, old, None, jnp.asarray([-1.0]), jnp.ones((1, 1)), cfg)
  assert float(loss) == pytest.approx(3.0)
  assert float(jax.grad(lambda x: grpo_loss(x, old, None, jnp.asarray([-1.0]), jnp.ones((1, 1)), cfg)[0])(lp)[0, 0]) \
      == 0.0


def test_kl_estimators_against_exact_categorical_kl():
  rng = np.random.default_rng(4)
  p = rng.dirichlet(np.ones(5))
  q = rng.dirichlet(np.ones(5))
  exact = float(np.sum(p * np.log(p / q)))
  samples = rng.choice(5, size=20000, p=p)
  lp, lq = jnp.log(jnp.asarray(p[samples])), jnp.log(jnp.asarray(q[samples]))
  for mode in ("kl", "low_var_kl", "k3"):
    est = np.asarray(kl_estimate(lp, lq, mode), np.float64)
    se = est.std() / np.sqrt(est.size)
    assert abs(est.mean() - exact) <= 3 * se + 1e-6, (mode, est.mean(), exact, se)
  assert np.all(np.asarray(kl_estimate(lp, lq, "low_var_kl")) >= 0)
  np.testing.assert_allclose(kl_estimate(lp, lq, "mse_kl"), 0.5 * (lp - lq) ** 2, rtol=1e-6)


def test_masked_positions_get_exactly_zero_gradient():
  rng = np.random.default_rng(5)
  lp = jnp.asarray(-rng.random((4, 9)) * 3, jnp.float32)
  ref = jnp.asarray(-rng.random((4, 9)) * 3, jnp.float32)
  mask = jnp.asarray(rng.random((4, 9)) < 0.5, jnp.float32)
  adv = jnp.asarray(rng.normal(size=4), jnp.float32)
  for mode in ("token-mean", "sequence-mean-token-mean", "seq-mean-token-sum"):
    cfg = GRPOConfig(num_generations=2, beta=0.1, kl_loss_mode="low_var_kl", loss_agg_mode=mode)
    g = jax.grad(lambda x: grpo_loss(x, None, ref, adv, mask, cfg)[0])(lp - 50.0 * (1 - mask))  # extreme values
    assert np.all(np.asarray(g)[np.asarray(mask) == 0] == 0.0)
    assert np.any(np.asarray(g)[np.asarray(mask) > 0] != 0.0)


def test_grpo_config_errors():
  for kw, msg in (({"num_generations": 1}, "num_generations"), ({"loss_agg_mode": "mean"}, "loss_agg_mode"),
                  ({"kl_loss_mode": "k4"}, "kl_loss_mode"), ({"epsilon": 1.5}, "epsilon"),
                  ({"advantage_estimator": "gae"}, "advantage_estimator"), ({"epsilon_c": 0.5}, "epsilon_c")):
    with pytest.raises(ValueError, match=msg):
      GRPOConfig(**kw)
  assert GRPOConfig(loss_agg_mode="dr_grpo", kl_loss_mode="k3").loss_agg_mode == "sequence-mean-token-scale"
  with pytest.raises(ValueError, match="ref_logps"):
    grpo_loss(jnp.zeros((1, 1)), None, None, jnp.ones(1), jnp.ones((1, 1)), GRPOConfig(beta=0.1))


def test_tagged_format_and_answer_rewards():
  good = "<think>2+2</think><answer> 4 </answer>"
  assert rewards.parse_tagged(good).answer == "4"
  for bad in ("<answer>4</answer>", "<think>a</think><answer>4</answer> trailing", "<think><think></think>"
              "<answer>4</answer>", "<answer>4</answer><think>x</think>"):
    assert not rewards.parse_tagged(bad).valid, bad
  comps = [good, "<think>x</think><answer>004</answer>", "<think>x</think><answer>5</answer>", "4"]
  np.testing.assert_array_equal(rewards.answer_reward(comps, ["4"] * 4), [1, 1, 0, 0])
  np.testing.assert_array_equal(rewards.answer_reward(comps, ["4"] * 4, require_format=False), [0, 0, 0, 1])
  np.testing.assert_array_equal(rewards.format_reward(comps), [1, 1, 1, 0])
  np.testing.assert_array_equal(rewards.tool_call_reward(["<tool>1+1</tool>", "<tool>", "none"]), [1, 0, 0])
  comp = rewards.CompositeReward(("answer", "format"), (rewards.answer_reward, rewards.format_reward), (1.0, 0.5))
  np.testing.assert_allclose(comp(comps, ["4"] * 4), [1.5, 1.5, 0.5, 0.0])
  with pytest.raises(ValueError, match="answers"):
    rewards.answer_reward(comps, ["4"])


def test_arithmetic_trace_is_correct_column_addition():
  rng = np.random.default_rng(6)
  for _ in range(300):
    a, b = (int(x) for x in rng.integers(0, 10 ** rng.integers(1, 5, size=2)))
    p = arith.problem(a, b)
    assert p["answer"] == str(a + b)
    cols = p["completion"].split("<think>")[1].split("</think>")[0].split(",")
    carry, digits = 0, []
    for i, col in enumerate(cols):
      lhs, s = col.split("=")
      x, y, c = (int(t) for t in lhs.split("+"))
      assert c == carry and x == (a // 10 ** i) % 10 and y == (b // 10 ** i) % 10 and int(s) == x + y + c
      digits.append(int(s) % 10)
      carry = int(s) // 10
    assert int("".join(map(str, ([carry] if carry else []) + digits[::-1]))) == a + b
    assert rewards.answer_reward([p["completion"]], [p["answer"]])[0] == 1.0
  train, ev = arith.split(50, 20, min_digits=1, max_digits=2, pad_operands=True, seed=0)
  assert not {t["prompt"] for t in train} & {e["prompt"] for e in ev}
  assert all(len(t["prompt"]) == 6 for t in train)         # "07+42="
