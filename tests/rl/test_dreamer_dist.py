"""DreamerV3 numerics of `jaxlab.rl.dreamer.dist` against numpy, plain Python loops and hand-made cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlab.rl.dreamer import dist

CENTRES = dist.bins()  # 255 centres on [-20, 20]
TINY = 1e-30

_roundtrip = jax.jit(lambda x: dist.symexp(dist.symlog(x)))
_twohot = jax.jit(dist.twohot)
_twohot_mean = jax.jit(dist.twohot_mean)


def _np_log_softmax(x):
  x = np.asarray(x, np.float64)
  z = x - x.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _np_softmax(x):
  return np.exp(_np_log_softmax(x))


# ----------------------------------------------------------------------------------------------- symlog


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, width=32))
def test_symlog_symexp_round_trip(x):
  got = float(_roundtrip(jnp.float32(x)))
  np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-30)


def test_symlog_is_identity_near_zero():
  x = np.float32([-1e-3, -1e-5, -1e-7, 0.0, 1e-7, 1e-5, 1e-3])
  y = np.asarray(dist.symlog(jnp.asarray(x)))
  assert y[3] == 0.0
  np.testing.assert_allclose(y, x, rtol=1e-3, atol=0)  # |symlog(x) - x| <= x^2 / 2
  np.testing.assert_allclose(np.asarray(dist.symexp(jnp.asarray(x))), x, rtol=1e-3, atol=0)
  assert float(jax.grad(dist.symlog)(1e-4)) == pytest.approx(1.0, abs=1e-3)
  # symlog is odd and compresses large magnitudes.
  np.testing.assert_allclose(dist.symlog(jnp.float32(-5.0)), -dist.symlog(jnp.float32(5.0)))
  assert float(dist.symlog(jnp.float32(1e6))) == pytest.approx(np.log1p(1e6), rel=1e-6)


# ----------------------------------------------------------------------------------------------- two-hot


def _inside_values():
  rng = np.random.default_rng(0)
  y = rng.uniform(-15.0, 15.0, 64)
  y = np.concatenate([y, np.asarray(CENTRES)[[0, 1, 127, 128, 253, 254]], [-1e-3, 0.0, 1e-3]])
  return dist.symexp(jnp.asarray(y, jnp.float32))


def test_twohot_weights_are_two_adjacent_and_recover_symlog():
  x = _inside_values()
  y = dist.symlog(x)
  code = np.asarray(_twohot(y, CENTRES))
  assert code.shape == (x.shape[0], CENTRES.shape[0])
  assert (code >= 0).all()
  np.testing.assert_allclose(code.sum(-1), 1.0, atol=1e-6)
  for row in code:
    nz = np.flatnonzero(row > 0)
    assert 1 <= len(nz) <= 2
    if len(nz) == 2:
      assert nz[1] - nz[0] == 1
  np.testing.assert_allclose(code @ np.asarray(CENTRES), np.asarray(y), atol=1e-5)


def test_twohot_mean_recovers_value():
  x = _inside_values()
  code = _twohot(dist.symlog(x), CENTRES)
  got = _twohot_mean(jnp.log(code + TINY), CENTRES)
  np.testing.assert_allclose(np.asarray(got), np.asarray(x), rtol=1e-4, atol=1e-6)


def test_twohot_clips_outside_the_bins():
  k = CENTRES.shape[0]
  code = np.asarray(_twohot(jnp.float32([25.0, 20.0, 1e4, -20.0, -25.0, -1e4]), CENTRES))
  want = np.eye(k, dtype=np.float32)[[k - 1, k - 1, k - 1, 0, 0, 0]]
  np.testing.assert_allclose(code, want, atol=1e-6)
  big = dist.symexp(jnp.float32(30.0))
  assert float(_twohot_mean(jnp.log(_twohot(dist.symlog(big), CENTRES) + TINY), CENTRES)) == pytest.approx(
      float(dist.symexp(jnp.float32(20.0))), rel=1e-4)


def test_twohot_loss_matches_hand_cross_entropy():
  centres = dist.bins(5, -2.0, 2.0)  # [-2, -1, 0, 1, 2]
  np.testing.assert_allclose(np.asarray(centres), [-2.0, -1.0, 0.0, 1.0, 2.0])
  logits = np.float32([0.1, -0.3, 0.7, 1.2, -0.5])
  target = np.float32(np.expm1(0.25))  # symlog(target) = 0.25: 3/4 on centre 0 (index 2), 1/4 on centre 1
  want_code = np.float64([0.0, 0.0, 0.75, 0.25, 0.0])
  np.testing.assert_allclose(np.asarray(dist.twohot(dist.symlog(jnp.float32(target)), centres)), want_code,
                             atol=1e-6)
  lsm = _np_log_softmax(logits)
  want = -(0.75 * lsm[2] + 0.25 * lsm[3])
  got = dist.twohot_loss(jnp.asarray(logits), jnp.float32(target), centres)
  assert float(got) == pytest.approx(want, rel=1e-5)
  # No gradient flows into the target; the logits' gradient is softmax - two-hot.
  g_target = jax.jit(jax.grad(lambda t: dist.twohot_loss(jnp.asarray(logits), t, centres)))(jnp.float32(target))
  assert float(g_target) == 0.0
  g_logits = jax.jit(jax.grad(lambda lg: dist.twohot_loss(lg, jnp.float32(target), centres)))(jnp.asarray(logits))
  np.testing.assert_allclose(np.asarray(g_logits), _np_softmax(logits) - want_code, atol=1e-6)


# ----------------------------------------------------------------------------------------------- lambda-returns


def _loop_returns(r, d, v, lam):
  h = r.shape[0]
  out = np.zeros((h,) + r.shape[1:], np.float64)
  out[h - 1] = v[h - 1]
  for t in range(h - 2, -1, -1):
    out[t] = r[t + 1] + d[t + 1] * ((1 - lam) * v[t + 1] + lam * out[t + 1])
  return out[: h - 1]


def _rand_traj(seed, h=7, b=3):
  rng = np.random.default_rng(seed)
  r = rng.standard_normal((h, b)).astype(np.float32)
  d = (0.99 * (rng.uniform(size=(h, b)) > 0.2)).astype(np.float32)
  v = rng.standard_normal((h, b)).astype(np.float32)
  return r, d, v


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
def test_lambda_returns_match_loop(lam):
  r, d, v = _rand_traj(int(lam * 100))
  got = np.asarray(dist.lambda_returns(jnp.asarray(r), jnp.asarray(d), jnp.asarray(v), lam=lam))
  assert got.shape == (6, 3)
  np.testing.assert_allclose(got, _loop_returns(r, d, v, lam), rtol=1e-5, atol=1e-5)


def test_lambda_zero_is_one_step_td():
  r, d, v = _rand_traj(1)
  got = np.asarray(dist.lambda_returns(jnp.asarray(r), jnp.asarray(d), jnp.asarray(v), lam=0.0))
  np.testing.assert_allclose(got, r[1:] + d[1:] * v[1:], rtol=1e-6, atol=1e-6)


def test_lambda_one_is_discounted_monte_carlo():
  h, b, gamma = 7, 3, 0.9
  r, _, v = _rand_traj(2, h, b)
  d = np.full((h, b), gamma, np.float32)
  got = np.asarray(dist.lambda_returns(jnp.asarray(r), jnp.asarray(d), jnp.asarray(v), lam=1.0))
  want = np.zeros((h - 1, b))
  for t in range(h - 1):
    want[t] = sum(gamma ** (k - t - 1) * r[k] for k in range(t + 1, h)) + gamma ** (h - 1 - t) * v[h - 1]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------- KL balancing


POST = np.float32([[1.0, 0.0, -1.0], [0.5, 2.0, -0.5]])
PRIOR = np.float32([[-0.5, 1.5, 0.0], [2.0, -1.0, 0.3]])


def _np_kl(p_logits, q_logits):
  lp, lq = _np_log_softmax(p_logits), _np_log_softmax(q_logits)
  return float(np.sum(np.exp(lp) * (lp - lq)))


def test_categorical_kl_matches_numpy():
  got = float(dist.categorical_kl(jnp.asarray(POST), jnp.asarray(PRIOR)))
  assert got == pytest.approx(_np_kl(POST, PRIOR), rel=1e-5)
  assert float(dist.categorical_kl(jnp.asarray(POST), jnp.asarray(POST))) == pytest.approx(0.0, abs=1e-6)
  # Batched: the KL sums over groups (axis -2) only.
  batch = dist.categorical_kl(jnp.stack([POST, PRIOR]), jnp.stack([PRIOR, POST]))
  np.testing.assert_allclose(np.asarray(batch), [_np_kl(POST, PRIOR), _np_kl(PRIOR, POST)], rtol=1e-5)


def _loss_grads(free, dyn, rep):
  def loss(post, prior):
    return dist.kl_balance(post, prior, free=free, dyn=dyn, rep=rep)[0]
  val, (g_post, g_prior) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(jnp.asarray(POST), jnp.asarray(PRIOR))
  return float(val), np.asarray(g_post), np.asarray(g_prior)


def test_kl_balance_gradients_split_between_prior_and_posterior():
  dyn, rep, free = 0.5, 0.1, 0.1
  kl = _np_kl(POST, PRIOR)
  assert kl > free
  loss, dyn_kl, rep_kl = dist.kl_balance(jnp.asarray(POST), jnp.asarray(PRIOR), free=free, dyn=dyn, rep=rep)
  assert float(dyn_kl) == pytest.approx(kl, rel=1e-5) and float(rep_kl) == pytest.approx(kl, rel=1e-5)
  assert float(loss) == pytest.approx((dyn + rep) * kl, rel=1e-5)
  _, g_post, g_prior = _loss_grads(free, dyn, rep)
  g_kl = jax.jit(jax.grad(dist.categorical_kl, argnums=(0, 1)))
  g_kl_post, g_kl_prior = g_kl(jnp.asarray(POST), jnp.asarray(PRIOR))
  np.testing.assert_allclose(g_prior, dyn * np.asarray(g_kl_prior), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(g_post, rep * np.asarray(g_kl_post), rtol=1e-5, atol=1e-7)
  # The same against the closed forms: dKL/dq_logits = q - p, dKL/dp_logits = p (log p - log q - KL_group).
  p, q = _np_softmax(POST), _np_softmax(PRIOR)
  lp, lq = _np_log_softmax(POST), _np_log_softmax(PRIOR)
  kl_group = np.sum(p * (lp - lq), -1, keepdims=True)
  np.testing.assert_allclose(g_prior, dyn * (q - p), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(g_post, rep * p * (lp - lq - kl_group), rtol=1e-4, atol=1e-6)


def test_kl_balance_free_bits_give_constant_loss_and_zero_gradients():
  free, dyn, rep = 10.0, 0.5, 0.1
  assert _np_kl(POST, PRIOR) < free
  loss, g_post, g_prior = _loss_grads(free, dyn, rep)
  assert loss == pytest.approx(free * (dyn + rep), rel=1e-6)
  assert (g_post == 0).all() and (g_prior == 0).all()


# ----------------------------------------------------------------------------------------------- latents


def test_straight_through_sample_is_one_hot_with_softmax_gradient():
  logits = jnp.asarray(np.random.default_rng(3).standard_normal((4, 6)), jnp.float32)
  w = jnp.asarray(np.random.default_rng(4).standard_normal((4, 6)), jnp.float32)
  key = jax.random.PRNGKey(0)
  sample = np.asarray(dist.straight_through_sample(key, logits))
  idx = np.asarray(jax.random.categorical(key, logits, -1))
  np.testing.assert_allclose(sample, np.eye(6)[idx], atol=1e-6)
  g_st = jax.jit(jax.grad(lambda lg: jnp.sum(dist.straight_through_sample(key, lg) * w)))(logits)
  g_sm = jax.jit(jax.grad(lambda lg: jnp.sum(jax.nn.softmax(lg, -1) * w)))(logits)
  np.testing.assert_allclose(np.asarray(g_st), np.asarray(g_sm), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("u", [0.01, 0.1])
def test_unimix_logits_mix_in_uniform_mass(u):
  logits = np.float32([[0.3, -1.0, 2.0, 0.0], [100.0, -100.0, -100.0, -100.0]])
  k = logits.shape[-1]
  probs = np.exp(np.asarray(dist.unimix_logits(jnp.asarray(logits), u), np.float64))
  np.testing.assert_allclose(probs, (1 - u) * _np_softmax(logits) + u / k, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
  assert probs.min() >= (u / k) * (1 - 1e-5)


def test_unimix_zero_is_log_softmax():
  logits = np.float32([0.3, -1.0, 2.0, 0.0])
  np.testing.assert_allclose(np.asarray(dist.unimix_logits(jnp.asarray(logits), 0.0)), _np_log_softmax(logits),
                             atol=1e-6)


# ----------------------------------------------------------------------------------------------- return scale


@pytest.mark.parametrize("prev,scale", [(0.5, 1.0), (3.0, 10.0)])
def test_percentile_scale_matches_numpy_ema(prev, scale):
  returns = (scale * np.random.default_rng(5).standard_normal(100)).astype(np.float32)
  decay = 0.99
  rng = np.percentile(returns.astype(np.float64), 95) - np.percentile(returns.astype(np.float64), 5)
  want = decay * prev + (1 - decay) * rng
  new, div = dist.percentile_scale(jnp.asarray(returns), jnp.float32(prev), decay=decay)
  assert float(new) == pytest.approx(want, rel=1e-5)
  assert float(div) == pytest.approx(max(1.0, want), rel=1e-5)
  if prev < 1.0:
    assert want < 1.0 and float(div) == 1.0
  else:
    assert want > 1.0 and float(div) == pytest.approx(float(new))
