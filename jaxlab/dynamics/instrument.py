"""Training-dynamics instrumentation: spectra, condensation share, numerical rank, attention focus and entropy.

Everything here is a pure function of arrays (jit-able), used to log the focus-dilution cycle (Chen et al.,
ICML 2026, arXiv 2605.01199) every N steps:

* top-1 share sigma_1^2 / sum_i sigma_i^2 of a matrix (condensation toward rank one),
* numerical rank #{i : sigma_i > rel * sigma_1},
* attention entropy -sum_s A_ts log A_ts averaged over queries,
* focus index: attention mass on context positions holding a high-frequency token divided by their uniform share
  (sum over valid queries of the mass / sum of n_top(t) / (t + 1)); 1 at uniform attention, > 1 when attention
  concentrates on frequent tokens,
* the leading-order gradient of cross-entropy w.r.t. the effective map at uniform attention (closed form).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def singular_values(m: jax.Array) -> jax.Array:
  """Singular values of a (m, n) matrix, descending, (min(m, n),) float32."""
  return jnp.linalg.svd(m, compute_uv=False)


def top_share(s: jax.Array) -> jax.Array:
  """sigma_1^2 / sum sigma_i^2 from descending singular values s; scalar in [1/len(s), 1]."""
  s2 = s ** 2
  return s2[0] / jnp.maximum(jnp.sum(s2), 1e-30)


def numerical_rank(s: jax.Array, rel: float = 0.1) -> jax.Array:
  """#{i : s_i > rel * s_1} (int32 scalar) from descending singular values."""
  return jnp.sum(s > rel * s[0]).astype(jnp.int32)


def attention_entropy(attn_btt: jax.Array, start: int = 1) -> jax.Array:
  """Mean entropy (nats) of the attention rows t >= start of a causal (B, T, T) attention tensor."""
  a = attn_btt[:, start:]
  h = -jnp.sum(jnp.where(a > 0, a * jnp.log(jnp.where(a > 0, a, 1.0)), 0.0), axis=-1)
  return jnp.mean(h)


def focus_index(attn_btt: jax.Array, tokens_bt: jax.Array, top_tokens: jax.Array) -> jax.Array:
  """Attention mass on high-frequency-token positions relative to its uniform share.

  Args:
    attn_btt: (B, T, T) causal attention (row t sums to 1 over s <= t).
    tokens_bt: (B, T) int tokens the attention was computed on.
    top_tokens: (k,) int ids of the high-frequency tokens.

  Returns:
    float32 scalar: sum_{valid (b,t)} sum_{s<=t, tok_s in top} A_ts / sum_{valid} n_top(t) / (t + 1), over the
    queries whose context holds both top and non-top tokens (elsewhere the ratio is 1 by construction).
  """
  t = tokens_bt.shape[1]
  is_top = jnp.any(tokens_bt[..., None] == top_tokens[None, None, :], axis=-1).astype(jnp.float32)  # (B, T)
  mass = jnp.einsum("bts,bs->bt", attn_btt, is_top)
  n_top = jnp.cumsum(is_top, axis=1)
  ctx = jnp.arange(1, t + 1, dtype=jnp.float32)[None, :]
  valid = (n_top > 0) & (n_top < ctx)
  uniform = n_top / ctx
  return jnp.sum(jnp.where(valid, mass, 0.0)) / jnp.maximum(jnp.sum(jnp.where(valid, uniform, 0.0)), 1e-30)


def leading_order_gradient(tokens_bt: np.ndarray, vocab: int, last_only: bool = False) -> np.ndarray:
  """Closed-form CE gradient w.r.t. Phi = W_E W_V W_P at uniform attention and zero logits.

  With uniform causal attention the prediction at position t is c_t^T Phi with c_t the mean one-hot vector of
  tokens 0..t, and zero logits give softmax = 1/V, so dL/dPhi = mean_t c_t (1/V - e_{y_t})^T. Its negative is
  G = E[c (e_y - 1/V)^T] ≈ pi (pi - 1/V)^T for long stationary sequences.

  Args:
    tokens_bt: (B, T) int tokens (predictions for positions 0..T-2 as in `next_token_loss`).
    vocab: V.
    last_only: only the last prediction.

  Returns:
    (V, V) float64 G (the negative gradient).
  """
  tok = np.asarray(tokens_bt)
  x, y = tok[:, :-1], tok[:, 1:]
  oh = np.eye(vocab)[x]                                     # (B, T-1, V)
  c = np.cumsum(oh, axis=1) / np.arange(1, x.shape[1] + 1)[None, :, None]
  ey = np.eye(vocab)[y] - 1.0 / vocab
  if last_only:
    c, ey = c[:, -1:], ey[:, -1:]
  return np.einsum("btv,btw->vw", c, ey) / (c.shape[0] * c.shape[1])


def abs_cos(a, b) -> float:
  """|cos(a, b)| of two vectors (float)."""
  a = np.asarray(a, np.float64).ravel()
  b = np.asarray(b, np.float64).ravel()
  return float(abs(a @ b) / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))
