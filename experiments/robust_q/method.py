"""Robust Q experiment glue: learners from the config, the batched problem, error metrics, the rate fit.

The algorithm itself (async Q-learning as a lax.scan, reward estimators, adversaries, exact planning) lives in
`jaxlab.rl.tabular`. Here:

* `make_spec`: the QLearningSpec of the config (Robust Async-RAQ = the `trimmed` learner, Robust Async-Q with
  a known reward range = `trimmed_known`, vanilla = raw rewards, plus mean / median / median-of-means).
* `corruption_settings`: the main (epsilon, M) plus the grid (epsilons at the main M, magnitudes at the
  main epsilon), deduplicated; every setting runs on the same MDP and trajectory randomness (paired).
* `build_problem`: grid.seeds MDPs x settings flattened into one batch axis, padded to a multiple of the mesh's
  data axis, placed with NamedSharding(P("data")): one compiled program for the whole sweep.
* `errors`: ||Q_T - Q*||_inf and the greedy policy's suboptimality max_s V*(s) - V^pi(s) per batch element
  and learner (exact, by linear solves).
* `rate_slope`: least-squares slope of log error vs log steps (~ -1/2 before the corruption floor).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab.rl import tabular as tb


def make_spec(config) -> tb.QLearningSpec:
  """The learners' static settings from config.method / config.mdp."""
  m, d = config.method, config.mdp
  return tb.QLearningSpec(
      estimators=tuple(m.estimators), capacity=m.capacity, burn_in=m.burn_in, step_size=m.step_size,
      step_constant=m.step_constant, step_power=m.step_power, delta=m.delta, eps_factor=m.eps_factor,
      log_factor=m.log_factor, known_range=tuple(float(v) for v in m.known_range), mom_max_block=m.mom_max_block,
      behaviour=m.behaviour, behaviour_eps=m.behaviour_eps, behaviour_from=list(m.estimators).index(
          "trimmed") if "trimmed" in m.estimators else 0,
      noise=d.noise, noise_scale=d.noise_scale, noise_df=d.noise_df)


def corruption_settings(config) -> list[tuple[float, float]]:
  """[(epsilon, M)]: the main setting first, then the epsilon grid (main M), then the M grid (main epsilon)."""
  e0, m0 = float(config.corruption.epsilon), float(config.corruption.magnitude)
  out = [(e0, m0)]
  for s in [(float(e), m0) for e in config.grid.epsilons] + [(e0, float(m)) for m in config.grid.magnitudes]:
    if s not in out:
      out.append(s)
  return out


@dataclasses.dataclass
class Problem:
  """The batched problem: B = seeds x settings (+ padding) elements, all sharded over the data axis.

  Attributes:
    mdps: MDP with leaves (B, ...).
    q_star: (B, S, A) optimal Q.
    eligible: (B, S, A) suboptimal pairs (targets of the targeted adversary).
    advs: Adversary with (B,) leaves.
    keys: (B, 2) uint32 PRNG key data of the trajectories (shared by the settings of one seed).
    seeds: number of MDPs (grid.seeds).
    settings: the corruption settings [(epsilon, M)].
    size: B (a multiple of the data axis).
    sharding: NamedSharding of the batch axis.
  """
  mdps: tb.MDP
  q_star: jax.Array
  eligible: jax.Array
  advs: tb.Adversary
  keys: jax.Array
  seeds: int
  settings: list
  size: int
  sharding: NamedSharding

  @property
  def used(self) -> int:
    return self.seeds * len(self.settings)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5, 6, 7))
def _sample_mdps(seed, seeds, num_states, num_actions, gamma, dirichlet, low, high):
  """`seeds` random MDPs, their Q*, suboptimal pairs and trajectory key data (module level: compiled once)."""
  seed_keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(seed), i))(jnp.arange(seeds))
  mdps = jax.vmap(lambda k: tb.random_mdp(jax.random.fold_in(k, 0), num_states, num_actions, gamma, dirichlet,
                                          low, high))(seed_keys)
  q_star = jax.vmap(tb.value_iteration)(mdps)
  run_keys = jax.vmap(lambda k: jax.random.key_data(jax.random.fold_in(k, 1)))(seed_keys)
  return mdps, q_star, jax.vmap(tb.suboptimal_pairs)(q_star), run_keys


def build_problem(config, mesh) -> Problem:
  """MDPs, Q*, adversaries and keys for grid.seeds MDPs x corruption settings, placed on the mesh."""
  d, cor = config.mdp, config.corruption
  settings = corruption_settings(config)
  r, j = config.grid.seeds, len(settings)
  data = dict(mesh.shape).get("data", 1)
  size = -(-(r * j) // data) * data
  idx = np.minimum(np.arange(size), r * j - 1)        # padding repeats the last element (dropped later)
  seed_of, set_of = idx // j, idx % j
  sharding = NamedSharding(mesh, P("data"))
  per_seed = jax.device_get(_sample_mdps(config.seed, r, d.num_states, d.num_actions, float(d.gamma),
                                         float(d.dirichlet), float(d.reward_low), float(d.reward_high)))
  mdps, q_star, eligible, keys = jax.tree.map(lambda x: np.asarray(x)[seed_of], per_seed)
  one = tb.Adversary.create(0.0, 0.0, cor.model, cor.budget)
  advs = tb.Adversary(np.array([settings[s][0] for s in set_of], np.float32),
                      np.array([settings[s][1] for s in set_of], np.float32),
                      np.full(size, int(one.model), np.int32), np.full(size, int(one.budget), np.int32))
  put = lambda tree: jax.device_put(tree, sharding)  # noqa: E731
  return Problem(mdps=put(mdps), q_star=put(q_star), eligible=put(eligible), advs=put(advs), keys=put(keys),
                 seeds=r, settings=settings, size=size, sharding=sharding)


@functools.lru_cache(maxsize=None)
def _init_fn(spec, num_states, num_actions, size, sharding):
  one = lambda: tb.init_state(spec, num_states, num_actions)  # noqa: E731
  return jax.jit(lambda: jax.tree.map(lambda x: jnp.broadcast_to(x, (size,) + x.shape), one()),
                 out_shardings=sharding)


def init_states(spec, config, problem: Problem) -> tb.QState:
  """Initial learner states for every batch element (s_0 = 0), created sharded on the devices."""
  return _init_fn(spec, config.mdp.num_states, config.mdp.num_actions, problem.size, problem.sharding)()


@jax.jit
def errors(q_besa: jax.Array, q_star_bsa: jax.Array, mdps: tb.MDP) -> tuple[jax.Array, jax.Array]:
  """(B, E) Q errors ||Q - Q*||_inf and (B, E) suboptimalities of the greedy policies."""
  qerr = tb.q_error(q_besa, q_star_bsa[:, None])
  sub = jax.vmap(lambda m, qs, q: jax.vmap(lambda qe: tb.suboptimality(m, qe, qs))(q))(mdps, q_star_bsa, q_besa)
  return qerr, sub


def per_setting(values_be: np.ndarray, problem: Problem) -> np.ndarray:
  """(B, E) per batch element -> (settings, E) means over the seeds (padding dropped)."""
  v = np.asarray(values_be, np.float64)[: problem.used]
  return v.reshape(problem.seeds, len(problem.settings), -1).mean(0)


def rate_slope(steps, errs, fit_from: float = 0.1) -> float:
  """Slope of log(error) vs log(steps) over the points with steps >= fit_from * max(steps); nan if < 2."""
  steps, errs = np.asarray(steps, np.float64), np.asarray(errs, np.float64)
  keep = (steps >= fit_from * steps.max()) & (errs > 0)
  if keep.sum() < 2:
    return float("nan")
  return float(np.polyfit(np.log(steps[keep]), np.log(errs[keep]), 1)[0])
