"""NAVAR-ICE experiment: train NAVAR (+ bootstrap retrainings), score edges, extract and label response curves.

Launch: python -m jaxlab.main --config experiments/navar_ice/config.py:tiny --workdir /tmp/navar_ice
Your data: python -m jaxlab.main --config experiments/navar_ice/config.py:variant=full,data=csv --workdir DIR \
             --config.data.path=FILE.csv [--config.data.truth_path=GT.txt] [--config.data.unit_column=country]
Expected (tiny, synthetic, ~30-60 s per seed on 2 busy CPU cores): AUROC 1.0; the four true edges have
near-equal scalar scores while their PD curves recover linear / threshold / saturating / sign-changing shapes
(nRMSE <= 0.35, corr >= 0.95) and are labelled so; the linear VAR misses the sign-changing edge; the
regime-dependent edge's ICE curves fan out (>= 3x the dispersion of a homogeneous edge).

The run is `jaxlab.train.run_stages`:
  train           `jaxlab.train.run_loop` (in workdir/stages/train/, resumable on its own) over
                  method.steps // method.chunk chunks of method.chunk full-batch AdamW steps of every system
                  (synthetic: the four-mechanism system and the heterogeneity pair) and every ensemble member
                  (member 0 on the data, members 1..bootstrap on bootstrap resamples with their own
                  initialisation), one checkpoint per chunk; returns the last chunk's train metrics and the
                  trained parameters (stage arrays, read back by the next stages);
  evaluate/main   edge scores, response curves, mechanism labels, bands, baselines (response_curves.npz);
  evaluate/het    (synthetic data with data.heterogeneity) the regime pair's ICE dispersion
                  (response_curves_het.npz);
  plots           (eval.plots) response_functions.png and heterogeneity.png.
Windows are sharded over the "data" mesh axis (padded with zero-weight windows). Evaluation is deterministic
host-side work on the trained parameters. summary.json is written once, after the last stage.
"""

from __future__ import annotations

import functools
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import metrics
from jaxlab.causal import data as data_lib
from jaxlab.causal import ensemble, ice, scores
from jaxlab.causal.navar import Navar
from jaxlab.train import optim, run_loop, run_stages

from . import method

# Entries of the training run_loop's summary that are not results of the run (timing, bookkeeping).
_LOOP_ONLY = ("wall_s", "resumes", "step")


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains every system's ensemble, evaluates the edges; returns the summary (also in summary.json)."""
  d, m = config.data, config.method
  members = 1 + m.bootstrap
  tx, _ = optim.make_optimizer(config.train.optimizer, m.steps)
  systems = method.build_systems(config)      # reads / generates the data before the workdir is touched
  rng = np.random.default_rng(config.seed + 7919)
  for k, s in enumerate(systems):
    win = data_lib.make_windows(s["panel"], d.lags, d.normalise, d.val_fraction)
    s["windows"] = win
    s["model"] = Navar(n=len(win.variables), lags=d.lags, hidden=config.model.hidden, kind=config.model.kind,
                       layers=config.model.layers)
    # Bands are reported for the main system only; the heterogeneity pair trains member 0 alone.
    s["members"] = members if s["name"] == "main" else 1
    s["weights"] = ensemble.bootstrap_weights(rng, ~win.val, s["members"])
    # Host-side init from a numpy Generator: compiling a vmapped threefry init costs seconds on CPU.
    s["init"] = ensemble.init(s["model"], tx, np.random.default_rng([config.seed, k]), s["members"])

  stages = {"train": functools.partial(train_stage, systems=systems, tx=tx)}
  for s in systems:
    stages[f"evaluate/{s['name']}"] = functools.partial(evaluate_stage, system=s)
  if config.eval.plots:
    stages["plots"] = plots_stage
  return run_stages(config, workdir, stages, summarise=summarise)


def train_stage(ctx, systems: list[dict], tx) -> dict:
  """run_loop over the chunks in ctx.subdir(); returns the last chunk's metrics and the trained parameters."""
  config, mesh = ctx.config, ctx.mesh
  d, m = config.data, config.method
  split = dict(mesh.shape).get("data", 1)
  repl = NamedSharding(mesh, P())
  state, shardings, batch, steps = {}, {}, {}, {}
  for s in systems:
    win, w = s["windows"], s["weights"]
    pad = (-len(win.y)) % split
    arrays = {"x": np.pad(win.x, ((0, pad), (0, 0), (0, 0))), "y": np.pad(win.y, ((0, pad), (0, 0))),
              "w": np.pad(w, ((0, 0), (0, pad))), "v": np.pad(win.val.astype(np.float32), (0, pad))}
    specs = {"x": P("data"), "y": P("data"), "w": P(None, "data"), "v": P("data")}
    batch[s["name"]] = {key: jax.device_put(jnp.asarray(a), NamedSharding(mesh, specs[key]))
                        for key, a in arrays.items()}
    state[s["name"]] = jax.device_put(s["init"], repl)
    shardings[s["name"]] = jax.tree.map(lambda _: repl, state[s["name"]])
    steps[s["name"]] = ensemble.make_chunk_step(s["model"], tx, m.lam, m.chunk)

  def step_fn(st, data):
    new, out = {}, {}
    for name in st:
      new[name], mm = steps[name](st[name], data[name])
      prefix = "train/" if name == "main" else f"{name}/"
      out.update({f"{prefix}{k}": v for k, v in mm.items() if k != "val_mse"})
      if d.val_fraction > 0:
        out[f"eval/{'' if name == 'main' else name + '_'}val_mse"] = mm["val_mse"]
    return new, out

  data_shardings = jax.tree.map(lambda a: a.sharding, batch)
  jstep = jax.jit(step_fn, in_shardings=(shardings, data_shardings), out_shardings=(shardings, repl),
                  donate_argnums=0)
  state, summary = run_loop(config, ctx.subdir(), state, shardings, jstep, lambda step: batch,
                            num_steps=m.steps // m.chunk)
  out = {k: v for k, v in summary.items() if k not in _LOOP_ONLY}
  out["chunks"] = summary["step"]
  out["params"] = {name: jax.device_get(st["params"]) for name, st in state.items()}
  return out


# Below this validation R^2 (the model explains under a tenth of the variance the mean leaves), the run warns that
# its edges and curves say little.
MIN_VAL_R2 = 0.1


def evaluate_stage(ctx, system: dict) -> dict:
  """Evaluates one system on the parameters the train stage returned."""
  params = ctx.results["train"]["params"][system["name"]]
  out = evaluate_system(ctx.config, system, {"params": params}, ctx.workdir)
  if system["name"] == "main":
    fit = method.fit_quality(system["windows"], ctx.results["train"].get("eval/val_mse"))
    out.update(fit)
    if fit and fit["eval/val_r2"] < MIN_VAL_R2:
      logging.getLogger("jaxlab").warning(
          "navar_ice: the model's validation MSE %.3g is no better than predicting each variable's mean (%.3g; R^2 "
          "%.2f < %.1f), so its edges and curves say little; try other --config.data.lags, more data or more "
          "--config.method.steps", ctx.results["train"]["eval/val_mse"], fit["eval/val_mse_of_mean"],
          fit["eval/val_r2"], MIN_VAL_R2)
  return out


def plots_stage(ctx) -> dict:
  """response_functions.png (and heterogeneity.png) in the workdir, from the evaluation stages' .npz files."""
  if jax.process_index() == 0:
    plot_workdir(ctx.workdir)
  return {}


def summarise(results: dict) -> dict:
  """The union of the stages' results, with the number of training chunks as `step` (as a run_loop summary)."""
  out = {}
  for name, r in results.items():
    out.update({k: v for k, v in r.items() if k != "params"})
  out["step"] = out.pop("chunks")
  return out


def evaluate_system(config, s: dict, st: dict, workdir: str) -> dict:
  """Edge scores, curves, labels and checks of one system; writes its arrays to response_curves[_het].npz."""
  e = config.eval
  win, model = s["windows"], s["model"]
  train = ~win.val
  x_train = win.x[train]
  params = jax.device_get(st["params"])
  members = jax.tree.leaves(params)[0].shape[0]
  grid = ice.grids(x_train, e.lag, e.grid, tuple(e.quantiles))
  score_m, pd_m, disp0, ice0 = [], [], None, None
  for k in range(members):
    p = jax.tree.map(lambda a, k=k: a[k], params)
    score_m.append(scores.edge_scores(ensemble.contributions(model, p, x_train)))
    curves = ice.response_curves(model, p, x_train, grid, e.lag, keep_ice=e.keep_ice if k == 0 else 0)
    pd_m.append(curves["pd"])
    if k == 0:
      disp0, ice0, ref = curves["dispersion"], curves.get("ice"), curves["ref_index"]
  score_m, pd_m = np.stack(score_m), np.stack(pd_m)
  pd0 = pd_m[0]
  cpd0 = pd0 - pd0[:, :, ref:ref + 1]
  low = high = None
  if members > 1:
    low, high = ice.bands(pd_m[1:], tuple(e.band), centre=ref)
  labels, inds = method.label_all(grid, cpd0, e.flat_tol)
  name = s["name"]
  tag = "" if name == "main" else f"_{name}"
  true = np.full_like(pd0, np.nan)
  if config.data.name == "synthetic" and name == "main":
    for edge in s["meta"]["edges"]:
      true[edge[0], edge[1]] = method.true_curve(edge, grid[edge[0]], win.mean, win.std)
  np.savez(os.path.join(workdir, f"response_curves{tag}.npz"), grid=grid, pd=pd_m, dispersion=disp0,
           ice=ice0 if ice0 is not None else np.zeros(0), band_low=low if low is not None else np.zeros(0),
           band_high=high if high is not None else np.zeros(0), scores=score_m, ref_index=ref,
           variables=np.array(win.variables), truth=s["truth"] if s["truth"] is not None else np.zeros(0),
           labels=np.array(labels), true=true)
  out = {}
  if name == "main":
    out["variables"] = list(win.variables)
    out["edge_scores"] = score_m[0].tolist()
    out["windows"] = {"train": int(train.sum()), "val": int(win.val.sum()), "units": int(win.unit.max() + 1)}
    out["edges"] = method.edge_report(win.variables, score_m, grid, pd0, low, high, disp0, labels, inds, e.max_edges)
    if s["truth"] is not None:
      out["auroc"] = scores.auroc(score_m[0], s["truth"])
      if members > 1:
        out["auroc_members"] = [scores.auroc(sc, s["truth"]) for sc in score_m[1:]]
    if e.var_baseline:
      sim = s["meta"] if config.data.name == "synthetic" else None
      out.update(method.var_baseline(sim, win, train, grid, s["truth"]))
    if config.data.name == "synthetic":
      out.update(method.synthetic_checks(s["meta"], win, grid, pd0, score_m[0], labels, e.flat_tol))
  elif name == "het":
    (rs, rt, _, _), (hs, ht, _, _) = s["meta"]["edges"]
    out["het/dispersion_regime"] = float(disp0[rs, rt])
    out["het/dispersion_homog"] = float(disp0[hs, ht])
    out["het/ratio"] = float(disp0[rs, rt] / max(disp0[hs, ht], 1e-12))
    het = ice.heterogeneity(disp0, pd0)
    out["het/heterogeneity_regime"] = float(het[rs, rt])
    out["het/heterogeneity_homog"] = float(het[hs, ht])
    out["het/auroc"] = scores.auroc(score_m[0], s["truth"])
  return out


# ------------------------------------------------------------------------------------------------ plots


def plot_workdir(workdir: str) -> list[str]:
  """response_functions.png (top / true edges: PD, bands, ICE curves) and, if present, heterogeneity.png."""
  from jaxlab.plotting import plt  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  paths = []
  z = np.load(os.path.join(workdir, "response_curves.npz"))
  variables = list(z["variables"])
  truth = z["truth"]
  n = len(variables)
  score = z["scores"][0]
  if truth.size:
    edges = [(i, j) for i in range(n) for j in range(n) if truth[i, j] and i != j]
  else:
    edges = sorted(((i, j) for i in range(n) for j in range(n) if i != j), key=lambda e: -score[e])[:8]
  edges = edges[:12]
  paths.append(_curve_figure(plt, z, edges, os.path.join(workdir, "response_functions.png"),
                             "NAVAR response functions (PD, centred; band over retrainings; grey: ICE)"))
  het = os.path.join(workdir, "response_curves_het.npz")
  if os.path.exists(het):
    zh = np.load(het)
    paths.append(_curve_figure(plt, zh, [(0, 2), (1, 3)], os.path.join(workdir, "heterogeneity.png"),
                               "regime-dependent vs homogeneous edge: ICE curves"))
  return paths


def _curve_figure(plt, z, edges, path, title):
  variables = list(z["variables"])
  labels = z["labels"]
  cols = min(4, max(1, len(edges)))
  rows = (len(edges) + cols - 1) // cols
  fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False)
  ref = int(z["ref_index"])
  for ax, (i, j) in zip(axes.ravel(), edges):
    g = z["grid"][i]
    if z["ice"].size:
      for curve in z["ice"][i, j]:
        ax.plot(g, curve - curve[ref], color="0.6", lw=0.5, alpha=0.5)
    pd = z["pd"][0, i, j]
    ax.plot(g, pd - pd[ref], color="tab:blue", lw=2, label="PD")
    if z["band_low"].size:
      ax.fill_between(g, z["band_low"][i, j], z["band_high"][i, j], color="tab:blue", alpha=0.2, label="band")
    null = z["band_low"].size and method.null_in_band(z["band_low"], z["band_high"], i, j)
    ax.set_title(f"{variables[i]} -> {variables[j]}: {labels[i][j]}\nscore {z['scores'][0][i, j]:.3f}"
                 + ("  (band holds 0: not told from no effect)" if null else ""), fontsize=8,
                 color="0.45" if null else "black")
    if null:
      ax.set_facecolor("0.94")
    ax.grid(alpha=0.3)
  for ax in axes.ravel()[len(edges):]:
    ax.axis("off")
  axes[0][0].legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  from jaxlab.plotting import save  # pylint: disable=g-import-not-at-top
  return save(fig, os.path.dirname(path), os.path.basename(path), dpi=100)


def plot(runs, workdirs, out_dir):
  """Per seed: the response functions (PD vs the true function for synthetic data) and the edge-score matrix;
  and the training curves of the train stage's run_loop (navar_ice_training.png, per chunk)."""
  from jaxlab.plotting import plot_curves, plt, save  # pylint: disable=g-import-not-at-top
  paths = []
  loops = [os.path.join(wd, "stages", "train") for wd in workdirs]
  curves = plot_curves([w for w in loops if os.path.isdir(w)], ("train/loss", "train/mse", "train/l1", "het/mse"),
                       os.path.join(out_dir, "navar_ice_training.png"),
                       labels=[os.path.basename(os.path.normpath(wd)) for wd, w in zip(workdirs, loops)
                               if os.path.isdir(w)], title="NAVAR training (per chunk of full-batch steps)")
  paths += [curves] if curves else []
  rows = len(workdirs)
  fig, axes = plt.subplots(rows, 5, figsize=(17, 3.0 * rows), squeeze=False)
  for r, wd in enumerate(workdirs):
    f = os.path.join(wd, "response_curves.npz")
    if not os.path.exists(f):
      continue
    z = np.load(f)
    variables, truth, score = list(z["variables"]), z["truth"], z["scores"][0]
    n = len(variables)
    edges = [(i, j) for i in range(n) for j in range(n) if truth.size and truth[i, j] and i != j][:4]
    if not edges:
      edges = sorted(((i, j) for i in range(n) for j in range(n) if i != j), key=lambda e: -score[e])[:4]
    cfg = metrics.read_json(os.path.join(wd, "config.json"))
    synthetic = cfg["data"]["name"] == "synthetic"
    kinds = tuple(data_lib.MECHANISMS)   # the simulator's edge c has mechanism kinds[c]
    for c, (i, j) in enumerate(edges):
      ax = axes[r][c]
      g, pd = z["grid"][i], z["pd"][0, i, j]
      ax.plot(g, pd - pd.mean(), color="tab:blue", lw=2, label="NAVAR PD")
      if z["band_low"].size:
        ref = int(z["ref_index"])
        ax.fill_between(g, z["band_low"][i, j] + pd[ref] - pd.mean(), z["band_high"][i, j] + pd[ref] - pd.mean(),
                        color="tab:blue", alpha=0.2)
      if np.all(np.isfinite(z["true"][i, j])):
        t = z["true"][i, j]
        ax.plot(g, t - t.mean(), "k--", lw=1, label="true")
      if synthetic and c < len(kinds):
        run = runs[r]
        kind = kinds[c]
        ax.set_title(f"{variables[i]}->{variables[j]} ({kind}): {z['labels'][i][j]}\n"
                     f"score {score[i, j]:.3f}, nRMSE {run.get(f'nrmse/{kind}', float('nan')):.2f}", fontsize=8)
      else:
        ax.set_title(f"{variables[i]}->{variables[j]}: {z['labels'][i][j]} (score {score[i, j]:.3f})", fontsize=8)
      ax.grid(alpha=0.3)
      ax.legend(fontsize=6)
    ax = axes[r][4]
    im = ax.imshow(score, cmap="viridis")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(variables, fontsize=6, rotation=90)
    ax.set_yticklabels(variables, fontsize=6)
    ax.set_xlabel("target")
    ax.set_ylabel("source")
    auc = runs[r].get("auroc", float("nan"))
    ax.set_title(f"{os.path.basename(os.path.normpath(wd))}: edge scores (AUROC {auc:.3f})", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.046)
  path = save(fig, out_dir, "navar_ice_response.png", dpi=100)
  paths.append(path)
  return paths
