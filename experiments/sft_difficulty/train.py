"""Data difficulty in SFT: the budget x difficulty grids of the synthetic model (arm a) and of a small LM (arm b).

Launch: python -m jaxlab.main --config experiments/sft_difficulty/config.py:tiny --workdir /tmp/sft_difficulty
Expected (tiny, 2 CPU cores, ~10 s per seed): d*(n) climbs from difficulty 1 at n = 16 to the hardest level at
n >= 512; the Catoni bound's argmin jumps from 1 to 8 between n = 16 and n = 32.

The run is `jaxlab.train.run_stages`: stages "synthetic/n<n>" compute arm (a)'s grid one budget at a time (each
row's arrays go to stages/<i>_synthetic_n<n>.npz; training set r is the same draw in every row); in the small / full variants the LM arm adds "lm/pretrain" (a resumable sub-run) and
one stage per (difficulty, budget), so a resumed run recomputes only the missing cells.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import numpy as np

from jaxlab.train import run_stages

from . import lm_arm, method


def synthetic_stage(ctx, n: int) -> dict:
  """Arm (a), budget n: the row of cells (n, d = 1..L) of one seed (arrays: one value per difficulty)."""
  c = ctx.config
  row = method.run_rows(c, jax.random.fold_in(jax.random.key(c.seed), 0), [n])
  return {"n": int(n), "dstar": int(np.argmin(row["target_err"][0])) + 1,
          "dstar_bound": int(np.argmin(row["target_bound"][0])) + 1,
          "arrays": {k: row[k][0] for k in method.METRICS}}


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the enabled arms; returns the summary (the synthetic arm's claim keys and grids)."""
  stages = {}
  if config.synthetic.enabled:
    for n in config.synthetic.budgets:
      stages[f"synthetic/n{n}"] = functools.partial(synthetic_stage, n=n)
  if config.lm.enabled:
    stages[PRETRAIN] = lm_pretrain_stage
    for d in config.lm.difficulties:
      for n in config.lm.budgets:
        stages[lm_stage_name(d, n)] = functools.partial(lm_cell_stage, d=d, n=n)
  return run_stages(config, workdir, stages, summarise=lambda results: summarise(config, results))


PRETRAIN = "lm/pretrain"
_BASE: dict[str, object] = {}   # the pretrained model of this process's run, by its directory


def lm_stage_name(d: int, n: int) -> str:
  return f"lm/d{d}/n{n}"


def _base_model(ctx):
  """The LM arm's pretrained model: trained (resumably) in the pretrain stage's folder, loaded from there later."""
  path = dataclasses.replace(ctx, name=PRETRAIN).subdir()
  if path not in _BASE:
    _BASE.clear()
    _BASE[path] = lm_arm.pretrain(ctx.config.lm, ctx.config.seed, path)
  return _BASE[path]


def lm_pretrain_stage(ctx) -> dict:
  """Arm (b): pretrain the base model on easy addition (or load lm.model.hf_path) and score it."""
  return lm_arm.base_metrics(ctx.config.lm, _base_model(ctx), ctx.config.seed)


def lm_cell_stage(ctx, d: int, n: int) -> dict:
  """Arm (b), one cell: SFT a copy of the base model on n problems of difficulty d; its errors and gaps."""
  out = lm_arm.sft_cell(ctx.config.lm, _base_model(ctx), d, n, ctx.config.seed)
  return {"d": int(d), "n": int(n), **out}


def summarise(config, results) -> dict:
  """Claim keys from the stages' results: the synthetic grid (budgets x difficulties) and what it implies."""
  out = {}
  names = [f"synthetic/n{n}" for n in config.synthetic.budgets] if config.synthetic.enabled else []
  if names and all(n in results for n in names):
    grid = {k: np.stack([np.asarray(results[n]["arrays"][k]) for n in names]) for k in method.METRICS}
    out.update(method.summarise_grid(grid, config.synthetic.budgets, range(1, config.synthetic.levels + 1)))
  if config.lm.enabled:
    ds, ns = list(config.lm.difficulties), list(config.lm.budgets)
    rows = [results[lm_stage_name(d, n)] for n in ns for d in ds if lm_stage_name(d, n) in results]
    if len(rows) == len(ds) * len(ns):
      arrays = lm_arm.grid_arrays(rows, ds, ns)
      for k in ("target_err", "id_err", "train_loss", "id_loss", "target_loss", "gen_gap", "extrap_gap"):
        out[f"lm/grid/{k}"] = [[float(x) for x in row] for row in arrays[k]]
      out["lm/dstar"] = [int(x) for x in np.asarray(ds)[np.argmin(arrays["target_err"], axis=1)]]
      out["lm/difficulties"], out["lm/budgets"] = ds, ns
    if PRETRAIN in results:
      out.update({f"lm/base/{k}": v for k, v in results[PRETRAIN].items() if isinstance(v, (int, float))})
  return out


def plot(runs, workdirs, out_dir):
  """Heat maps (n x d) of the seed-mean target error and both gaps, and d*(n) with the bound's argmin."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  del workdirs
  paths = []
  if runs and "grid/target_err" in runs[0]:
    grids = {k: np.mean([np.asarray(r[f"grid/{k}"]) for r in runs], axis=0)
             for k in ("target_err", "gen_gap", "extrap_gap")}
    n_b, n_d = grids["target_err"].shape
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.9))
    titles = {"target_err": "target excess error", "gen_gap": "generalisation gap", "extrap_gap": "extrapolation gap"}
    dstar = np.argmin(grids["target_err"], axis=1)
    for ax, (k, g) in zip(axes, grids.items()):
      im = ax.imshow(np.log10(np.maximum(g, 1e-4)), aspect="auto", origin="lower", cmap="viridis")
      for i in range(n_b):
        for j in range(n_d):
          ax.text(j, i, f"{g[i, j] if abs(g[i, j]) > 1e-6 else 0:.2g}", ha="center", va="center", fontsize=6, color="w")
      if k == "target_err":
        ax.plot(dstar, np.arange(n_b), "r*", markersize=9, label="d*(n)")
        ax.legend(loc="upper left", fontsize=7)
      ax.set_xticks(range(n_d), [str(d) for d in range(1, n_d + 1)])
      ax.set_yticks(range(n_b), [str(n) for n in _budgets(runs[0], n_b)])
      ax.set_xlabel("difficulty d (highest frequency)")
      ax.set_ylabel("budget n")
      ax.set_title(titles[k] + " (log10 colour)", fontsize=9)
      fig.colorbar(im, ax=ax, fraction=0.046)
    ax = axes[3]
    budgets = _budgets(runs[0], n_b)
    for r in runs:
      ax.plot(budgets, r["dstar"], color="C0", alpha=0.35, marker="o", ms=3)
      ax.plot(budgets, r["dstar_bound"], color="C3", alpha=0.35, marker="s", ms=3, ls="--")
    ax.plot([], [], color="C0", marker="o", label="measured d*(n) (per seed)")
    ax.plot([], [], color="C3", marker="s", ls="--", label="Catoni bound's argmin (per seed)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("budget n")
    ax.set_ylabel("optimal difficulty")
    ax.legend(fontsize=7)
    ax.set_title("optimal difficulty vs budget", fontsize=9)
    fig.suptitle("SFT difficulty, synthetic arm: seed means of the n x d grid")
    fig.tight_layout()
    paths.append(save(fig, out_dir, "sft_difficulty_grid.png"))
  if runs and "lm/grid/target_err" in runs[0]:
    ds, ns = runs[0]["lm/difficulties"], runs[0]["lm/budgets"]
    arrays = {k: np.mean([np.asarray(r[f"lm/grid/{k}"]) for r in runs], axis=0)
              for k in ("target_err", "target_loss", "gen_gap", "extrap_gap")}
    titles = {"target_err": "LM arm: target-mix error (1 - exact match)",
              "target_loss": "LM arm: target-mix NLL per token",
              "gen_gap": "LM arm: generalisation gap (ID - train NLL)",
              "extrap_gap": "LM arm: extrapolation gap (target - ID NLL)"}
    for k, title in titles.items():
      paths.append(lm_arm.heatmap(arrays, ds, ns, k, os.path.join(out_dir, f"sft_difficulty_lm_{k}.png"), title))
  return paths


def _budgets(summary, count):
  return summary.get("budgets", [16 * 2 ** i for i in range(count)])
