"""gymnax environments (pure JAX) behind the batched `MultiTaskEnv` interface.

    env = GymnaxTasks(["CartPole-v1", "Pendulum-v1"], envs_per_task=8)
    ts = env.step(env.sample_actions(np.random.default_rng(0)))   # obs (16, 4): Pendulum's 3 + 1 zero

All tasks step in one jitted function (each task's copies with `vmap`); observations come back to the host
as numpy arrays, flattened and zero-padded like every `MultiTaskEnv`.

Actions: a continuous (Box) task takes the first act_dim entries of the padded action, clipped to its
bounds and reshaped to the space's shape. A discrete task (Discrete(n)) has act_dim = n and takes the argmax of
the first n entries (scores or a one-hot; ties go to the lowest index); its entries are not clipped.

Episode ends: gymnax's `env.step` resets by itself when an episode ends; this adapter instead follows the
interface's DreamerV3-style reset (the step that ends an episode returns its final observation with `last`,
the next step returns a fresh episode's first observation). gymnax >= 1.0 returns a 6-tuple (obs, state,
reward, terminated, truncated, info) with the final observation in `info["final_observation"]`;
older releases return a 5-tuple (obs, state, reward, done, info), for which `done` counts as terminated
unless `info["truncated"]` says otherwise, and the final observation is `info["final_observation"]` when
present, otherwise the returned one (those releases return the next episode's first observation there).

gymnax is not part of `jaxlab[all]` (its jax pin lags): pip install gymnax.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxlab import errors
from jaxlab.rl.envs import base


def import_gymnax():
  """Imports gymnax or raises a MissingDependencyError naming `pip install gymnax`."""
  import importlib
  try:
    return importlib.import_module("gymnax")
  except ImportError as e:
    raise errors.MissingDependencyError(
        f"optional package 'gymnax' is not installed or fails to import ({e}); install it with pip install gymnax "
        "(or pip install 'jaxlab[gymnax]'; it is outside jaxlab[all] because its jax pin lags)") from e


def parse_step(out) -> tuple[Any, Any, Any, Any, Any, Any]:
  """gymnax `env.step` output -> (obs, state, reward, terminated, truncated, final_obs).

  Accepts gymnax >= 1.0's 6-tuple (obs, state, reward, terminated, truncated, info) and the older 5-tuple
  (obs, state, reward, done, info); see the module docstring for the final observation.

  Raises:
    DataError: on any other tuple length.
  """
  import jax.numpy as jnp
  out = tuple(out)
  if len(out) == 6:
    obs, state, reward, terminated, truncated, info = out
  elif len(out) == 5:
    obs, state, reward, done, info = out
    truncated = info.get("truncated", False) if isinstance(info, dict) else False
    truncated = jnp.logical_and(done, truncated)
    terminated = jnp.logical_and(done, jnp.logical_not(truncated))
  else:
    raise errors.DataError(f"gymnax env.step returned {len(out)} values; expected 6 (obs, state, reward, "
                           "terminated, truncated, info) or 5 (obs, state, reward, done, info)")
  final = info.get("final_observation", obs) if isinstance(info, dict) else obs
  return obs, state, reward, jnp.asarray(terminated, bool), jnp.asarray(truncated, bool), final


def _task_spec(name: str, env, params) -> base.TaskSpec:
  obs_dim = int(np.prod(env.observation_space(params).shape))
  space = env.action_space(params)
  if hasattr(space, "n") and not hasattr(space, "low"):
    n = int(space.n)
    return base.TaskSpec(name, obs_dim, n, (-np.inf,) * n, (np.inf,) * n, discrete=True)
  shape = tuple(space.shape) or (1,)
  low = np.broadcast_to(np.asarray(space.low, np.float32), shape).ravel()
  high = np.broadcast_to(np.asarray(space.high, np.float32), shape).ravel()
  return base.TaskSpec(name, obs_dim, int(np.prod(shape)), tuple(map(float, low)), tuple(map(float, high)))


class GymnaxTasks(base.MultiTaskEnv):
  """gymnax environments as one padded batch (see the module docstring).

  Args:
    names: gymnax ids, e.g. ["CartPole-v1", "Pendulum-v1"] (`gymnax.registered_envs`).
    envs_per_task: copies of each task in the batch.
    seed: PRNG seed of the resets and of the environments' randomness.
    make: `name -> (env, params)` (default `gymnax.make`); lets tests and wrappers supply their own
      environment objects (with gymnax's reset/step/observation_space/action_space methods).

  Raises:
    ConfigError: unknown name (with `make` left to gymnax).
    MissingDependencyError: gymnax is not installed (with `make` left to gymnax).
  """

  def __init__(self, names=("CartPole-v1", "Pendulum-v1"), envs_per_task: int = 1, seed: int = 0,
               make: Callable[[str], tuple[Any, Any]] | None = None):
    import jax
    if isinstance(names, str):
      names = [names]
    names = list(names)
    if not names:
      raise errors.ConfigError("GymnaxTasks needs at least one environment name, e.g. ['CartPole-v1']")
    if envs_per_task < 1:
      raise errors.ConfigError(f"envs_per_task must be >= 1, got {envs_per_task}")
    if make is None:
      gymnax = import_gymnax()
      valid = list(gymnax.registered_envs)
      for name in names:
        if name not in valid:
          raise errors.ConfigError(f"unknown gymnax environment '{name}'; valid names: {', '.join(valid)}")
      make = gymnax.make
    self.envs, self.params = zip(*[make(name) for name in names])
    super().__init__([_task_spec(n, e, p) for n, e, p in zip(names, self.envs, self.params)], envs_per_task)
    self.seed = int(seed)
    self._key = jax.random.key(self.seed)
    self._reset_fn = jax.jit(self._reset_all)
    self._step_fn = jax.jit(self._step_all)
    self._key, key = jax.random.split(self._key)
    self._states, _ = self._reset_fn(key)
    self._needs_reset = jax.numpy.ones(self.num_envs, bool)

  # ---- traced functions (one jit over every task) ----

  def _keys(self, key):
    import jax
    return jax.random.split(key, (self.num_tasks, self.envs_per_task))

  def _flat_obs(self, obs):
    import jax.numpy as jnp
    obs = jnp.asarray(obs, jnp.float32).reshape(self.envs_per_task, -1)
    return jnp.pad(obs, ((0, 0), (0, self.obs_dim - obs.shape[1])))

  def _reset_all(self, key):
    import jax
    import jax.numpy as jnp
    keys, states, obs = self._keys(key), [], []
    for k, (env, params) in enumerate(zip(self.envs, self.params)):
      o, s = jax.vmap(lambda kk, env=env, params=params: env.reset(kk, params))(keys[k])
      states.append(s)
      obs.append(self._flat_obs(o))
    return tuple(states), jnp.concatenate(obs)

  def _env_action(self, k, a):
    import jax.numpy as jnp
    spec = self.tasks[k]
    if spec.discrete:
      return jnp.argmax(a[:spec.act_dim]).astype(jnp.int32)
    shape = tuple(self.envs[k].action_space(self.params[k]).shape) or ()
    return a[:spec.act_dim].reshape(shape)

  def _step_all(self, key, states, needs_reset, actions):
    import jax
    import jax.numpy as jnp
    keys, new_states, obs, rew, disc, last = self._keys(key), [], [], [], [], []
    e = self.envs_per_task
    for k, (env, params) in enumerate(zip(self.envs, self.params)):

      def one(kk, state, reset, a, k=k, env=env, params=params):
        k_step, k_reset = jax.random.split(kk)
        _, s_step, r, term, trunc, final = parse_step(env.step(k_step, state, self._env_action(k, a), params))
        o_reset, s_reset = env.reset(k_reset, params)
        state = jax.tree.map(lambda x, y: jnp.where(reset, x, y), s_reset, s_step)
        o = jnp.where(reset, jnp.asarray(o_reset, jnp.float32), jnp.asarray(final, jnp.float32))
        r = jnp.where(reset, 0.0, jnp.asarray(r, jnp.float32).reshape(()))
        term, trunc = jnp.reshape(term, ()), jnp.reshape(trunc, ())
        lst = jnp.logical_and(jnp.logical_not(reset), jnp.logical_or(term, trunc))
        d = jnp.where(jnp.logical_and(jnp.logical_not(reset), term), 0.0, 1.0)
        return state, o, r, d, lst

      s, o, r, d, lst = jax.vmap(one)(keys[k], states[k], needs_reset[k * e:(k + 1) * e], actions[k * e:(k + 1) * e])
      new_states.append(s)
      obs.append(self._flat_obs(o))
      rew.append(r)
      disc.append(d)
      last.append(lst)
    cat = jnp.concatenate
    return tuple(new_states), cat(obs), cat(rew).astype(jnp.float32), cat(disc).astype(jnp.float32), cat(last)

  # ---- host side ----

  def _timestep(self, obs, reward, discount, first, last) -> base.TimeStep:
    return base.TimeStep(obs=np.asarray(obs, np.float32), reward=np.asarray(reward, np.float32),
                         discount=np.asarray(discount, np.float32), first=np.asarray(first, bool),
                         last=np.asarray(last, bool), task_id=self.task_ids.copy())

  def _reset(self) -> base.TimeStep:
    import jax
    if self._states is None:
      raise errors.ConfigError("this GymnaxTasks is closed; create a new one")
    self._key, key = jax.random.split(self._key)
    self._states, obs = self._reset_fn(key)
    self._needs_reset = jax.numpy.zeros(self.num_envs, bool)
    n = self.num_envs
    return self._timestep(obs, np.zeros(n), np.ones(n), np.ones(n, bool), np.zeros(n, bool))

  def _step(self, actions: np.ndarray) -> base.TimeStep:
    import jax
    if self._states is None:
      raise errors.ConfigError("this GymnaxTasks is closed; create a new one")
    self._key, key = jax.random.split(self._key)
    first = self._needs_reset
    self._states, obs, reward, discount, last = self._step_fn(key, self._states, first, actions)
    self._needs_reset = last
    return self._timestep(obs, reward, discount, first, last)

  def close(self) -> None:
    self._states = None
