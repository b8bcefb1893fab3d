"""The numerics of a DreamerV3-style agent (Hafner et al., "Mastering Diverse Domains through World Models",
arXiv 2301.04104): symlog, two-hot targets on symlog-spaced bins, categorical latents with uniform mixing and
straight-through samples, KL balancing with free bits, lambda-returns and percentile return normalisation.

    symexp(symlog(x)) == x
    twohot_mean(log(twohot(symlog(x), bins)), bins) == x            for symlog(x) inside the bins
    loss = kl_balance(post_logits, prior_logits, free=1.0, dyn=0.5, rep=0.1)
    ret = lambda_returns(reward, disc, value, lam=0.95)             # (H - 1, ...) from H imagined states

Everything is a pure jnp function (jit, vmap and grad through it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def symlog(x):
  """sign(x) log(1 + |x|): compresses large magnitudes, the identity near 0."""
  return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def symexp(x):
  """The inverse of `symlog`: sign(x) (exp(|x|) - 1)."""
  return jnp.sign(x) * jnp.expm1(jnp.abs(x))


def bins(num: int = 255, low: float = -20.0, high: float = 20.0) -> jax.Array:
  """Equally spaced bin centres in symlog space (DreamerV3: 255 bins on [-20, 20])."""
  return jnp.linspace(low, high, num)


def twohot(x, centres):
  """(..., K) two-hot encoding of x (...,) on `centres` (K,): the weight is split between the two nearest
  centres so that the weighted mean of the centres is x (x is clipped to the outer centres)."""
  k = centres.shape[0]
  x = jnp.clip(x, centres[0], centres[-1])
  lo = jnp.clip(jnp.searchsorted(centres, x, side="right") - 1, 0, k - 2)
  w_hi = (x - centres[lo]) / (centres[lo + 1] - centres[lo])
  return (jax.nn.one_hot(lo, k) * (1.0 - w_hi)[..., None] + jax.nn.one_hot(lo + 1, k) * w_hi[..., None])


def twohot_mean(logits, centres):
  """The prediction of a two-hot head: symexp of the expected bin centre under softmax(logits)."""
  return symexp(jnp.sum(jax.nn.softmax(logits, -1) * centres, -1))


def twohot_loss(logits, target, centres):
  """Cross-entropy of the head's logits (..., K) against the two-hot code of symlog(target) (...,)."""
  return -jnp.sum(jax.lax.stop_gradient(twohot(symlog(target), centres)) * jax.nn.log_softmax(logits, -1), -1)


def unimix_logits(logits, unimix: float = 0.01):
  """Logits of the categorical (1 - unimix) softmax(logits) + unimix / K (DreamerV3 keeps 1% uniform mass so
  that no KL term is infinite)."""
  if unimix <= 0:
    return jax.nn.log_softmax(logits, -1)
  probs = jax.nn.softmax(logits, -1)
  probs = (1.0 - unimix) * probs + unimix / logits.shape[-1]
  return jnp.log(probs)


def straight_through_sample(key, logits):
  """A one-hot sample of each categorical (..., K) whose gradient is that of the probabilities."""
  probs = jax.nn.softmax(logits, -1)
  idx = jax.random.categorical(key, logits, -1)
  hard = jax.nn.one_hot(idx, logits.shape[-1], dtype=probs.dtype)
  return hard + probs - jax.lax.stop_gradient(probs)


def categorical_kl(p_logits, q_logits):
  """KL(p || q) of categoricals over the last axis, summed over the groups (the second-to-last axis)."""
  p_log = jax.nn.log_softmax(p_logits, -1)
  q_log = jax.nn.log_softmax(q_logits, -1)
  return jnp.sum(jnp.exp(p_log) * (p_log - q_log), axis=(-2, -1))


def kl_balance(post_logits, prior_logits, free: float = 1.0, dyn: float = 0.5, rep: float = 0.1):
  """DreamerV3's KL balancing with free bits: (loss, dyn_kl, rep_kl), each (...,).

  dyn = max(free, KL(sg(post) || prior)) trains the prior towards the posterior; rep = max(free, KL(post ||
  sg(prior))) trains the posterior (the representation) towards the prior; loss = dyn_scale dyn + rep_scale rep.
  Below `free` nats a term is constant, so it has no gradient.
  """
  sg = jax.lax.stop_gradient
  dyn_kl = categorical_kl(sg(post_logits), prior_logits)
  rep_kl = categorical_kl(post_logits, sg(prior_logits))
  return dyn * jnp.maximum(free, dyn_kl) + rep * jnp.maximum(free, rep_kl), dyn_kl, rep_kl


def lambda_returns(reward, disc, value, lam: float = 0.95):
  """TD(lambda) returns over an imagined trajectory of H states (time on axis 0).

  reward[t], disc[t] (= gamma * continue) and value[t] belong to state t (reward[t] is the reward received on
  arriving at state t). The return of state t < H - 1 is

      R_t = reward[t+1] + disc[t+1] ((1 - lam) value[t+1] + lam R_{t+1}),     R_{H-1} = value[H-1],

  and the result is (R_0 .. R_{H-2}), shape (H - 1, ...).
  """
  def step(nxt, inp):
    r, d, v = inp
    ret = r + d * ((1.0 - lam) * v + lam * nxt)
    return ret, ret
  _, rets = jax.lax.scan(step, value[-1], (reward[1:], disc[1:], value[1:]), reverse=True)
  return rets


def percentile_scale(returns, prev_scale, decay: float = 0.99, low: float = 5.0, high: float = 95.0):
  """DreamerV3's return normaliser: an exponential moving average of the (high - low) percentile range of the
  returns. Returns (new running range, the divisor max(1, range))."""
  rng = jnp.percentile(returns, high) - jnp.percentile(returns, low)
  new = decay * prev_scale + (1.0 - decay) * rng
  return new, jnp.maximum(1.0, new)
