"""Robust Q experiment: vanilla vs robust asynchronous Q-learning on random MDPs with corrupted rewards.

Launch: python -m jaxlab.main --config experiments/robust_q/config.py:tiny --workdir /tmp/robust_q
Expected (tiny, 2 CPU cores, ~20 s per seed): at epsilon = 0.1 (per-pair budget, burn-in 20) vanilla
Q-learning's error is ~100 at M = 100 and ~10^4 at M = 10^4, the trimmed-mean learner's is ~0.7 at both
(identical), its greedy policy is (near) optimal, and its error at epsilon = 0 is no worse than vanilla's.

The run is `jaxlab.train.run_loop` over `method.horizon / method.stage_steps` loop steps (stages; resumable,
checkpoints every `train.checkpoint_every` stages): each stage advances every batch element (grid.seeds MDPs x
corruption settings, sharded over the mesh's data axis) by `stage_steps` steps of one compiled lax.scan and
logs ||Q_t - Q*||_inf and the greedy policy's suboptimality per learner and setting (means over seeds), one
metrics.jsonl row per stage. summary.json (written once) holds the last stage's errors and the rate slopes
fitted over all the rows.
"""

from __future__ import annotations

import os
import sys

import jax
import numpy as np

from jaxlab import metrics
from jaxlab import mesh as mesh_lib
from jaxlab.rl import tabular as tb
from jaxlab.train import run_loop

from . import config as config_lib  # noqa: E402  (relative: works for installed and path-loaded experiments)
from . import method


def _setting_keys(config, settings):
  """For each setting index, functions (metric, estimator) -> summary key naming it."""
  e0, m0 = float(config.corruption.epsilon), float(config.corruption.magnitude)
  out = []
  for e, m in settings:
    names = [lambda metric, est: f"{metric}/{est}"] if (e, m) == (e0, m0) else []
    if m == m0:
      names.append(lambda metric, est, e=e: config_lib.eps_key(metric, est, e))
    if e == e0:
      names.append(lambda metric, est, m=m: config_lib.mag_key(metric, est, m))
    out.append(names)
  return out


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages and returns the summary (q_error/<estimator>[/eps_<e> | /M_<m>], suboptimality/..., slopes)."""
  with mesh_lib.use_config(config) as mesh:
    spec = method.make_spec(config)
    problem = method.build_problem(config, mesh)
    names = _setting_keys(config, problem.settings)
    state = method.init_states(spec, config, problem)
    shardings = jax.tree.map(lambda _: problem.sharding, state)
    steps = config.method.stage_steps

    def step_fn(state, stage):
      del stage  # the state carries the step counter t; randomness is fold_in(key, t)
      state = tb.run_batch(spec, state, problem.mdps, problem.advs, problem.eligible, problem.keys, steps)
      qerr, sub = jax.device_get(method.errors(state.q, problem.q_star, problem.mdps))
      qerr, sub = method.per_setting(qerr, problem), method.per_setting(sub, problem)
      counts = np.asarray(jax.device_get(state.hist.count))[: problem.used]
      out = {"steps": float(jax.device_get(state.t)[0]), "coverage/min_visits": float(counts.min()),
             "coverage/saturated": float(np.mean(counts > config.method.capacity))}
      for j, keys in enumerate(names):
        for e, est in enumerate(spec.estimators):
          for key in keys:
            out[key("q_error", est)] = float(qerr[j, e])
            out[key("suboptimality", est)] = float(sub[j, e])
      return state, out

    def final(state, loop_summary):
      del state
      out = summarise(metrics.read_metrics(workdir), config)
      out.update(num_settings=len(problem.settings), batch=problem.size, wall_s=loop_summary["wall_s"],
                 resumes=loop_summary["resumes"])
      return out

    _, summary = run_loop(config, workdir, state, shardings, step_fn, lambda s: s,
                          num_steps=config.method.horizon // steps, summarise=final)
  slopes = {k: round(v, 3) for k, v in summary.items() if k.startswith("rate_slope/")}
  if slopes and jax.process_index() == 0:
    print(f"[robust_q] fitted log-log rate slope of ||Q_t - Q*|| at eps = {_slope_eps(config):g}: {slopes}",
          file=sys.stderr, flush=True)
  return summary


def _slope_eps(config) -> float:
  """The corruption level whose error curve is fitted: 0 when the grid has it (the pure rate), else the main one."""
  return 0.0 if 0.0 in [float(e) for e in config.grid.epsilons] else float(config.corruption.epsilon)


def summarise(rows, config) -> dict:
  """The last stage's errors plus the rate slopes per estimator fitted over the stage rows (metrics.jsonl)."""
  if not rows:
    return {}
  last = rows[-1]
  out = {k: v for k, v in last.items() if k.startswith(("q_error/", "suboptimality/", "coverage/"))}
  out["steps"] = last.get("steps")
  e = _slope_eps(config)
  for est in config.method.estimators:
    key = config_lib.eps_key("q_error", est, e)  # logged for every epsilon at the main magnitude
    pts = [(r["steps"], r[key]) for r in rows if key in r]
    if pts:
      out[f"rate_slope/{est}"] = method.rate_slope(*zip(*pts), fit_from=config.grid.fit_from)
  return out


def plot(runs, workdirs, out_dir):
  """Q error vs steps (log-log) per learner, and the final error vs epsilon (the corruption floor)."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  rows = [metrics.read_metrics(w) for w in workdirs]
  cfg = metrics.read_json(os.path.join(workdirs[0], "config.json"))
  ests = list(cfg["method"]["estimators"])
  eps0, m0 = cfg["corruption"]["epsilon"], cfg["corruption"]["magnitude"]
  colors = dict(zip(["vanilla", "mean", "median", "mom", "trimmed", "trimmed_known"],
                    ["tab:red", "tab:orange", "tab:green", "tab:purple", "tab:blue", "tab:cyan"]))
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))

  def curve(key):
    pts = [[(r["steps"], r[key]) for r in rr if key in r] for rr in rows]
    if not all(pts) or len({len(p) for p in pts}) != 1:
      return None, None
    arr = np.array(pts, np.float64)
    return arr[0, :, 0], arr[:, :, 1].mean(0)

  ax = axes[0]
  for est in ests:
    for key, style, label in ((config_lib.mag_key("q_error", est, m0), "-", f"eps={eps0:g}"),
                              (config_lib.eps_key("q_error", est, 0), "--", "eps=0")):
      t, e = curve(key)
      if t is not None:
        ax.plot(t, e, style, color=colors.get(est), label=f"{est} ({label})")
  t, e = curve(config_lib.eps_key("q_error", config_lib.ROBUST, 0))
  if t is not None:
    ax.plot(t, e[0] * np.sqrt(t[0] / t), ":", color="k", label="slope -1/2")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("steps t")
  ax.set_ylabel("||Q_t - Q*||_inf (mean over seeds)")
  ax.set_title(f"Q error vs steps (M={m0:g})")
  ax.legend(fontsize=6, ncol=2)
  epsilons = sorted(float(e) for e in cfg["grid"]["epsilons"])
  for ax, robust_only in ((axes[1], True), (axes[2], False)):
    for est in ests:
      if robust_only and est in ("vanilla", "mean"):
        continue
      vals = [[r[config_lib.eps_key("q_error", est, e)] for r in runs] for e in epsilons]
      if all(all(v is not None for v in vv) for vv in vals):
        means = np.mean(np.array(vals, np.float64), 1)
        ax.plot(epsilons, means, "o-", color=colors.get(est), label=est)
    ax.set_xlabel("corruption fraction epsilon")
    ax.set_ylabel("final ||Q_T - Q*||_inf")
    ax.legend(fontsize=7)
    if robust_only:
      ax.set_title("error floor vs epsilon (robust estimators)")
    else:
      ax.set_yscale("log")
      ax.set_title(f"all estimators (log scale, M={m0:g})")
  path = save(fig, out_dir, "robust_q_errors.png")
  return [path]
