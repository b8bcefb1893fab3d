"""SWING experiment: error vs walks for uniform GRF, oracle IS and SWING; unbiasedness; a downstream task.

Launch: python -m jaxlab.main --config experiments/swing/config.py:tiny --workdir /tmp/swing
Expected (tiny, 2 CPU cores, ~1 min per seed): at 32 walks/node SWING's relative Frobenius error is well
below uniform GRF's and within 3x of the oracle proposal's; the mean of 20 SWING estimates is within 10% of K.

The run is a `jaxlab.train.run_stages` sequence (resumable; one checkpoint and one metrics.jsonl row per
stage): `walks@<w>` for each of method.walks evaluates the three estimators at w walks per node;
`unbiased@1` ... `unbiased@<eval.unbiased_seeds>` add independent SWING estimates to a running sum (the
carried state, replicated on the mesh) and record the running mean's error; `downstream` (unless
downstream.task is "none") runs graph-kernel label propagation on sklearn's digits (64-d points). Stage i
draws its randomness from fold_in(key(seed), 100 + i). summary.json (written once) flattens the stages'
results into the claim keys.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import metrics
from jaxlab import mesh as mesh_lib
from jaxlab.data import synthetic
from jaxlab.graphs import grf, igraph
from jaxlab.train import run_stages

from . import method


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages and returns the summary (err/<estimator>@<walks>, unbiased/*, downstream/*)."""
  root = jax.random.key(config.seed)
  with mesh_lib.use_config(config):
    x = method.load_points(config, jax.random.fold_in(root, 0))
    g = method.make_graph(config, x)
    ev = method.Evaluator(config, g, x, jax.random.fold_in(root, 1))
    baselines = config.method.baselines and ev.dense

    def stage_key(ctx):   # the key of stage i: fold_in(key(seed), 100 + i)
      return jax.random.fold_in(root, 100 + ctx.index)

    def errors(ctx, walks):
      """Relative Frobenius error of SWING (and of uniform GRF and the oracle proposal) at `walks` per node."""
      k1, k2 = jax.random.split(stage_key(ctx))
      out = {"walks": walks, "err/swing": ev.error(ev.estimate(method.swing_ensemble(config, k1, x, g, walks),
                                                               method.swing_ensemble(config, k2, x, g, walks)))}
      if baselines:
        for name in ("uniform", "oracle"):
          a = method.materialised_ensemble(config, k1, ev.w, walks, name)
          b = method.materialised_ensemble(config, k2, ev.w, walks, name)
          out[f"err/{name}"] = ev.error(ev.estimate(a, b))
      return out

    def unbiased(ctx, seeds):
      """One more independent SWING estimate added to the running sum; the error of the mean of `seeds`."""
      k1, k2 = jax.random.split(stage_key(ctx))
      w = config.eval.unbiased_walks
      est = ev.estimate(method.swing_ensemble(config, k1, x, g, w), method.swing_ensemble(config, k2, x, g, w))
      ctx.state = {"ksum": ctx.state["ksum"] + jnp.asarray(est, jnp.float32)}
      mean = np.asarray(ctx.state["ksum"], np.float64) / seeds
      return {"unbiased/seeds": seeds, "unbiased/single_err": ev.error(est), "unbiased/mean_err": ev.error(mean)}

    stages = {f"walks@{w}": functools.partial(errors, walks=w) for w in config.method.walks}
    nu = config.eval.unbiased_seeds
    stages.update({f"unbiased@{j + 1}": functools.partial(unbiased, seeds=j + 1) for j in range(nu)})
    if config.downstream.task != "none":
      stages["downstream"] = lambda ctx: downstream(config, stage_key(ctx))
    # The running sum has the estimates' shape: dense K_hat (N, N), or K_hat @ probes (N, probes).
    state = {"ksum": jnp.zeros((ev.n, ev.n if ev.dense else config.eval.probes), jnp.float32)} if nu else None
    return run_stages(config, workdir, stages, state=state, summarise=summarise,
                      extra_summary=dict(n=int(ev.n), dense_eval=bool(ev.dense)))


def summarise(results) -> dict:
  """Flattens the stages' results into the claim keys (+ the log-log slope of the running mean's error)."""
  out, seeds = {}, []
  for r in results.values():
    if "walks" in r:
      for k, v in r.items():
        if k.startswith("err/"):
          out[f"{k}@{int(r['walks'])}"] = v
    if "unbiased/seeds" in r:
      out["unbiased/mean_err"] = r["unbiased/mean_err"]
      seeds.append((r["unbiased/seeds"], r["unbiased/mean_err"]))
    out.update({k: v for k, v in r.items() if k.startswith("downstream/")})
  if len(seeds) >= 3:
    s, e = np.log(np.array(seeds, np.float64)).T
    out["unbiased/slope"] = float(np.polyfit(s, e, 1)[0])
  return out


def downstream(config, key) -> dict:
  """Label propagation on sklearn digits (1797 points in R^64) with exact K, SWING and uniform GRF."""
  ds = config.downstream
  if ds.task != "digits":
    return {}
  d = synthetic.digits("train", test_fraction=0.0)
  x = jnp.asarray(d["image"].reshape(len(d["label"]), -1))
  labels = np.asarray(d["label"])
  rng = np.random.default_rng(config.seed)
  labeled = np.zeros(len(labels), bool)
  for c in range(10):
    labeled[rng.choice(np.flatnonzero(labels == c), ds.labeled_per_class, replace=False)] = True
  y = jnp.asarray(np.eye(10)[labels] * labeled[:, None], jnp.float32)
  g = igraph.normalise(igraph.IGraph("rbf", bandwidth=ds.bandwidth), x, ds.rho)
  k1, k2 = jax.random.split(key)
  over = dict(m=ds.m, sigma2=ds.sigma2)
  a = method.swing_ensemble(config, k1, x, g, ds.walks, **over)
  b = method.swing_ensemble(config, k2, x, g, ds.walks, **over)
  out = {"downstream/acc_swing": method.label_propagation(np.asarray(grf.kernel_matvec(a, b, y)), labels, labeled)}
  w = igraph.materialise(g, x)
  k = grf.exact_kernel(np.asarray(w), config.method.kernel)
  out["downstream/acc_exact"] = method.label_propagation(k @ np.asarray(y), labels, labeled)
  ua = method.materialised_ensemble(config, k1, w, ds.walks, "uniform")
  ub = method.materialised_ensemble(config, k2, w, ds.walks, "uniform")
  out["downstream/acc_uniform"] = method.label_propagation(np.asarray(grf.kernel_matvec(ua, ub, y)), labels, labeled)
  return out


def plot(runs, workdirs, out_dir):
  """Error vs walks per node (log-log) for the three estimators, and the running-mean error vs seeds."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
  rows = [metrics.read_metrics(w) for w in workdirs]
  for name, color in (("uniform", "tab:red"), ("oracle", "tab:green"), ("swing", "tab:blue")):
    pts = [[(r["walks"], r[f"err/{name}"]) for r in rr if f"err/{name}" in r] for rr in rows]
    if not any(pts):
      continue
    ws = [p[0] for p in pts[0]]
    errs = np.array([[p[1] for p in run] for run in pts])
    axes[0].errorbar(ws, errs.mean(0), yerr=errs.std(0), marker="o", color=color, label=name, capsize=3)
  axes[0].set_xscale("log", base=2)
  axes[0].set_yscale("log")
  axes[0].set_xlabel("walks per node")
  axes[0].set_ylabel("relative Frobenius error")
  axes[0].legend()
  axes[0].set_title("K = (I - W)^-2 estimate")
  for rr, w in zip(rows, workdirs):
    pts = [(r["unbiased/seeds"], r["unbiased/mean_err"]) for r in rr if "unbiased/seeds" in r]
    if pts:
      axes[1].plot(*zip(*pts), marker=".", label=os.path.basename(w))
  if any(rows):
    s = np.arange(1, 21)
    first = [r["unbiased/mean_err"] for r in rows[0] if "unbiased/seeds" in r]
    if first:
      axes[1].plot(s, first[0] / np.sqrt(s), "k--", label="1/sqrt(seeds)")
  axes[1].set_xscale("log")
  axes[1].set_yscale("log")
  axes[1].set_xlabel("independent SWING estimates averaged")
  axes[1].set_ylabel("error of their mean")
  axes[1].legend(fontsize=7)
  path = save(fig, out_dir, "swing_error.png")
  return [path]
