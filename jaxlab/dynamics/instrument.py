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


def product_svd(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Thin SVD of the product a @ b from its factors, never forming or decomposing the (m, n) product.

  a = Q_a R_a and b^T = Q_b R_b (reduced QR), so a @ b = Q_a (R_a R_b^T) Q_b^T and the SVD of the small core
  R_a R_b^T = U S V^T gives a @ b = (Q_a U) S (Q_b V)^T. For the (V, V) effective map W_E W_V W_P of rank <= d this
  costs O(V d^2) instead of an O(V^3) SVD (a 4096 x 4096 SVD does not finish compiling for TPU).

  Args:
    a: (m, k); b: (k, n).

  Returns:
    (u (m, r), s (r,) descending, vt (r, n)) with r = min(m, k, n); the other singular values of a @ b are 0.
  """
  qa, ra = jnp.linalg.qr(a)
  qb, rb = jnp.linalg.qr(b.T)
  u, s, vt = jnp.linalg.svd(ra @ rb.T, full_matrices=False)
  return qa @ u, s, vt @ qb.T


def singular_values(m: jax.Array, b: jax.Array | None = None) -> jax.Array:
  """Singular values of a (m, n) matrix, or of the product m @ b when b is given, descending, (min(m, n),).

  A tall or wide matrix is reduced by QR to its square factor first, and a product is decomposed from its factors
  (`product_svd`); the values beyond the inner rank are exactly 0.
  """
  if b is None:
    rows, cols = m.shape
    if rows > cols:
      m = jnp.linalg.qr(m, mode="r")
    elif cols > rows:
      m = jnp.linalg.qr(m.T, mode="r")
    return jnp.linalg.svd(m, compute_uv=False)
  s = product_svd(m, b)[1]
  return jnp.pad(s, (0, min(m.shape[0], b.shape[1]) - s.shape[0]))


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
