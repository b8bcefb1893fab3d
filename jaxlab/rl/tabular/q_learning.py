"""Asynchronous Q-learning on a single trajectory with pluggable (robust) reward estimators, as a lax.scan.

At step t the agent is in s_t, takes a_t from the behaviour policy, observes a reward r_t (possibly corrupted
by an `Adversary`) and s_{t+1} ~ P(s_t, a_t, .). Only the visited entry is updated:

    Q_{t+1}(s_t, a_t) = (1 - alpha_k) Q_t(s_t, a_t) + alpha_k [ r~_t + gamma max_a' Q_t(s_{t+1}, a') ]

where r~_t is a reward estimate of the pair (s_t, a_t) from its reward history (`estimators.RewardHistory`):
the raw r_t for vanilla Q-learning, or the mean / median / median-of-means / trimmed mean of all rewards
seen at the pair so far (Robust Async-Q / RAQ use the trimmed mean). Burn-in n0: rewards are collected
but (s, a) is not updated until it has n0 samples; k = n(s, a) - max(n0, 1) counts the updates.
Step sizes (`STEP_SIZES`): rescaled_linear alpha_k = 1 / (1 + (1 - gamma) k) (Li et al. 2020 style),
linear 1 / (1 + k), polynomial 1 / (1 + k)^power, constant.

Several estimators learn side by side from the SAME trajectory and reward stream (one Q table each), which
makes their comparison paired. Behaviour policies: uniform (i.i.d. actions; the state sequence is still a
Markov chain) or eps_greedy with respect to one of the learners' Q (`behaviour_from`; the Markovian,
Q-dependent sampling of the paper's section 6). Q-learning is off-policy, so every learner is valid.

Randomness: step t draws 5 uniforms from fold_in(key, t) (action, exploration, next state by inverse CDF,
Bernoulli corruption, Gaussian noise by the inverse normal CDF), so a run split into chunks is bit-identical
to an unsplit one; s_0 = 0 (w.l.o.g. for a random MDP).

Everything is per (MDP, adversary, key); `run_batch` vmaps it over a leading batch axis (seeds x MDPs x
corruption settings) so a sweep is one compiled program, and shards nothing itself: pass arrays already
placed with a NamedSharding over the batch axis and jit keeps them there.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlab.rl.tabular import adversary as adv_lib
from jaxlab.rl.tabular import estimators as est_lib
from jaxlab.rl.tabular.mdp import MDP

STEP_SIZES = ("rescaled_linear", "linear", "polynomial", "constant")
BEHAVIOURS = ("uniform", "eps_greedy")
NOISES = ("gaussian", "student_t")


@dataclasses.dataclass(frozen=True)
class QLearningSpec:
  """Static settings of the learners (hashable; a jit static argument).

  Attributes:
    estimators: reward estimators, one Q table each (names from `estimators.ESTIMATORS`).
    capacity: history slots per pair (C); later rewards of a pair only enter the plain mean.
    burn_in: n0, samples a pair collects before its first update.
    step_size: one of STEP_SIZES.
    step_constant: alpha for `constant`.
    step_power: exponent for `polynomial`.
    delta: trimmed-mean failure probability.
    eps_factor: trimmed-mean zeta = eps_factor * epsilon + log_factor * log(4 / delta) / n.
    log_factor: see eps_factor.
    trim_epsilon: epsilon assumed by the trimmed mean; None = the adversary's true epsilon.
    known_range: range of mean rewards known to `trimmed_known`.
    mom_max_block: largest median-of-means block.
    behaviour: one of BEHAVIOURS.
    behaviour_eps: exploration probability of eps_greedy.
    behaviour_from: index into `estimators` of the learner whose Q drives eps_greedy.
    noise: reward noise, one of NOISES (student_t is scaled to standard deviation noise_scale).
    noise_scale: reward noise standard deviation sigma.
    noise_df: degrees of freedom of student_t (> 2).
  """
  estimators: tuple[str, ...] = ("vanilla", "trimmed")
  capacity: int = 4096
  burn_in: int = 0
  step_size: str = "rescaled_linear"
  step_constant: float = 0.1
  step_power: float = 0.8
  delta: float = 0.01
  eps_factor: float = 8.0
  log_factor: float = 24.0
  trim_epsilon: float | None = None
  known_range: tuple[float, float] = (0.0, 1.0)
  mom_max_block: int = 16
  behaviour: str = "uniform"
  behaviour_eps: float = 0.1
  behaviour_from: int = -1
  noise: str = "gaussian"
  noise_scale: float = 0.5
  noise_df: float = 3.0

  def __post_init__(self):
    bad = [e for e in self.estimators if e not in est_lib.ESTIMATORS]
    if bad or not self.estimators:
      raise ValueError(f"estimators {list(self.estimators)}: use a non-empty subset of {est_lib.ESTIMATORS}")
    for name, value, options in (("step_size", self.step_size, STEP_SIZES),
                                 ("behaviour", self.behaviour, BEHAVIOURS), ("noise", self.noise, NOISES)):
      if value not in options:
        raise ValueError(f"{name}={value!r}: use one of {options}")
    if self.capacity < 2 or self.burn_in < 0:
      raise ValueError(f"capacity must be >= 2 and burn_in >= 0, got {self.capacity}, {self.burn_in}")
    if not 0.0 < self.delta < 1.0:
      raise ValueError(f"delta must be in (0, 1), got {self.delta}")
    if self.noise == "student_t" and self.noise_df <= 2:
      raise ValueError(f"noise_df must be > 2 (finite variance), got {self.noise_df}")


class QState(NamedTuple):
  """Learner state for one (MDP, adversary, key).

  Attributes:
    q: (E, S, A) float32 one Q table per estimator.
    hist: reward histories of the P = S * A pairs.
    s: () int32 current state.
    t: () int32 steps taken.
    pair_corrupted: (P,) int32 corruptions per pair so far.
    all_corrupted: () int32 corruptions so far.
  """
  q: jax.Array
  hist: est_lib.RewardHistory
  s: jax.Array
  t: jax.Array
  pair_corrupted: jax.Array
  all_corrupted: jax.Array


def init_state(spec: QLearningSpec, num_states: int, num_actions: int, initial_state: int = 0) -> QState:
  """Zero Q tables, empty histories, s_0 = initial_state (w.l.o.g. for a random MDP)."""
  p = num_states * num_actions
  return QState(q=jnp.zeros((len(spec.estimators), num_states, num_actions), jnp.float32),
                hist=est_lib.RewardHistory.create(p, spec.capacity, spec.estimators),
                s=jnp.int32(initial_state),
                t=jnp.int32(0), pair_corrupted=jnp.zeros((p,), jnp.int32), all_corrupted=jnp.int32(0))


def step_size(spec: QLearningSpec, k: jax.Array, gamma: jax.Array) -> jax.Array:
  """alpha_k for the k-th update (k = 0, 1, ...) of a pair; float32."""
  k = k.astype(jnp.float32)
  if spec.step_size == "rescaled_linear":
    return 1.0 / (1.0 + (1.0 - gamma) * k)
  if spec.step_size == "linear":
    return 1.0 / (1.0 + k)
  if spec.step_size == "polynomial":
    return (1.0 + k) ** (-spec.step_power)
  return jnp.full_like(k, spec.step_constant)


def step(spec: QLearningSpec, state: QState, mdp: MDP, adv: adv_lib.Adversary, eligible_sa: jax.Array,
         u: jax.Array, noise: jax.Array) -> QState:
  """One transition and update of every learner.

  Args:
    spec: static settings.
    state: current state.
    mdp: the MDP.
    adv: the adversary.
    eligible_sa: (S, A) bool pairs the targeted adversary may hit (suboptimal actions).
    u: (4,) float32 uniforms of this step (action, exploration, next state, bernoulli corruption).
    noise: () float32 the reward noise of this step.

  Returns:
    The next state.
  """
  num_actions = mdp.num_actions
  s = state.s
  uniform_a = jnp.minimum((u[0] * num_actions).astype(jnp.int32), num_actions - 1)
  if spec.behaviour == "uniform":
    a = uniform_a
  else:
    greedy_a = jnp.argmax(state.q[spec.behaviour_from, s]).astype(jnp.int32)
    a = jnp.where(u[1] < spec.behaviour_eps, uniform_a, greedy_a)
  cdf = jnp.cumsum(mdp.p[s, a])
  s_next = jnp.minimum(jnp.sum(cdf < u[2] * cdf[-1]), mdp.num_states - 1).astype(jnp.int32)  # inverse CDF
  p = s * num_actions + a
  r_true = mdp.r[s, a] + noise
  n_new = state.hist.count[p] + 1
  flag = adv_lib.decide(adv, u[3], eligible_sa[s, a], state.pair_corrupted[p], n_new, state.all_corrupted,
                        state.t + 1)
  r_obs = adv_lib.corrupt(adv, r_true, flag).astype(jnp.float32)
  block = est_lib.mom_block_size(adv.epsilon, spec.mom_max_block)
  hist = state.hist.push(p, r_obs, block, spec.estimators)
  trim_eps = adv.epsilon if spec.trim_epsilon is None else jnp.float32(spec.trim_epsilon)
  r_est = hist.estimates(p, r_obs, spec.estimators, trim_eps, block, spec.delta, spec.eps_factor,
                         spec.log_factor, spec.known_range)                           # (E,)
  first = max(spec.burn_in, 1)
  alpha = step_size(spec, n_new - first, mdp.gamma)
  target = r_est + mdp.gamma * jnp.max(state.q[:, s_next, :], axis=-1)              # (E,)
  q_sa = state.q[:, s, a]
  new_q_sa = jnp.where(n_new >= first, q_sa + alpha * (target - q_sa), q_sa)
  return QState(q=state.q.at[:, s, a].set(new_q_sa), hist=hist, s=s_next, t=state.t + 1,
                pair_corrupted=state.pair_corrupted.at[p].add(flag.astype(jnp.int32)),
                all_corrupted=state.all_corrupted + flag.astype(jnp.int32))


def step_randomness(spec: QLearningSpec, key: jax.Array, ts: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Uniforms (L, 4) and reward noise (L,) of steps ts (L,): a function of (key, t) only.

  One vmapped PRNG call site (fold_in(key, t) then 5 uniforms; Gaussian noise by the inverse normal CDF)
  keeps compile time low on CPU; Student-t noise takes a second call site.
  """
  return _randomness(spec.noise, spec.noise_scale, spec.noise_df, key, ts)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _randomness(noise: str, noise_scale: float, noise_df: float, key, ts):
  def one(t):
    k = jax.random.fold_in(key, t)
    u = jax.random.uniform(k, (5,), jnp.float32)
    if noise == "gaussian":
      z = jax.scipy.special.ndtri(jnp.clip(u[4], 1e-7, 1.0 - 1e-7))
      return u[:4], noise_scale * z
    scale = noise_scale * math.sqrt((noise_df - 2.0) / noise_df)
    return u[:4], scale * jax.random.t(jax.random.fold_in(k, 1), noise_df)
  return jax.vmap(one)(ts)


def run(spec: QLearningSpec, state: QState, mdp: MDP, adv: adv_lib.Adversary, eligible_sa: jax.Array,
        key: jax.Array, length: int) -> QState:
  """`length` steps of `step` as a lax.scan (resumable: step t's randomness depends on (key, t) only)."""
  u, noise = step_randomness(spec, key, state.t + jnp.arange(length, dtype=jnp.int32))

  def body(st, xs):
    return step(spec, st, mdp, adv, eligible_sa, *xs), None
  return jax.lax.scan(body, state, (u, noise))[0]


@functools.partial(jax.jit, static_argnums=(0, 6))
def run_batch(spec: QLearningSpec, states: QState, mdps: MDP, advs: adv_lib.Adversary, eligible_bsa: jax.Array,
              keys: jax.Array, length: int) -> QState:
  """`run` vmapped over a leading batch axis of every argument except spec and length (jitted).

  `keys` are typed PRNG keys (B,) or their raw uint32 key data (B, 2).
  """
  if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
    keys = jax.random.wrap_key_data(keys)
  return jax.vmap(lambda st, m, ad, el, k: run(spec, st, m, ad, el, k, length))(states, mdps, advs, eligible_bsa,
                                                                                keys)
