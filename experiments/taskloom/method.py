"""TaskLoom stage one (world-model learning): independent, all-shared and grouped two-stage multi-task training.

Every arm trains M world models stacked on a leading axis under one `vmap` (`jaxlab.rl.world_model`), each
model m on rows of the tasks assigned to it (`assign[t] = m`), with the same rows per step in total:
* independent: M = T, model t on task t;
* shared: M = 1, every task, the task embedding tells them apart;
* grouped (TaskLoom): `warmup` steps of the shared model (0: its initialisation), then per-task gradients of its
  parameters (of the observation loss, or the full loss; the task embeddings and the reward head excluded), their
  cosine matrix, and a clustering into groups (`jaxlab.multitask.grouping`); each group starts from the warm
  shared model and trains on its tasks only (stage 1: full sharing within a group), and every `exchange_every`
  steps the parameter subset `exchange` is soft-averaged across the group models with weight `tau` (stage 2: coarse
  exchange across groups; `jaxlab.multitask.param_sharing`). Optionally the grouping is recomputed
  every `regroup_every` steps (a new group starts from the mean of its tasks' models).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.errors import ConfigError
from jaxlab.multitask import grouping, param_sharing
from jaxlab.rl import synthetic
from jaxlab.rl import world_model as wm


def make_data(config, key):
  """(families, tasks, train rollouts, test rollouts)."""
  e = config.env
  kf, kt, kr, ke = jax.random.split(key, 4)
  scales = tuple(e.state_scales) if e.state_scales else None
  fam = synthetic.make_families(kf, e.families, e.state_dim, e.act_dim, nonlin=e.nonlin, state_scales=scales)
  tasks = synthetic.make_tasks(kt, fam, e.tasks_per_family)
  train = synthetic.rollouts(kr, fam, tasks, config.data.train_episodes, e.horizon, obs_noise=e.obs_noise,
                             policy=e.policy)
  test = synthetic.rollouts(ke, fam, tasks, config.data.test_episodes, e.horizon, obs_noise=e.obs_noise,
                            policy=e.policy)
  return fam, tasks, train, test


def collect_dm_control(config, seed: int, episodes: int) -> tuple[dict, np.ndarray, object]:
  """Random-policy trajectories of the dm_control tasks `config.env.names` (`jaxlab.rl.envs.DMControlTasks`):
  (data with obs (T, E, H + 1, obs_dim) zero-padded, action (T, E, H, act_dim), reward (T, E, H); the family of
  each task: its dm_control domain; the environment's task specs)."""
  from jaxlab.rl.envs.dm_control import DMControlTasks  # pylint: disable=g-import-not-at-top
  e = config.env
  horizon = e.horizon
  with DMControlTasks(list(e.names), envs_per_task=episodes, seed=seed) as env:
    rng = np.random.default_rng(seed)
    ts = env.reset()
    obs, act, rew = [ts.obs], [], []
    for _ in range(horizon):
      a = env.sample_actions(rng)
      ts = env.step(a)
      obs.append(ts.obs)
      act.append(a * env.act_mask[env.task_ids])
      rew.append(ts.reward)
      if ts.last.any():
        raise ConfigError(f"config.env.horizon={horizon} is longer than a dm_control episode; lower it")
    specs = env.tasks
  n_t = len(specs)

  def shape(x):   # (H, B, ...) -> (T, E, H, ...)
    x = np.stack(x, axis=1)
    return jnp.asarray(x.reshape((n_t, episodes) + x.shape[1:]), jnp.float32)
  domains = [sp.name.split("-")[0] for sp in specs]
  family = np.array([sorted(set(domains)).index(d) for d in domains], np.int32)
  return {"obs": shape(obs), "action": shape(act), "reward": shape(rew)}, family, specs


def windows(data: dict, key, task_ids, length: int) -> dict:
  """Random windows of `length` steps of the given tasks' trajectories (one row per task id)."""
  n_ep, horizon = data["action"].shape[1], data["action"].shape[2]
  ke, ks = jax.random.split(key)
  ep = jax.random.randint(ke, task_ids.shape, 0, n_ep)
  start = jax.random.randint(ks, task_ids.shape, 0, horizon - length + 1)

  def cut(x, extra):
    idx = start[:, None] + jnp.arange(length + extra)[None]
    return x[task_ids[:, None], ep[:, None], idx]
  return {"task_id": task_ids, "obs": cut(data["obs"], 1), "action": cut(data["action"], 0),
          "reward": cut(data["reward"], 0)}


def all_windows(data: dict, length: int) -> dict:
  """Every window of every task (the held-out evaluation set): leaves with leading axes (T, N)."""
  n_t, n_ep, horizon = data["action"].shape[:3]
  starts = np.arange(0, horizon - length + 1)
  ep, st = np.meshgrid(np.arange(n_ep), starts, indexing="ij")
  ep, st = ep.ravel(), st.ravel()
  idx = st[:, None] + np.arange(length + 1)[None]
  t = np.arange(n_t)[:, None, None]
  return {"task_id": jnp.broadcast_to(jnp.arange(n_t)[:, None], (n_t, len(ep))),
          "obs": data["obs"][t, ep[None, :, None], idx[None]],
          "action": data["action"][t, ep[None, :, None], idx[None, :, :-1]],
          "reward": data["reward"][t, ep[None, :, None], idx[None, :, :-1]]}


def _member_rows(assign: np.ndarray, num_models: int, rows: int) -> np.ndarray:
  """(M, rows) task ids: each model's tasks repeated round robin (shuffled per step inside the jitted step)."""
  return np.stack([np.resize(np.flatnonzero(assign == m), rows) for m in range(num_models)])


class Trainer:
  """Trains M stacked world models with Adam; `assign` maps tasks to models."""

  def __init__(self, config, wcfg: wm.WorldModelConfig, train_data: dict):
    self.config, self.wcfg, self.data = config, wcfg, train_data
    self.opt = optax.adam(config.train.optimizer.learning_rate)
    self.length = config.method.window

    def loss(params, batch):
      return wm.sequence_loss(params, wcfg, batch)[0]
    self.loss = loss
    self.obs_loss = lambda params, batch: wm.sequence_loss(params, wcfg, batch)[1]["obs_mse"]

    @jax.jit
    def step(params, opt_state, key, members):
      # Each model's rows: its tasks round robin, permuted with fold_in(fold_in(key, 1), m).
      row_key = jax.random.fold_in(key, 1)
      row_tasks = jax.vmap(lambda m, r: jax.random.permutation(jax.random.fold_in(row_key, m), r))(
          jnp.arange(members.shape[0]), members)

      def one(p, o, tids, k):
        batch = windows(train_data, k, tids, self.length)
        val, g = jax.value_and_grad(loss)(p, batch)
        upd, o = self.opt.update(g, o, p)
        return optax.apply_updates(p, upd), o, val
      keys = jax.random.split(key, row_tasks.shape[0])
      return jax.vmap(one)(params, opt_state, row_tasks, keys)
    self._step = step

  def init_opt(self, stacked):
    return jax.vmap(self.opt.init)(stacked)

  def run(self, stacked, opt_state, assign: np.ndarray, steps: int, key, *, exchange=None, tau: float = 0.0,
          exchange_every: int = 0, start: int = 0):
    """`steps` steps from step `start`; returns (params, opt state, last losses (M,))."""
    num_models = int(jax.tree.leaves(stacked)[0].shape[0])
    rows = max(1, self.config.train.batch_size * len(assign) // num_models)
    members = jnp.asarray(_member_rows(assign, num_models, rows))
    losses = None
    for i in range(start, start + steps):
      stacked, opt_state, losses = self._step(stacked, opt_state, jax.random.fold_in(key, i), members)
      if exchange is not None and exchange_every and (i + 1) % exchange_every == 0 and num_models > 1:
        stacked = param_sharing.soft_average(stacked, exchange, tau)
    return stacked, opt_state, losses


def stack(params, m: int):
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (m,) + x.shape), params)


def evaluate(stacked, wcfg, assign: np.ndarray, test_windows: dict) -> np.ndarray:
  """(T, H) open-loop observation MSE of each task under its model."""
  out = []
  for t in range(len(assign)):
    params = jax.tree.map(lambda x: x[int(assign[t])], stacked)
    batch = jax.tree.map(lambda x: x[t], test_windows)
    out.append(np.asarray(wm.open_loop_errors(params, wcfg, batch)))
  return np.stack(out)


def task_gradient_groups(trainer: Trainer, shared, train_data, config, key, num_tasks: int, truth: np.ndarray):
  """(labels by gradient cosine, cosine matrix, labels by gradient norm, random labels)."""
  g_cfg = config.grouping
  k = g_cfg.grad_batches
  tids = jnp.repeat(jnp.arange(num_tasks), k * config.train.batch_size).reshape(num_tasks, k, -1)
  keys = jax.random.split(key, num_tasks * k).reshape(num_tasks, k)
  batches = jax.vmap(jax.vmap(lambda t, kk: windows(train_data, kk, t, trainer.length)))(tids, keys)
  loss = trainer.obs_loss if g_cfg.loss == "obs" else trainer.loss
  g = grouping.task_gradients(loss, shared, batches, exclude=tuple(g_cfg.exclude))
  sim = grouping.cosine_matrix(g)
  groups = g_cfg.num_groups or None
  labels = grouping.cluster(sim, groups, threshold=None if groups else g_cfg.threshold, method=g_cfg.method)
  n_groups = int(labels.max()) + 1
  norms = np.linalg.norm(np.asarray(g), axis=1)
  norm_labels = grouping.cluster(-np.abs(norms[:, None] - norms[None, :]) / max(norms.max(), 1e-12) + 1.0,
                                 n_groups, method="agglomerative") if n_groups > 1 else np.zeros(num_tasks, np.int32)
  rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
  random_labels = rng.integers(0, n_groups, size=num_tasks)
  return labels, sim, norm_labels, random_labels


def regroup_params(stacked, old_assign: np.ndarray, new_assign: np.ndarray):
  """Group models for a new grouping: each new group starts from the mean of its tasks' old models."""
  return param_sharing.regroup(stacked, old_assign, new_assign)


def ari(labels, truth) -> float:
  return grouping.adjusted_rand_index(labels, truth)
