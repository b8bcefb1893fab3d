"""Finite discounted MDPs: a random generator, exact value iteration and policy evaluation.

An MDP with S states and A actions is `P[s, a, s']` (transition probabilities, rows sum to 1),
`r[s, a]` (mean rewards) and a discount `gamma` in [0, 1). Everything here is a pure jnp function of those
arrays, so it jits and vmaps over a batch of MDPs.

* `random_mdp`: P(s, a, .) ~ Dirichlet(concentration * 1_S), r(s, a) ~ U[low, high].
* `value_iteration`: Q* as the fixed point of the Bellman optimality operator
  (T Q)(s, a) = r(s, a) + gamma sum_s' P(s, a, s') max_a' Q(s', a'), iterated until the sup-norm change is
  below `tol`, then polished by one exact evaluation of the greedy policy (a linear solve), so Q* is exact up
  to the solve's rounding once the greedy policy is optimal.
* `policy_evaluation`: Q^pi for a deterministic policy by solving (I - gamma P_pi) V = r_pi.
* `q_error`, `suboptimality`: ||Q - Q*||_inf and max_s V*(s) - V^{greedy(Q)}(s).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp


class MDP(NamedTuple):
  """A finite discounted MDP (a pytree; batch it by stacking leaves).

  Attributes:
    p: (S, A, S) float32 transition probabilities P[s, a, s'].
    r: (S, A) float32 mean rewards.
    gamma: () float32 discount in [0, 1).
  """
  p: jax.Array
  r: jax.Array
  gamma: jax.Array

  @property
  def num_states(self) -> int:
    return self.p.shape[-3]

  @property
  def num_actions(self) -> int:
    return self.p.shape[-2]


@functools.partial(jax.jit, static_argnums=(1, 2))
def random_mdp(key: jax.Array, num_states: int, num_actions: int, gamma: float, concentration: float = 0.5,
               reward_low: float = 0.0, reward_high: float = 1.0) -> MDP:
  """Samples P(s, a, .) ~ Dirichlet(concentration) and r(s, a) ~ U[reward_low, reward_high].

  Args:
    key: PRNG key.
    num_states: S.
    num_actions: A.
    gamma: discount in [0, 1).
    concentration: Dirichlet parameter (small values give sparse, peaked transition rows).
    reward_low: lower end of the mean rewards.
    reward_high: upper end of the mean rewards.

  Returns:
    An MDP with float32 arrays.
  """
  shape = (num_states, num_actions, num_states)
  # One flat PRNG draw (multi-dimensional threefry draws compile ~10x slower on CPU), reshaped.
  layers = 2 * GAMMA_ROUNDS + 2
  u = jax.random.uniform(key, (layers * math.prod(shape),), jnp.float32).reshape((layers,) + shape)
  g = gamma_from_uniforms(u[: 2 * GAMMA_ROUNDS + 1], concentration)
  p = g / jnp.sum(g, -1, keepdims=True)   # normalised Gamma(c) draws are Dirichlet(c)
  r = reward_low + (reward_high - reward_low) * u[-1, :, :, 0]
  return MDP(p, r, jnp.asarray(gamma, jnp.float32))


GAMMA_ROUNDS = 12


def gamma_from_uniforms(u: jax.Array, shape_param: float) -> jax.Array:
  """Gamma(shape_param, 1) samples from 2 * R + 1 layers of uniforms, R fixed Marsaglia-Tsang rounds.

  Draws Gamma(a + 1) by Marsaglia & Tsang (2000) (normal proposals from the first R layers by the inverse
  normal CDF, acceptance tests with the next R; acceptance is >= 0.95 per round, so R = 12 rounds all fail
  with probability < 1e-15, and the last proposal is used then) and boosts it to Gamma(a) with U^(1 / a)
  (the last layer). A fixed number of rounds (no while loop) and one PRNG call compile far faster on CPU
  than `jax.random.dirichlet`.

  Args:
    u: (2 R + 1, ...) float32 uniforms in [0, 1).
    shape_param: a > 0.

  Returns:
    float32 array of shape u.shape[1:], strictly positive.
  """
  rounds = (u.shape[0] - 1) // 2
  tiny = jnp.finfo(jnp.float32).tiny
  d = shape_param + 1.0 - 1.0 / 3.0
  c = 1.0 / jnp.sqrt(9.0 * d)
  x = jax.scipy.special.ndtri(jnp.clip(u[:rounds], 1e-7, 1.0 - 1e-7))
  v = (1.0 + c * x) ** 3
  accept = jnp.maximum(u[rounds: 2 * rounds], tiny)
  ok = (v > 0) & (jnp.log(accept) < 0.5 * x * x + d - d * v + d * jnp.log(jnp.maximum(v, tiny)))
  first = jnp.argmax(jnp.concatenate([ok, jnp.ones_like(ok[:1])], 0), axis=0)  # `rounds` = none accepted
  g = d * jnp.take_along_axis(jnp.maximum(v, tiny), jnp.minimum(first, rounds - 1)[None], 0)[0]
  boost = jnp.maximum(u[-1], tiny) ** (1.0 / shape_param)
  return jnp.maximum(g * boost, tiny)


def bellman_optimality(mdp: MDP, q_sa: jax.Array) -> jax.Array:
  """(T Q)(s, a) = r(s, a) + gamma sum_s' P(s, a, s') max_a' Q(s', a'); (S, A) -> (S, A)."""
  return mdp.r + mdp.gamma * jnp.einsum("ijk,k->ij", mdp.p, jnp.max(q_sa, -1))


def policy_evaluation(mdp: MDP, policy_s: jax.Array) -> jax.Array:
  """Q^pi of a deterministic policy by an exact linear solve.

  Args:
    mdp: the MDP.
    policy_s: (S,) int32 action per state.

  Returns:
    (S, A) float32 Q^pi(s, a) = r(s, a) + gamma sum_s' P(s, a, s') V^pi(s'), where
    V^pi = (I - gamma P_pi)^{-1} r_pi.
  """
  s = jnp.arange(mdp.num_states)
  p_pi = mdp.p[s, policy_s]            # (S, S)
  r_pi = mdp.r[s, policy_s]            # (S,)
  v = jnp.linalg.solve(jnp.eye(mdp.num_states, dtype=p_pi.dtype) - mdp.gamma * p_pi, r_pi)
  return mdp.r + mdp.gamma * jnp.einsum("ijk,k->ij", mdp.p, v)


@functools.partial(jax.jit, static_argnames=("tol", "max_iters"))
def value_iteration(mdp: MDP, tol: float = 1e-6, max_iters: int = 100_000) -> jax.Array:
  """Q* of the MDP: value iteration to sup-norm change < tol, then exact evaluation of its greedy policy.

  Args:
    mdp: the MDP (gamma < 1).
    tol: stopping threshold on ||T Q - Q||_inf.
    max_iters: iteration cap.

  Returns:
    (S, A) float32 Q*.
  """
  def cond(c):
    i, _, delta = c
    return (i < max_iters) & (delta > tol)

  def body(c):
    i, q, _ = c
    q_new = bellman_optimality(mdp, q)
    return i + 1, q_new, jnp.max(jnp.abs(q_new - q))

  q0 = jnp.zeros_like(mdp.r)
  _, q, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), q0, jnp.asarray(jnp.inf, q0.dtype)))
  # Polish: policy iteration from the greedy policy of the VI iterate (usually 0-1 extra solves).
  def pi_cond(c):
    i, pol, prev = c
    return (i < 50) & jnp.any(pol != prev)

  def pi_body(c):
    i, pol, _ = c
    q_pi = policy_evaluation(mdp, pol)
    return i + 1, greedy(q_pi), pol

  pol0 = greedy(q)
  _, pol, _ = jax.lax.while_loop(pi_cond, pi_body, (jnp.int32(0), pol0, jnp.full_like(pol0, -1)))
  return policy_evaluation(mdp, pol)


def greedy(q_sa: jax.Array) -> jax.Array:
  """(..., S, A) -> (..., S) int32 argmax over actions (lowest index on ties)."""
  return jnp.argmax(q_sa, -1).astype(jnp.int32)


def q_error(q_sa: jax.Array, q_star: jax.Array) -> jax.Array:
  """||Q - Q*||_inf over (s, a); (..., S, A) -> (...)."""
  return jnp.max(jnp.abs(q_sa - q_star), axis=(-2, -1))


def suboptimality(mdp: MDP, q_sa: jax.Array, q_star: jax.Array) -> jax.Array:
  """max_s V*(s) - V^{pi}(s) for pi = greedy(Q); () float32 (>= 0 up to rounding)."""
  q_pi = policy_evaluation(mdp, greedy(q_sa))
  s = jnp.arange(mdp.num_states)
  return jnp.max(jnp.max(q_star, -1) - q_pi[s, greedy(q_sa)])


def suboptimal_pairs(q_star: jax.Array, tol: float = 1e-6) -> jax.Array:
  """(S, A) bool: actions whose Q*(s, a) is below max_a' Q*(s, a') by more than tol (relative to scale)."""
  scale = 1.0 + jnp.max(jnp.abs(q_star))
  return q_star < jnp.max(q_star, -1, keepdims=True) - tol * scale
