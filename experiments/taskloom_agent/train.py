"""TaskLoom agent: single-task, all-shared and grouped online multi-task Dreamers on the same tasks.

Launch: python -m jaxlab.main --config experiments/taskloom_agent/config.py:tiny --workdir /tmp/taskloom_agent

Stages (`jaxlab.train.run_stages`; each arm resumable inside its stage from its own checkpoints):
* "baseline": returns of a uniform random policy, of the zero action and, on cartpole tasks, of a scripted PD
  controller (`method.baseline_episodes` episodes per task): "baseline/random", "baseline/zero",
  "baseline/scripted" (one per task; None where no controller is scripted); "task_family" (config.families).
* "balance" (when `method.balance_steps` > 0): claim v2 1's single-task agent, cartpole-balance alone for that
  many environment steps: "balance/episodes", "balance/eval" (the policy's mean action), "balance/updates".
* one stage per arm of `method.arms` ("single": one world model per task; "shared": one for all tasks;
  "grouped": TaskLoom's grouping and two-stage sharing), each trained online for `env.env_steps` environment
  steps per task (`jaxlab.rl.dreamer.online.run`): "<arm>/episodes" ([task, env steps, return] of every training
  episode, sampled actions), "<arm>/eval" (per task, the policy's mean action), "<arm>/assign",
  "<arm>/groupings", "<arm>/updates", "<arm>/wall_s", "<arm>/ari" (the first grouping's adjusted Rand index
  against the families; None without a grouping).
"""

from __future__ import annotations

import functools
import os

import jax
import ml_collections
import numpy as np

from jaxlab.multitask import grouping as grouping_lib
from jaxlab.rl.dreamer import agent as agent_lib
from jaxlab.rl.dreamer import behavior, online, rssm
from jaxlab.train import run_stages

from . import config as config_lib


def train_and_evaluate(config, workdir: str) -> dict:
  stages = {"baseline": baseline_stage}
  if config.method.balance_steps:
    stages["balance"] = balance_stage
  for arm in config.method.arms:
    stages[arm] = functools.partial(arm_stage, arm=arm)
  return run_stages(config, workdir, stages)


def make_env(config, seed: int):
  from jaxlab.rl.envs.dm_control import DMControlTasks  # pylint: disable=g-import-not-at-top
  e = config.env
  return DMControlTasks(list(e.names), envs_per_task=e.envs_per_task, seed=seed, workers=e.workers,
                        pixels=e.pixels, image_size=e.image_size)


def has_scripted(name: str) -> bool:
  """Whether `scripted_action` has a controller for the task (the cartpole balance tasks)."""
  return name.startswith("cartpole-balance")


def scripted_action(name: str, obs: np.ndarray) -> np.ndarray | None:
  """A PD controller for the cartpole balance tasks (obs: cart position, cos, sin of the pole angle, cart and
  pole velocities); None for other tasks."""
  if not has_scripted(name):
    return None
  x, c, s, xd, thd = obs[:5]
  th = np.arctan2(s, c)
  return np.clip(np.array([10.0 * th + 2.0 * thd + 0.5 * x + 1.0 * xd], np.float32), -1.0, 1.0)


def baseline_stage(ctx):
  config = ctx.config
  n = config.method.baseline_episodes
  names = list(config.env.names)
  with make_env(config, config.seed + 50_000) as env:
    rng = np.random.default_rng(config.seed)
    out = {}
    for policy in ("random", "zero", "scripted"):
      scripted = [has_scripted(nm) for nm in names]
      if policy == "scripted" and not any(scripted):
        out[policy] = [None] * len(names)
        continue
      totals = np.zeros(env.num_envs)
      for _ in range(n):
        ts = env.reset()
        done = np.zeros(env.num_envs, bool)
        while not done.all():
          a = env.sample_actions(rng)
          if policy == "zero":
            a = np.zeros_like(a)
          if policy == "scripted":
            for i, t in enumerate(env.task_ids):
              act = scripted_action(names[t], ts.obs[i])
              if act is not None:
                a[i, :1] = act
          ts = env.step(a)
          totals += np.where(done, 0.0, ts.reward)
          done |= ts.last
      per_task = [float(totals[env.task_ids == t].mean() / n) for t in range(len(names))]
      out[policy] = [v if policy != "scripted" or scripted[t] else None for t, v in enumerate(per_task)]
  return {"baseline/random": out["random"], "baseline/zero": out["zero"], "baseline/scripted": out["scripted"],
          "task_names": names, "task_family": config_lib.families(names)}


def build_agent(config, env):
  m, b, a, g = config.model, config.behavior, config.agent, config.grouping
  wcfg = rssm.WorldModelConfig(obs_dim=env.obs_dim, act_dim=env.act_dim, num_tasks=env.num_tasks,
                               image_size=env.image_size if config.env.pixels else 0, deter=m.deter, stoch=m.stoch,
                               classes=m.classes, hidden=m.hidden, layers=m.layers, cnn_depth=m.cnn_depth,
                               emb=m.emb, num_bins=m.num_bins, free_nats=m.free_nats)
  bcfg = behavior.BehaviorConfig(act_dim=env.act_dim, hidden=b.hidden, layers=b.layers, horizon=b.horizon,
                                 gamma=b.gamma, lam=b.lam, entropy=b.entropy, actor_grad=b.actor_grad,
                                 num_bins=m.num_bins, slowtar=b.slowtar, slowreg=b.slowreg)
  acfg = agent_lib.AgentConfig(batch_size=a.batch_size, seq_len=a.seq_len, model_lr=a.model_lr,
                               actor_lr=a.actor_lr, critic_lr=a.critic_lr, clip=a.clip, train_every=a.train_every,
                               prefill=a.prefill, action_repeat=config.env.action_repeat, imag_starts=a.imag_starts,
                               capacity=a.capacity, checkpoint_every=a.checkpoint_every, optimizer=a.optimizer,
                               agc=a.agc, warmup=a.warmup, replay_context=a.replay_context)
  obs_mask = None if config.env.pixels else env.obs_mask
  return agent_lib.Agent(wcfg, bcfg, acfg, obs_mask=obs_mask, exchange=g.exchange)


def grouping_config(config, arm: str) -> agent_lib.GroupingConfig:
  g = config.grouping
  return agent_lib.GroupingConfig(mode=arm, group_at=g.group_at, num_groups=g.num_groups, threshold=g.threshold,
                                  grad_batches=g.grad_batches, exclude=tuple(g.exclude), exchange=g.exchange,
                                  tau=g.tau, exchange_every=g.exchange_every, regroup_every=g.regroup_every,
                                  before_updates=g.before_updates, loss=g.loss, measure_every=g.measure_every)


def balance_stage(ctx):
  """Claim v2 1's single-task agent: cartpole-balance alone for `method.balance_steps` environment steps (the
  suite's environment seed; its PD and zero-action baselines are the baseline stage's)."""
  config = ctx.config
  c = ml_collections.ConfigDict(config.to_dict())
  c.env.names, c.env.env_steps = (config_lib.BALANCE,), int(config.method.balance_steps)
  with make_env(c, config.seed) as env:
    agent = build_agent(c, env)
    out = online.run(agent, env, ctx.subdir(), env_steps=c.env.env_steps, key=jax.random.key(config.seed),
                     grouping=grouping_config(c, "single"), eval_episodes=config.method.eval_episodes,
                     seed=config.seed, desc="balance")
  return {"balance/episodes": out["episodes"], "balance/eval": out["eval"], "balance/updates": out["updates"],
          "balance/wall_s": out["wall_s"]}


def arm_stage(ctx, arm: str):
  config = ctx.config
  with make_env(config, config.seed) as env:
    agent = build_agent(config, env)
    out = online.run(agent, env, ctx.subdir(), env_steps=config.env.env_steps, key=jax.random.key(config.seed),
                     grouping=grouping_config(config, arm), eval_episodes=config.method.eval_episodes,
                     seed=config.seed, desc=arm)
  ari = None
  if out["groupings"]:   # the first grouping against the dynamics families (as the offline taskloom measures it)
    ari = grouping_lib.adjusted_rand_index(out["groupings"][0][1], config_lib.families(config.env.names))
  return {f"{arm}/ari": ari, f"{arm}/episodes": out["episodes"], f"{arm}/eval": out["eval"],
          f"{arm}/assign": out["assign"],
          f"{arm}/groupings": out["groupings"], f"{arm}/updates": out["updates"], f"{arm}/wall_s": out["wall_s"],
          f"{arm}/final": [float(np.mean([e[2] for e in out["episodes"] if e[0] == t][-2:]))
                           for t in range(env.num_tasks)]}


def plot(runs, workdirs, out_dir):
  """returns.png: training-episode return against environment steps per task, one line per arm (mean over
  seeds, seeds thin), with the random policy, the zero action and the PD controller as dotted / dash-dot / dashed
  lines; with a "balance" stage, a first panel for claim v2 1's single-task agent."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  del workdirs
  names = runs[0]["task_names"]
  arms = [a for a in ("single", "shared", "grouped") if f"{a}/episodes" in runs[0]]
  panels = [(t, names[t], arms) for t in range(len(names))]
  if "balance/episodes" in runs[0]:
    panels.insert(0, (names.index(config_lib.BALANCE), f"{config_lib.BALANCE} alone", ["balance"]))
  fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
  colors = {"single": "#4477aa", "shared": "#228833", "grouped": "#ee6677", "balance": "#4477aa"}
  for (t, title, panel_arms), ax in zip(panels, axes[0]):
    for arm in panel_arms:
      curves = []
      for r in runs:
        eps = np.asarray([e for e in r[f"{arm}/episodes"] if arm == "balance" or e[0] == t], np.float64)
        ax.plot(eps[:, 1], eps[:, 2], color=colors[arm], lw=0.6, alpha=0.4)
        curves.append(eps)
      k = min(len(c) for c in curves)
      mean = np.mean([c[:k, 2] for c in curves], axis=0)
      ax.plot(curves[0][:k, 1], mean, color=colors[arm], lw=2, label="single" if arm == "balance" else arm)
    for key, style, label in (("random", ":", "random"), ("zero", "-.", "zero action"), ("scripted", "--", "PD")):
      vals = [r.get(f"baseline/{key}", [None] * len(names))[t] for r in runs]
      if all(v is not None for v in vals):
        ax.axhline(np.mean(vals), color="k", ls=style, lw=1, label=label)
    ax.set_title(title)
    ax.set_xlabel("environment steps (this task)")
    ax.set_ylabel("episode return")
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  path = os.path.join(out_dir, "returns.png")
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return [path]
