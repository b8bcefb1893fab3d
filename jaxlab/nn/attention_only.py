"""One-layer, attention-only Transformer with explicit W_E, W_Q, W_K, W_V, W_P and small initialisation.

The model of the focus-dilution analysis (Chen, Lin, Xu, Luo, ICML 2026, arXiv 2605.01199; reconstructed from
the predecessor arXiv 2510.06954): no MLP, no LayerNorm, no positional encoding (bag-of-tokens attention),
causal softmax attention, and a linear read-out:

    X = E[tokens] in R^{T x d},   S = X W_Q W_K^T X^T / sqrt(d),   A = softmax_causal(S),
    logits = A X W_V W_P in R^{T x V}.

All weights are drawn N(0, std^2) with std = `init_std` (the paper's small-init scale eps << 1) or, when
`init_gamma > 0`, std = d^-gamma (the group's "initialisation rate"). `value_identity=True` fixes W_V = I (fewer
moving parts; the first stage's closed-form alignment is derived for it); the predecessor paper (arXiv 2510.06954) trains
W_V from the small init, `value_identity=False`. The forward pass is a pure function of a parameter dict so that
full-batch gradient descent can run inside `lax.scan`; `AttentionOnly` is the Flax NNX wrapper.

Without positional encoding the model depends on the tokens only through two (V, V) tables (`token_tables`):
the scores K = W_E W_Q W_K^T W_E^T / sqrt(d) and the effective map Phi = W_E W_V W_P. `next_token_loss`
computes the same function through them (`logits_from_tables`), which is cheaper than the (B, T, d) form.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

PARAM_NAMES = ("W_E", "W_Q", "W_K", "W_V", "W_P")


def init_std(d: int, init_std_value: float = 1e-3, init_gamma: float = 0.0) -> float:
  """The initialisation standard deviation: d^-gamma when gamma > 0, else `init_std_value`."""
  return float(d) ** (-init_gamma) if init_gamma > 0 else float(init_std_value)


def init_params(key: jax.Array, vocab: int, d: int, std: float, value_identity: bool = True) -> dict:
  """Gaussian parameters with standard deviation `std`.

  Returns:
    {"W_E": (V, d), "W_Q": (d, d), "W_K": (d, d), "W_V": (d, d), "W_P": (d, V)} float32; W_V is the identity
    when `value_identity` (then it is not trained; see `trainable_mask`).
  """
  ks = jax.random.split(key, 5)
  shapes = {"W_E": (vocab, d), "W_Q": (d, d), "W_K": (d, d), "W_V": (d, d), "W_P": (d, vocab)}
  p = {n: std * jax.random.normal(k, shapes[n], jnp.float32) for n, k in zip(PARAM_NAMES, ks)}
  if value_identity:
    p["W_V"] = jnp.eye(d, dtype=jnp.float32)
  return p


def attention_scores(params: dict, tokens_bt: jax.Array) -> jax.Array:
  """Causal attention probabilities.

  Args:
    params: parameter dict (see `init_params`).
    tokens_bt: (B, T) int token ids in [0, V).

  Returns:
    (B, T, T) float32: row t is a distribution over positions s <= t (zeros above the diagonal).
  """
  x = params["W_E"][tokens_bt]                                     # (B, T, d)
  d = x.shape[-1]
  q = x @ params["W_Q"]
  k = x @ params["W_K"]
  s = jnp.einsum("btd,bsd->bts", q, k) / math.sqrt(d)
  t = tokens_bt.shape[1]
  causal = jnp.tril(jnp.ones((t, t), bool))
  s = jnp.where(causal, s, -jnp.inf)
  return jax.nn.softmax(s, axis=-1)


def forward(params: dict, tokens_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Logits and attention.

  Args:
    params: parameter dict.
    tokens_bt: (B, T) int token ids.

  Returns:
    (logits (B, T, V) float32, attention (B, T, T) float32); logits[:, t] predicts token t + 1.
  """
  a = attention_scores(params, tokens_bt)
  x = params["W_E"][tokens_bt]
  h = jnp.einsum("bts,bsd->btd", a, x)
  return h @ params["W_V"] @ params["W_P"], a


def token_tables(params: dict) -> tuple[jax.Array, jax.Array]:
  """The model's two token-level tables (no positional encoding, so the model is a function of them alone).

  Returns:
    (K (V, V) float32: K[i, j] = e_i W_Q W_K^T e_j / sqrt(d), the attention score of query token i on key token
    j (e_i = row i of W_E); Phi (V, V) float32: `effective_map`, the logits a context position of token j adds).
  """
  e = params["W_E"]
  k = (e @ params["W_Q"]) @ (e @ params["W_K"]).T / math.sqrt(e.shape[1])
  return k, effective_map(params)


def logits_from_tables(params: dict, tokens_bt: jax.Array) -> jax.Array:
  """The logits of `forward` computed through `token_tables` (B, T) -> (B, T, V) float32.

  Same function as `forward(params, tokens)[0]` (S[t, s] = K[x_t, x_s], logits_t = sum_s A_ts Phi[x_s]), without
  the (B, T, d) embeddings; on a CPU it takes about 0.6x the time of `forward` for the tiny focus-dilution
  sizes (V = 20, d = 16, T = 16), which is what full-batch GD spends its time on.
  """
  kk, phi = token_tables(params)
  s = kk[tokens_bt[:, :, None], tokens_bt[:, None, :]]            # (B, T, T)
  t = tokens_bt.shape[1]
  s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
  a = jax.nn.softmax(s, axis=-1)
  return jnp.einsum("bts,bsv->btv", a, phi[tokens_bt])


def next_token_loss(params: dict, tokens_bt: jax.Array, last_only: bool = False) -> jax.Array:
  """Mean next-token cross-entropy over positions 0..T-2 (or the last prediction only); a float32 scalar.

  Computed through `logits_from_tables` (the same function as `forward`'s logits).
  """
  logits = logits_from_tables(params, tokens_bt[:, :-1])
  targets = tokens_bt[:, 1:]
  if last_only:
    logits, targets = logits[:, -1:], targets[:, -1:]
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def effective_map(params: dict) -> jax.Array:
  """Phi = W_E W_V W_P, the (V, V) token-to-logit map at uniform attention."""
  return params["W_E"] @ params["W_V"] @ params["W_P"]


def trainable_mask(value_identity: bool) -> dict:
  """{name: bool} of the parameters that gradient descent updates (W_V is frozen when it is the identity)."""
  return {n: not (n == "W_V" and value_identity) for n in PARAM_NAMES}


class AttentionOnly(nnx.Module):
  """Flax NNX wrapper of the one-layer attention-only Transformer (see the module docstring).

  Attributes:
    W_E, W_Q, W_K, W_V, W_P: nnx.Param holding the arrays of `init_params`.
  """

  def __init__(self, vocab: int, d: int, *, init_std_value: float = 1e-3, init_gamma: float = 0.0,
               value_identity: bool = True, rngs: nnx.Rngs):
    if vocab < 2 or d < 1:
      raise ValueError(f"AttentionOnly needs vocab >= 2 and d >= 1, got vocab={vocab}, d={d}")
    p = init_params(rngs.params(), vocab, d, init_std(d, init_std_value, init_gamma), value_identity)
    for n in PARAM_NAMES:
      setattr(self, n, nnx.Param(p[n]))
    self.value_identity = value_identity

  def params(self) -> dict:
    """The parameters as a plain dict of arrays."""
    return {n: getattr(self, n)[...] for n in PARAM_NAMES}

  def __call__(self, tokens_bt: jax.Array) -> jax.Array:
    """(B, T) int tokens -> (B, T, V) float32 logits."""
    if tokens_bt.ndim != 2:
      raise ValueError(f"AttentionOnly expects (batch, length) token ids, got shape {tokens_bt.shape}")
    return forward(self.params(), tokens_bt)[0]
