"""TaskLoom stage one: independent, all-shared and grouped two-stage world models on the same multi-task data.

Launch: python -m jaxlab.main --config experiments/taskloom/config.py:tiny --workdir /tmp/taskloom

Stages (`jaxlab.train.run_stages`, resumable), one per arm of config.method.arms (`method` has the details):
* "independent": one world model per task;
* "shared": one model for all tasks, with task embeddings;
* "grouped": `grouping.warmup` shared steps, gradient-cosine grouping, then group models with the coarse
  exchange; also the grouping's adjusted Rand index against the true families, and that of a gradient-norm
  grouping and of a random grouping (reported).
Every arm takes train.steps steps with the same rows per step in total. Each reports "<arm>/open_loop": the
held-out open-loop observation MSE of every task at horizons 1..train.window (list of T lists), and
"<arm>/open_loop_mean".
"""

from __future__ import annotations

import numpy as np
import jax

from jaxlab.multitask import param_sharing
from jaxlab.rl import world_model as wm
from jaxlab.train import run_stages

from . import method


def train_and_evaluate(config, workdir: str) -> dict:
  stages = {arm: globals()[f"{arm}_stage"] for arm in config.method.arms}
  return run_stages(config, workdir, stages)


class _Tasks:
  """The task list of a dm_control run (`family`: each task's domain index, `num_tasks`)."""

  def __init__(self, family):
    self.family = np.asarray(family)
    self.num_tasks = len(self.family)


def _setup(config):
  key = jax.random.key(config.seed)
  if config.env.kind == "dm_control":
    train, family, specs = method.collect_dm_control(config, config.seed, config.data.train_episodes)
    test, _, _ = method.collect_dm_control(config, config.seed + 10_000, config.data.test_episodes)
    tasks = _Tasks(family)
    obs_dim, act_dim = train["obs"].shape[-1], train["action"].shape[-1]
  else:
    fam, tasks, train, test = method.make_data(config, jax.random.fold_in(key, 0))
    obs_dim, act_dim = fam.state_dim, fam.act_dim
  m = config.model
  wcfg = wm.WorldModelConfig(obs_dim=obs_dim, act_dim=act_dim, num_tasks=tasks.num_tasks,
                             latent=m.latent, hidden=m.hidden, layers=m.layers, emb=m.emb, embed=m.embed,
                             reward_weight=m.reward_weight)
  trainer = method.Trainer(config, wcfg, train)
  test_w = method.all_windows(test, config.method.window)
  init = wm.init(jax.random.fold_in(key, 1), wcfg)
  return key, tasks, trainer, wcfg, test_w, init


def _report(arm, errors, tasks, extra=None):
  out = {f"{arm}/open_loop": errors.tolist(), f"{arm}/open_loop_mean": float(errors[:, -1].mean()),
         "task_family": np.asarray(tasks.family).tolist()}
  out.update(extra or {})
  return out


def independent_stage(ctx):
  key, tasks, trainer, wcfg, test_w, init = _setup(ctx.config)
  t = tasks.num_tasks
  assign = np.arange(t)
  params = method.stack(init, t)
  params, _, _ = trainer.run(params, trainer.init_opt(params), assign, ctx.config.train.num_steps,
                             jax.random.fold_in(key, 2))
  return _report("independent", method.evaluate(params, wcfg, assign, test_w), tasks)


def shared_stage(ctx):
  key, tasks, trainer, wcfg, test_w, init = _setup(ctx.config)
  assign = np.zeros(tasks.num_tasks, np.int64)
  params = method.stack(init, 1)
  params, _, _ = trainer.run(params, trainer.init_opt(params), assign, ctx.config.train.num_steps,
                             jax.random.fold_in(key, 2))
  return _report("shared", method.evaluate(params, wcfg, assign, test_w), tasks)


def grouped_stage(ctx):
  config = ctx.config
  g = config.grouping
  key, tasks, trainer, wcfg, test_w, init = _setup(config)
  t = tasks.num_tasks
  shared = method.stack(init, 1)
  opt = trainer.init_opt(shared)
  shared, opt, _ = trainer.run(shared, opt, np.zeros(t, np.int64), g.warmup, jax.random.fold_in(key, 2))
  truth = np.asarray(tasks.family)
  warm = jax.tree.map(lambda x: x[0], shared)
  labels, sim, norm_labels, random_labels = method.task_gradient_groups(
      trainer, warm, trainer.data, config, jax.random.fold_in(key, 3), t, truth)
  extra = {"grouping/labels": labels.tolist(), "grouping/cosine": np.round(sim, 4).tolist(),
           "grouping/ari": method.ari(labels, truth), "grouping/ari_norm": method.ari(norm_labels, truth),
           "grouping/ari_random": method.ari(random_labels, truth), "grouping/groups": int(labels.max()) + 1}
  assign = labels.astype(np.int64)
  params = method.stack(warm, int(assign.max()) + 1)
  opt = trainer.init_opt(params)
  mask = param_sharing.select(warm, g.exchange) if g.exchange else None
  done, regroups = g.warmup, 0
  while done < config.train.num_steps:
    chunk = config.train.num_steps - done
    if g.regroup_every:
      chunk = min(chunk, g.regroup_every)
    params, opt, _ = trainer.run(params, opt, assign, chunk, jax.random.fold_in(key, 2), exchange=mask, tau=g.tau,
                                 exchange_every=g.exchange_every, start=done)
    done += chunk
    if g.regroup_every and done < config.train.num_steps:
      mean_model = jax.tree.map(lambda x: x.mean(0), params)
      new, *_ = method.task_gradient_groups(trainer, mean_model, trainer.data, config,
                                            jax.random.fold_in(key, 100 + done), t, truth)
      if not np.array_equal(new, assign):
        params = method.regroup_params(params, assign, new.astype(np.int64))
        opt = trainer.init_opt(params)
        assign = new.astype(np.int64)
        regroups += 1
  extra["grouping/regroups"] = regroups
  return _report("grouped", method.evaluate(params, wcfg, assign, test_w), tasks, extra)


def plot(runs, workdirs, out_dir):
  """open_loop.png: 5-step open-loop MSE per family and arm (mean over seeds, seeds as dots, log scale), and the
  grouping's ARI per seed."""
  import os  # pylint: disable=g-import-not-at-top
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  del workdirs
  arms = [a for a in ("independent", "shared", "grouped") if f"{a}/open_loop" in runs[0]]
  fam = np.asarray(runs[0]["task_family"])
  n_f = int(fam.max()) + 1
  fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 1]})
  for i, arm in enumerate(arms):
    per = np.array([[np.asarray(r[f"{arm}/open_loop"])[:, -1][fam == f].mean() for f in range(n_f)] for r in runs])
    x = np.arange(n_f) + 0.27 * (i - 1)
    ax.bar(x, per.mean(0), width=0.27, label=arm, alpha=0.85)
    ax.scatter(np.repeat(x, len(runs)), per.T.ravel(), color="k", s=6, zorder=3)
  ax.set_yscale("log")
  ax.set_xticks(range(n_f), [f"family {f}" for f in range(n_f)])
  ax.set_ylabel("5-step open-loop MSE")
  ax.legend(fontsize=8)
  if "grouping/ari" in runs[0]:
    ax2.bar(range(len(runs)), [r["grouping/ari"] for r in runs], color="#4477aa")
    ax2.axhline(1.0, color="k", lw=0.5)
    ax2.set_ylim(-0.5, 1.05)
    ax2.set_xlabel("run")
    ax2.set_ylabel("grouping ARI")
  fig.tight_layout()
  path = os.path.join(out_dir, "open_loop.png")
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return [path]
