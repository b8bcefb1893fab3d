"""One-layer attention-only Transformer vs a brute-force NumPy loop (softmax per query over s <= t)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlab.nn import attention_only as ao


def _numpy_forward(p, tokens):
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  b, t = tokens.shape
  d = p["W_E"].shape[1]
  logits = np.zeros((b, t, p["W_P"].shape[1]))
  attn = np.zeros((b, t, t))
  for i in range(b):
    x = p["W_E"][tokens[i]]
    for q in range(t):
      s = np.array([x[q] @ p["W_Q"] @ p["W_K"].T @ x[k] / np.sqrt(d) for k in range(q + 1)])
      w = np.exp(s - s.max())
      w /= w.sum()
      attn[i, q, :q + 1] = w
      logits[i, q] = (w @ x[:q + 1]) @ p["W_V"] @ p["W_P"]
  return logits, attn


def test_forward_matches_bruteforce_loop():
  rng = np.random.default_rng(0)
  p = ao.init_params(jax.random.key(0), 7, 5, 0.7, value_identity=False)
  tokens = rng.integers(0, 7, (3, 6))
  logits, attn = ao.forward(p, jnp.asarray(tokens))
  ref_l, ref_a = _numpy_forward(p, tokens)
  np.testing.assert_allclose(np.asarray(attn), ref_a, atol=1e-5)
  np.testing.assert_allclose(np.asarray(logits), ref_l, rtol=1e-4, atol=1e-5)


def test_causal_and_loss_matches_numpy_cross_entropy():
  rng = np.random.default_rng(1)
  p = ao.init_params(jax.random.key(1), 6, 4, 0.5)
  tokens = rng.integers(0, 6, (2, 8))
  changed = tokens.copy()
  changed[:, 5:] = (changed[:, 5:] + 1) % 6
  a, _ = ao.forward(p, jnp.asarray(tokens))
  b, _ = ao.forward(p, jnp.asarray(changed))
  np.testing.assert_allclose(np.asarray(a)[:, :5], np.asarray(b)[:, :5], atol=1e-6)  # the future is invisible
  ref_l, _ = _numpy_forward(p, tokens[:, :-1])
  logp = ref_l - np.log(np.exp(ref_l).sum(-1, keepdims=True))
  ce = -np.mean(np.take_along_axis(logp, tokens[:, 1:, None], -1))
  np.testing.assert_allclose(float(ao.next_token_loss(p, jnp.asarray(tokens))), ce, rtol=1e-5)
  ce_last = -np.mean(logp[:, -1][np.arange(2), tokens[:, -1]])
  np.testing.assert_allclose(float(ao.next_token_loss(p, jnp.asarray(tokens), last_only=True)), ce_last, rtol=1e-5)


def test_init_scale_and_nnx_module():
  assert ao.init_std(64, init_gamma=1.0) == pytest.approx(1 / 64)
  m = ao.AttentionOnly(50, 64, init_std_value=1e-3, rngs=nnx.Rngs(0))
  assert np.std(np.asarray(m.W_E[...])) == pytest.approx(1e-3, rel=0.1)
  np.testing.assert_array_equal(np.asarray(m.W_V[...]), np.eye(64))
  assert m(jnp.zeros((2, 5), jnp.int32)).shape == (2, 5, 50)
  with pytest.raises(ValueError, match="batch, length"):
    m(jnp.zeros((5,), jnp.int32))


def test_table_logits_and_gradients_match_the_explicit_forward():
  """logits_from_tables (what the loss uses) == forward's X W_Q W_K^T X^T form, values and gradients."""
  rng = np.random.default_rng(2)
  p = ao.init_params(jax.random.key(2), 9, 6, 0.6, value_identity=False)
  tokens = jnp.asarray(rng.integers(0, 9, (4, 7)))
  np.testing.assert_allclose(np.asarray(ao.logits_from_tables(p, tokens)), np.asarray(ao.forward(p, tokens)[0]),
                             rtol=1e-5, atol=1e-6)
  ref_l, _ = _numpy_forward(p, np.asarray(tokens))
  np.testing.assert_allclose(np.asarray(ao.logits_from_tables(p, tokens)), ref_l, rtol=1e-4, atol=1e-5)

  def explicit_loss(params):
    logits, _ = ao.forward(params, tokens[:, :-1])
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

  g_ref = jax.jit(jax.grad(explicit_loss))(p)                 # jitted: one program each, not one per eager op
  g = jax.jit(jax.grad(ao.next_token_loss))(p, tokens)
  for n in ao.PARAM_NAMES:
    np.testing.assert_allclose(np.asarray(g[n]), np.asarray(g_ref[n]), rtol=1e-4, atol=1e-7, err_msg=n)
