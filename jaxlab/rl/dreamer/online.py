"""The online loop of the multi-task Dreamer: act in a batched environment, store to replay, update the world
models and the actor-critic, group the tasks, checkpoint (see `jaxlab.rl.dreamer.agent`).

    out = run(agent, env, workdir, env_steps=20_000, key=jax.random.key(0), grouping=GroupingConfig("single"))
    out["episodes"]        # [[task, env steps of that task so far, return], ...] of every finished episode
    out["eval"]            # (T,) mean return of `eval_episodes` episodes per environment with the policy's mean

Environment steps are counted per task (all copies of a task together, action repeat included). The run is
resumable from `workdir/checkpoints` (see the agent's module docstring).
"""

from __future__ import annotations

import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import checkpoint as ckpt_lib
from jaxlab import progress
from jaxlab.errors import ConfigError
from jaxlab.rl import replay
from jaxlab.rl.dreamer import agent as agent_lib

log = logging.getLogger("jaxlab")


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class _Env:
  """An environment stepped with action repeat (rewards summed). After an episode's last step the next call
  is the reset step (one environment step, the first observation, no repeat). Every environment of the batch
  must end its episodes on the same step, on a repeat boundary (dm_control: 1000 steps for every task)."""

  def __init__(self, env, repeat: int):
    self.env, self.repeat = env, int(repeat)
    self.ended = True

  def reset(self):
    self.ended = False
    return self.env.reset()

  def step(self, actions):
    if self.ended:
      self.ended = False
      return self.env.step(actions)
    total = None
    for i in range(self.repeat):
      ts = self.env.step(actions)
      total = ts.reward if total is None else total + ts.reward
      if ts.last.any() and (i < self.repeat - 1 or not ts.last.all()):
        raise ConfigError(f"episodes ended at different steps or inside an action repeat of {self.repeat}: use "
                          "tasks with equal episode lengths and an action_repeat that divides them (dm_control: "
                          "1000 steps)")
    ts.reward = total.astype(np.float32)
    self.ended = bool(ts.last.any())
    return ts


def run(agent: agent_lib.Agent, env, workdir: str, *, env_steps: int, key, grouping: agent_lib.GroupingConfig,
        eval_episodes: int = 0, seed: int = 0, desc: str | None = None) -> dict:
  """Trains `agent` online on `env` (a `jaxlab.rl.envs.MultiTaskEnv`) for `env_steps` steps per task.

  Returns {"episodes", "eval", "assign" (final groups), "groupings" ([env step, labels, cosine] of each grouping),
  "updates", "metrics" (the last update's), "wall_s" (over all sessions of the run), "resumes", "state" (the
  agent's final state)}.

  Raises:
    ConfigError: the budget ends inside the prefill, the replay is shorter than a window, the environment's
      tasks differ from the agent's, or episodes end inside an action repeat.
  """
  cfg, g = agent.cfg, grouping
  t_n, e_n = agent.num_tasks, env.envs_per_task
  if env.num_tasks != t_n:
    raise ConfigError(f"the environment has {env.num_tasks} tasks but the agent was built for {t_n}")
  per_step = cfg.action_repeat * e_n                    # env steps of a task per agent step
  total_steps = -(-env_steps // per_step)
  if total_steps <= cfg.prefill:
    raise ConfigError(f"env_steps={env_steps} per task leaves no learning after the prefill of {cfg.prefill} agent "
                      f"steps ({cfg.prefill * per_step} env steps); raise env_steps or lower prefill")
  tasks = np.asarray(env.task_ids)
  obs_shape = (env.image_size, env.image_size, 3) if agent.wcfg.image_size else (env.obs_dim,)
  obs_dtype = jnp.uint8 if agent.wcfg.image_size else jnp.float32
  capacity = min(cfg.capacity, total_steps * e_n + 1)
  if capacity < cfg.seq_len:
    raise ConfigError(f"replay capacity {capacity} per task is below seq_len={cfg.seq_len}")
  assign = agent_lib.initial_assign(g.mode, t_n)
  st = agent.init(jax.random.fold_in(key, 0), assign)
  buf = replay.init(t_n, capacity, obs_shape, agent.wcfg.act_dim, obs_dtype=obs_dtype)
  meta = {"steps": 0, "updates": 0, "credit": 0.0, "episodes": [], "groupings": [], "assign": assign.tolist(),
          "grouped": g.mode != "grouped", "next_regroup": 0, "resumes": 0,
          "wall_s": 0.0}
  ckpt = None
  if cfg.checkpoint_every:
    ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=1, async_save=False)
    last = ckpt.latest_step()
    if last is not None:
      saved = ckpt.read_meta(last)["loop"]
      assign = np.asarray(saved["assign"])
      st = agent.init(jax.random.fold_in(key, 0), assign)
      items, _ = ckpt.restore(last, _abstract({"agent": st, "replay": buf}))
      st, buf = items["state"]["agent"], items["state"]["replay"]
      meta = dict(saved, resumes=saved["resumes"] + 1)
      log.info("resumed the online run at agent step %d (%d updates)", meta["steps"], meta["updates"])
  add = jax.jit(replay.add, donate_argnums=0)
  members = agent_lib.member_rows(assign, cfg.batch_size)
  rng = np.random.default_rng([seed, meta["resumes"]])
  benv = _Env(env, cfg.action_repeat)
  ts = benv.reset()
  carry = agent.initial_carry(env.num_envs)
  ret_acc = np.zeros(env.num_envs)
  metrics = {}
  bar = progress.bar(total_steps, initial=meta["steps"], desc=desc)

  wall0, t_start = meta["wall_s"], time.time()

  def save():
    meta["wall_s"] = wall0 + time.time() - t_start
    if ckpt.latest_step() != meta["steps"]:
      ckpt.save(meta["steps"], {"agent": st, "replay": buf}, meta={"loop": meta}, force=True)

  while meta["steps"] < total_steps:
    step = meta["steps"]
    k = jax.random.fold_in(key, 1_000_000 + step)
    a, carry = agent.act(st, assign[tasks], tasks, carry, ts.obs if not agent.wcfg.image_size else ts.pixels,
                         ts.first, k)
    a = np.asarray(a)
    if step < cfg.prefill:
      a = env.sample_actions(rng)
      carry = {**carry, "action": jnp.asarray(a)}
    obs = ts.pixels if agent.wcfg.image_size else ts.obs
    buf = add(buf, jnp.asarray(tasks), jnp.asarray(obs), jnp.asarray(a), jnp.asarray(ts.reward),
              jnp.asarray(ts.discount), jnp.asarray(ts.first))
    ts = benv.step(a)
    ret_acc += ts.reward
    meta["steps"] = step = step + 1
    for i in np.flatnonzero(ts.last):
      meta["episodes"].append([int(tasks[i]), int(step * per_step), float(ret_acc[i])])
      ret_acc[i] = 0.0
    env_step = step * per_step

    def regroup(st, assign, members):
      due = (g.mode == "grouped" and step >= cfg.prefill and
             ((not meta["grouped"] and env_step >= g.group_at) or
              (meta["grouped"] and g.regroup_every and env_step >= meta["next_regroup"])))
      if due:
        new, sim = agent.group(st, buf, jax.random.fold_in(key, 2_000_000 + step), g)
        meta["groupings"].append([int(env_step), new.tolist(), np.round(sim, 4).tolist()])
        if not np.array_equal(new, assign):
          st = agent.split_groups(st, assign, new)
          assign = new
          members = agent_lib.member_rows(assign, cfg.batch_size)
        meta["assign"] = assign.tolist()
        meta["grouped"] = True
        meta["next_regroup"] = int(env_step + g.regroup_every) if g.regroup_every else 0
      return st, assign, members

    if g.before_updates:
      st, assign, members = regroup(st, assign, members)
    if step >= cfg.prefill:
      meta["credit"] += 1.0 / cfg.train_every
      while meta["credit"] >= 1.0:
        u = meta["updates"]
        do_ex = bool(agent.exchange_mask is not None and g.exchange_every and (u + 1) % g.exchange_every == 0
                     and int(assign.max()) > 0)
        st, met = agent.update(st, buf, members, jax.random.fold_in(key, u), do_exchange=do_ex, tau=g.tau)
        metrics = met
        meta["updates"] = u + 1
        meta["credit"] -= 1.0
    if not g.before_updates:
      st, assign, members = regroup(st, assign, members)
    bar.update(1)
    if step % 100 == 0 and metrics:
      bar.set_postfix(progress.postfix({k: float(v) for k, v in metrics.items()}))
    if ckpt is not None and env_step % cfg.checkpoint_every < per_step:
      save()
  bar.close()
  eval_ret = evaluate(agent, st, benv, assign, eval_episodes, jax.random.fold_in(key, 3)) if eval_episodes else None
  meta["wall_s"] = wall0 + time.time() - t_start
  if ckpt is not None:
    save()
    ckpt.close()
  return {"episodes": meta["episodes"], "eval": None if eval_ret is None else eval_ret.tolist(),
          "assign": [int(x) for x in assign], "groupings": meta["groupings"], "updates": meta["updates"],
          "metrics": {k: float(v) for k, v in metrics.items()}, "wall_s": meta["wall_s"], "resumes": meta["resumes"],
          "state": st}


def evaluate(agent, st, benv, assign, episodes: int, key) -> np.ndarray:
  """(T,) mean return per task of `episodes` episodes per environment acting with the policy's mean."""
  env = benv.env
  tasks = np.asarray(env.task_ids)
  total = np.zeros(env.num_envs)
  for ep in range(episodes):
    ts = benv.reset()
    carry = agent.initial_carry(env.num_envs)
    done = np.zeros(env.num_envs, bool)
    i = 0
    while not done.all():
      obs = ts.pixels if agent.wcfg.image_size else ts.obs
      a, carry = agent.act(st, np.asarray(assign)[tasks], tasks, carry, obs, ts.first,
                           jax.random.fold_in(key, ep * 100_000 + i), mode=True)
      ts = benv.step(np.asarray(a))
      total += np.where(done, 0.0, ts.reward)
      done |= ts.last
      i += 1
  return np.array([total[tasks == t].mean() / episodes for t in range(env.num_tasks)])
