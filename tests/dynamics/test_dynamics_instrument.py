"""Instrumentation vs NumPy / scipy / brute-force loops, and the closed-form gradient vs autodiff."""

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from jaxlab.dynamics import instrument, markov
from jaxlab.nn import attention_only as ao


def test_share_and_rank_match_numpy_svd():
  m = np.random.default_rng(0).normal(size=(9, 6)) @ np.diag([5, 2, 0.3, 0.1, 0.01, 0.0])
  s = np.linalg.svd(m, compute_uv=False)
  js = instrument.singular_values(jnp.asarray(m, jnp.float32))
  np.testing.assert_allclose(float(instrument.top_share(js)), s[0] ** 2 / np.sum(s ** 2), rtol=1e-5)
  assert int(instrument.numerical_rank(js, 0.1)) == int(np.sum(s > 0.1 * s[0]))


def test_factored_svd_matches_numpy_svd_of_the_product():
  rng = np.random.default_rng(3)
  for m, k, n in ((40, 6, 30), (5, 8, 7), (12, 12, 12)):
    a, b = rng.normal(size=(m, k)), rng.normal(size=(k, n))
    u, s, vt = np.linalg.svd(a @ b)
    ju, js, jvt = instrument.product_svd(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    r = min(m, k, n)
    np.testing.assert_allclose(np.asarray(js), s[:r], rtol=2e-4, atol=1e-4)
    np.testing.assert_allclose(np.abs(np.asarray(ju[:, 0]) @ u[:, 0]), 1.0, atol=1e-4)   # up to sign
    np.testing.assert_allclose(np.abs(np.asarray(jvt[0]) @ vt[0]), 1.0, atol=1e-4)
    np.testing.assert_allclose(np.asarray(ju * js) @ np.asarray(jvt), a @ b, atol=1e-3)
    padded = instrument.singular_values(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    assert padded.shape == (min(m, n),)
    np.testing.assert_allclose(np.asarray(padded), s[:min(m, n)], atol=2e-4)
  for shape in ((30, 4), (4, 30)):   # tall / wide single matrices go through QR first
    x = rng.normal(size=shape)
    np.testing.assert_allclose(np.asarray(instrument.singular_values(jnp.asarray(x, jnp.float32))),
                               np.linalg.svd(x, compute_uv=False), rtol=1e-4)


def test_entropy_and_focus_match_bruteforce():
  rng = np.random.default_rng(1)
  b, t = 3, 7
  logits = rng.normal(size=(b, t, t))
  a = np.where(np.tril(np.ones((t, t))) > 0, np.exp(logits), 0.0)
  a /= a.sum(-1, keepdims=True)
  tokens = rng.integers(0, 5, (b, t))
  top = np.array([0, 2])
  ent = np.mean([scipy.stats.entropy(a[i, q, :q + 1]) for i in range(b) for q in range(1, t)])
  np.testing.assert_allclose(float(instrument.attention_entropy(jnp.asarray(a))), ent, rtol=1e-5)
  num = den = 0.0
  for i in range(b):
    for q in range(t):
      ctx = tokens[i, :q + 1]
      is_top = np.isin(ctx, top)
      if 0 < is_top.sum() < q + 1:
        num += a[i, q, :q + 1][is_top].sum()
        den += is_top.sum() / (q + 1)
  got = float(instrument.focus_index(jnp.asarray(a, jnp.float32), jnp.asarray(tokens), jnp.asarray(top)))
  np.testing.assert_allclose(got, num / den, rtol=1e-5)
  uniform = np.where(np.tril(np.ones((t, t))) > 0, 1.0, 0.0) / np.arange(1, t + 1)[:, None]
  uni = instrument.focus_index(jnp.asarray(np.broadcast_to(uniform, (b, t, t))), jnp.asarray(tokens), jnp.asarray(top))
  np.testing.assert_allclose(float(uni), 1.0, rtol=1e-6)


def test_closed_form_gradient_matches_autodiff_and_is_rank_one():
  v = 8
  p = markov.make_chain(v, alpha=0.5, seed=0)
  tokens = markov.sample(p, 512, 12, seed=1)
  # With W_E = I, W_V = I, W_Q = W_K = 0 (uniform attention) the model's W_P is Phi itself: at W_P = 0 the
  # autodiff gradient of the model loss must be -G.
  params = {"W_E": jnp.eye(v), "W_Q": jnp.zeros((v, v)), "W_K": jnp.zeros((v, v)), "W_V": jnp.eye(v),
            "W_P": jnp.zeros((v, v))}
  g = jax.grad(ao.next_token_loss)(params, jnp.asarray(tokens))["W_P"]
  closed = instrument.leading_order_gradient(tokens, v)
  np.testing.assert_allclose(-np.asarray(g), closed, atol=1e-6)
  # Long stationary sequences: G ~ pi (pi - 1/V)^T, leading singular pair aligned with (pi, pi - 1/V).
  long = markov.sample(p, 256, 200, seed=2)
  u, s, vt = np.linalg.svd(instrument.leading_order_gradient(long, v))
  pi = markov.stationary(p)
  assert s[0] ** 2 / np.sum(s ** 2) > 0.95
  assert instrument.abs_cos(u[:, 0], pi) > 0.99 and instrument.abs_cos(vt[0], pi - 1 / v) > 0.99
