"""Diffusion on unions of subspaces: W1 of generated samples vs the number of training samples n.

Launch: python -m jaxlab.main --config experiments/diffusion_subspaces/config.py:tiny --workdir /tmp/dsub
Expected (tiny, 2 CPU cores, ~20 s per seed): the log-log slope of W1(generated, fresh) vs n is about -1/3
for k = 3 whether D = 32 (M = 3 subspaces) or D = 3, about -1/8 for full-rank D = 8; generated W1 stays within
~1.2x of the training set's own W1, and the samples lie on the union with balanced modes.

The run is `jaxlab.train.run_stages` with one stage per (score, setting, n), named like "kde/D32_k3_M3@128"
(scores, then settings, then ns; resumable, one checkpoint per stage): draw the stage's data
(method.stage_data), sample n points by the reverse process with the score (closed-form KDE score, or a
DSM-trained MLP when learned.enabled), measure (method.stage_metrics) and return them as the stage's results
(one metrics.jsonl row each). The summary, written once at the end, fits the log-log slopes (scipy
linregress, 95% interval) per score and setting from the stages' results.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from jaxlab import metrics
from jaxlab.diffusion import metrics as dmetrics
from jaxlab.train import run_stages

from . import config as config_lib  # noqa: E402  (relative: works for installed and path-loaded experiments)
from . import method

FIELDS = ("w1_gen", "w1_train", "sw1_gen", "sw1_train", "union_dist", "freq_dev", "w1_ratio")


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages and returns the summary (slope/<score>/<setting>, w1_ratio_max/<score>, union_dist/...)."""
  plan = config_lib.stages(config)
  stages = {config_lib.stage_name(config, p): functools.partial(run_stage, plan=p) for p in plan}
  return run_stages(config, workdir, stages,
                    summarise=lambda results: summarise([results[name] for name in stages], config))


def run_stage(ctx, plan: tuple[str, int, int]) -> dict:
  """One (score, setting, n): sample n points with the score and measure them (keys <score>/<setting>/<field>)."""
  config = ctx.config
  score, si, nj = plan
  st = method.stage_data(config, si, nj)
  row = {"n": float(st["n"])}
  if score == "kde":
    gen = method.generate_kde(config, st)
  else:
    gen, loss = method.generate_dsm(config, st)
    row["dsm/loss"] = loss
  name = config_lib.setting_name(config.data.settings[si])
  row.update({f"{score}/{name}/{k}": v for k, v in method.stage_metrics(config, st, gen).items()})
  return row


def curves(rows, score: str, name: str) -> dict[str, np.ndarray]:
  """{"n": (len(ns),), field: (len(ns),)} for one score and setting, from the stage results (or metrics rows)."""
  pts = sorted((r["n"], r) for r in rows if f"{score}/{name}/w1_gen" in r)
  out = {"n": np.array([p[0] for p in pts])}
  for f in FIELDS:
    out[f] = np.array([p[1][f"{score}/{name}/{f}"] for p in pts])
  return out


def summarise(rows, config) -> dict:
  """From the stages' results (or metrics rows), in stage order: slopes with 95% intervals, worst W1 ratio, union closeness at the largest n, per score and setting."""
  out = {}
  scores = sorted({s for s, _, _ in config_lib.stages(config)})
  for score in scores:
    ratios = []
    for setting in config.data.settings:
      name = config_lib.setting_name(setting)
      c = curves(rows, score, name)
      if len(c["n"]) < 2:
        continue
      fit = dmetrics.loglog_slope(c["n"], c["w1_gen"])
      out[f"slope/{score}/{name}"] = fit["slope"]
      if len(c["n"]) >= 3:  # a confidence interval needs a residual degree of freedom
        out[f"slope_ci/{score}/{name}"] = [fit["lo"], fit["hi"]]
      out[f"slope_sw1/{score}/{name}"] = dmetrics.loglog_slope(c["n"], c["sw1_gen"])["slope"]
      if score == "kde":
        out[f"slope_train/{name}"] = dmetrics.loglog_slope(c["n"], c["w1_train"])["slope"]
      for n, g, t in zip(c["n"], c["w1_gen"], c["w1_train"]):
        out[f"w1_gen/{score}/{name}@{int(n)}"] = float(g)
        out[f"w1_train/{name}@{int(n)}"] = float(t)
      out[f"union_dist/{score}/{name}"] = float(c["union_dist"][-1])
      out[f"freq_dev/{score}/{name}"] = float(c["freq_dev"][-1])
      ratios.extend(c["w1_ratio"].tolist())
    if ratios:
      out[f"w1_ratio_max/{score}"] = float(np.max(ratios))
  return out


def plot(runs, workdirs, out_dir):
  """W1 (top) and sliced W1 (bottom) vs n, log-log, per setting: generated (KDE, DSM), training-set baseline,
  and the predicted slope -1/max(k, 2) (W1) / -1/2 (sliced W1) anchored at the baseline's first point."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  rows = [metrics.read_metrics(w) for w in workdirs]
  cfg = metrics.read_json(os.path.join(workdirs[0], "config.json"))
  settings = [tuple(s) for s in cfg["data"]["settings"]][:8]
  fig, axes = plt.subplots(2, len(settings), figsize=(4.2 * len(settings), 7), squeeze=False)
  for col, setting in enumerate(settings):
    name = config_lib.setting_name(setting)
    k = int(setting[1])
    for row_i, (gen_f, train_f, pred) in enumerate((("w1_gen", "w1_train", -1.0 / max(k, 2)),
                                                    ("sw1_gen", "sw1_train", -0.5))):
      ax = axes[row_i, col]
      ns = None
      for score, color in (("kde", "tab:blue"), ("dsm", "tab:orange")):
        cs = [curves(r, score, name) for r in rows]
        cs = [c for c in cs if len(c["n"])]
        if not cs:
          continue
        ns = cs[0]["n"]
        g = np.array([c[gen_f] for c in cs])
        ax.errorbar(ns, g.mean(0), yerr=g.std(0), marker="o", color=color, capsize=3, label=f"generated ({score})")
        if score == "kde":
          t = np.array([c[train_f] for c in cs])
          ax.errorbar(ns, t.mean(0), yerr=t.std(0), marker="s", ls="--", color="gray", capsize=3,
                      label="training set")
          ax.plot(ns, t.mean(0)[0] * (ns / ns[0]) ** pred, "k:", label=f"slope {pred:.3g}")
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_xlabel("n (training samples)")
      ax.set_ylabel("W1 to fresh samples" if row_i == 0 else "sliced W1")
      ax.set_title(f"{name}" + (f": slope {np.mean([r.get(f'slope/kde/{name}', np.nan) for r in runs]):.3f}"
                                if row_i == 0 else ""))
      ax.grid(alpha=0.3, which="both")
      if col == 0:
        ax.legend(fontsize=7)
  path = save(fig, out_dir, "diffusion_subspaces_w1.png")
  return [path]
