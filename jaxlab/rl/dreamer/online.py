"""The online loop of the multi-task Dreamer: act in a batched environment, store to replay, update the world
models and the actor-critic, group the tasks, checkpoint (see `jaxlab.rl.dreamer.agent`).

    out = run(agent, env, workdir, env_steps=20_000, key=jax.random.key(0), grouping=GroupingConfig("single"))
    out["episodes"]        # [[task, env steps of that task so far, return], ...] of every finished episode
    out["eval"]            # (T,) mean return of `eval_episodes` episodes per environment with the policy's mean

Environment steps are counted per task (all copies of a task together, action repeat included). The run is
resumable from `workdir/checkpoints` (see the agent's module docstring) and ends bit-identical to an uninterrupted
run: checkpoints are written only where every episode has ended (the first episode boundary after each
`checkpoint_every` environment steps) and hold the agent, the replay, the acting carry, the last time step, the
prefill's random generator and the environments' random streams (`DMControlTasks.random_states`). SIGTERM or
Ctrl-C stops the run at the next episode boundary (at most one episode later), after a checkpoint, with
`jaxlab.errors.Preempted` / `Interrupted`.
"""

from __future__ import annotations

import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import checkpoint as ckpt_lib
from jaxlab import errors
from jaxlab import progress
from jaxlab.errors import ConfigError
from jaxlab.rl import replay
from jaxlab.rl.dreamer import agent as agent_lib
from jaxlab.rl.envs import base as envs_base
from jaxlab.train import loop as loop_lib

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
  buf = replay.init(t_n, capacity, obs_shape, agent.wcfg.act_dim, obs_dtype=obs_dtype, extras=agent.replay_extras())
  carry = agent.initial_carry(env.num_envs)
  rng = np.random.default_rng([seed, 0])
  meta = {"steps": 0, "updates": 0, "credit": 0.0, "episodes": [], "groupings": [], "assign": assign.tolist(),
          "grouped": g.mode != "grouped", "next_regroup": 0, "resumes": 0, "wall_s": 0.0, "saved_at": 0}
  benv = _Env(env, cfg.action_repeat)
  ts = None
  ckpt = None
  if cfg.checkpoint_every:
    ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=1, async_save=False)
    last = ckpt.latest_step()
    if last is not None:
      saved = ckpt.read_meta(last)["loop"]
      assign = np.asarray(saved["assign"])
      st = agent.init(jax.random.fold_in(key, 0), assign)
      target = {"agent": st, "replay": buf, "carry": carry, "timestep": _timestep_arrays(env, agent)}
      items, _ = ckpt.restore(last, _abstract(target))
      st, buf, carry = (items["state"][k] for k in ("agent", "replay", "carry"))
      ts = _timestep(items["state"]["timestep"])
      meta = dict(saved, resumes=saved["resumes"] + 1)
      rng.bit_generator.state = meta["rng"]
      if meta.get("env_random") is not None:
        env.set_random_states(meta["env_random"])
      benv.ended = True   # saved at an episode boundary: the next step starts new episodes
      log.info("resumed the online run at agent step %d (%d updates)", meta["steps"], meta["updates"])
  add = jax.jit(replay.add, donate_argnums=0)
  members = agent_lib.member_rows(assign, cfg.batch_size)
  if ts is None:
    ts = benv.reset()
  act_mask = jnp.asarray(env.act_mask[tasks], jnp.float32)
  ret_acc = np.zeros(env.num_envs)
  metrics = {}
  bar = progress.bar(total_steps, initial=meta["steps"], desc=desc)

  wall0, t_start = meta["wall_s"], time.time()

  def save():
    meta["wall_s"] = wall0 + time.time() - t_start
    meta["saved_at"] = int(meta["steps"] * per_step)
    meta["rng"] = rng.bit_generator.state
    meta["env_random"] = env.random_states() if hasattr(env, "random_states") else None
    if ckpt.latest_step() != meta["steps"]:
      items = {"agent": st, "replay": buf, "carry": carry, "timestep": _timestep_arrays(env, agent, ts)}
      ckpt.save(meta["steps"], items, meta={"loop": meta}, force=True)

  def regroup(st, assign, members, step, env_step):
    """The grouping's measurements and (re)groupings due at this agent step."""
    first_due = not meta["grouped"] and env_step >= g.group_at
    due = (g.mode == "grouped" and step >= cfg.prefill and
           (first_due or (meta["grouped"] and g.regroup_every and env_step >= meta["next_regroup"])))
    measure = (g.mode == "grouped" and g.measure_every and step >= cfg.prefill and not meta["grouped"] and
               not first_due and env_step // g.measure_every > meta.get("measured_at", -1) // g.measure_every)
    if measure:   # an affinity measurement of the shared phase, averaged into the first grouping
      sim = agent.affinity(st, buf, jax.random.fold_in(key, 2_000_000 + step), g)
      total = np.asarray(meta.get("affinity_sum", np.zeros_like(sim))) + sim
      meta["affinity_sum"], meta["affinity_n"] = total.tolist(), meta.get("affinity_n", 0) + 1
      meta["measured_at"] = int(env_step)
    if due:
      k = jax.random.fold_in(key, 2_000_000 + step)
      sim = None
      if first_due and meta.get("affinity_n"):
        sim = ((np.asarray(meta["affinity_sum"]) + agent.affinity(st, buf, k, g)) /
               (meta["affinity_n"] + 1))
      new, sim = agent.group(st, buf, k, g, sim=sim)
      meta["groupings"].append([int(env_step), new.tolist(), np.round(sim, 4).tolist()])
      if not np.array_equal(new, assign):
        st = agent.split_groups(st, assign, new)
        assign = new
        members = agent_lib.member_rows(assign, cfg.batch_size)
      meta["assign"] = assign.tolist()
      meta["grouped"] = True
      meta["next_regroup"] = int(env_step + g.regroup_every) if g.regroup_every else 0
    return st, assign, members

  try:
    with loop_lib.StopFlag() as flag:
      while meta["steps"] < total_steps:
        step = meta["steps"]
        k = jax.random.fold_in(key, 1_000_000 + step)
        a, carry = agent.act(st, assign[tasks], tasks, carry, ts.obs if not agent.wcfg.image_size else ts.pixels,
                             ts.first, k)
        a = np.asarray(a)
        if step < cfg.prefill:
          a = env.sample_actions(rng)
        # Padded action entries do nothing in the environment; the model sees them as 0 (stored and carried).
        a = jnp.asarray(a) * act_mask
        carry = {**carry, "action": a}
        a = np.asarray(a)
        obs = ts.pixels if agent.wcfg.image_size else ts.obs
        extra = {"deter": carry["deter"], "stoch": carry["stoch"]} if cfg.replay_context else None
        buf = add(buf, jnp.asarray(tasks), jnp.asarray(obs), jnp.asarray(a), jnp.asarray(ts.reward),
                  jnp.asarray(ts.discount), jnp.asarray(ts.first), extra)
        ts = benv.step(a)
        ret_acc += ts.reward
        meta["steps"] = step = step + 1
        for i in np.flatnonzero(ts.last):
          meta["episodes"].append([int(tasks[i]), int(step * per_step), float(ret_acc[i])])
          ret_acc[i] = 0.0
        env_step = step * per_step
        if g.before_updates:
          st, assign, members = regroup(st, assign, members, step, env_step)
        if step >= cfg.prefill:
          meta["credit"] += 1.0 / cfg.train_every
          while meta["credit"] >= 1.0:
            u = meta["updates"]
            do_ex = bool(agent.exchange_mask is not None and g.exchange_every and (u + 1) % g.exchange_every == 0
                         and int(assign.max()) > 0)
            st, buf, met = agent.update(st, buf, members, jax.random.fold_in(key, u), do_exchange=do_ex, tau=g.tau)
            metrics = met
            meta["updates"] = u + 1
            meta["credit"] -= 1.0
        if not g.before_updates:
          st, assign, members = regroup(st, assign, members, step, env_step)
        bar.update(1)
        if step % 100 == 0 and metrics:
          bar.set_postfix(progress.postfix({k: float(v) for k, v in metrics.items()}))
        # Checkpoints and stops happen only where every episode has ended, so that a resumed run continues bit
        # for bit (the environments' random streams are saved; MuJoCo's physics state is not needed there).
        if ts.last.all():
          if ckpt is not None and (flag.raised or env_step // cfg.checkpoint_every > meta["saved_at"]
                                   // cfg.checkpoint_every):
            save()
          if flag.raised and step < total_steps:
            try:
              flag.stop(f"at agent step {step} of {total_steps} (an episode boundary)")
            except errors.Interrupted as e:
              e.workdir = workdir
              e.step = step
              e.checkpoint = None if ckpt is None else ckpt.latest_step()
              raise
      if ckpt is not None:   # the end (before the evaluation, so that a rerun evaluates the same way)
        save()
  finally:
    bar.close()
    if ckpt is not None:
      ckpt.close()
  eval_ret = evaluate(agent, st, benv, assign, eval_episodes, jax.random.fold_in(key, 3)) if eval_episodes else None
  meta["wall_s"] = wall0 + time.time() - t_start
  return {"episodes": meta["episodes"], "eval": None if eval_ret is None else eval_ret.tolist(),
          "assign": [int(x) for x in assign], "groupings": meta["groupings"], "updates": meta["updates"],
          "metrics": {k: float(v) for k, v in metrics.items()}, "wall_s": meta["wall_s"], "resumes": meta["resumes"],
          "state": st}


_TS_FIELDS = ("obs", "reward", "discount", "first", "last", "task_id")


def _timestep_arrays(env, agent, ts=None) -> dict:
  """The TimeStep the loop acts on next, as arrays for the checkpoint (zeros of the right shapes when ts is None:
  the restore target)."""
  b = env.num_envs
  if ts is None:
    out = {"obs": jnp.zeros((b, env.obs_dim), jnp.float32), "reward": jnp.zeros((b,), jnp.float32),
           "discount": jnp.zeros((b,), jnp.float32), "first": jnp.zeros((b,), bool), "last": jnp.zeros((b,), bool),
           "task_id": jnp.zeros((b,), jnp.int32)}
    if agent.wcfg.image_size:
      out["pixels"] = jnp.zeros((b, env.image_size, env.image_size, 3), jnp.uint8)
    return out
  out = {k: jnp.asarray(getattr(ts, k)) for k in _TS_FIELDS}
  if agent.wcfg.image_size:
    out["pixels"] = jnp.asarray(ts.pixels)
  return out


def _timestep(arrays: dict):
  return envs_base.TimeStep(**{k: np.asarray(v) for k, v in arrays.items()})


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
