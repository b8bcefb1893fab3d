"""MoE calibration experiment: the routing theory (hard vs soft routing of calibrated experts) under two shifts.

Launch: python -m jaxlab.main --config experiments/moe_calibration/config.py:tiny --workdir /tmp/moe_calibration

Stages (`jaxlab.train.run_stages`, resumable):
* "data": the world (seeded), train / validation sets from the source, and one test set per shift
  (S0 source, S1 region prior, S2 boundary) of `data.test_size` points each.
* "theory": fits the hard, soft and aggregate-only arms (`method.fit_theory`) and reports each arm's top-label
  ECE with its bootstrap interval and accuracy on every shift, plus the oracle (the true P(y | x): the floor).

* "robust" (unless `robust.enabled` is false): the paper's training pipeline on the overfitting world
  (`training.py`): vanilla, MoCaE, Robust MoE, Robust Filtered and the w == 1 ablation of the filter, each also
  with per-expert temperature scaling ("+ts"), evaluated like the theory arms.

summary.json: "<arm>/<shift>/{ece, ece_lo, ece_hi, acc}" for arm in hard | soft | soft_global_ts | oracle and
the trained arms vanilla | mocae | robust | robust_ts | filtered | filtered_ts | filtered_w1 | filtered_w1_ts.
"""

from __future__ import annotations

import os

import numpy as np

from jaxlab import progress
from jaxlab.train import run_stages
from jaxlab.train import stages as stages_lib

from . import method, training


def _world(config) -> method.World:
  d = config.data
  return method.make_world(config.seed, d.sep, d.slope, d.offset)


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages; returns the summary ("<arm>/<shift>/<stat>")."""
  stages = {"data": data_stage, "theory": theory_stage}
  if config.robust.enabled:
    stages["robust"] = robust_stage
  return run_stages(config, workdir, stages)


def _draw(config) -> tuple[dict, dict, dict]:
  """(train, val, {shift: test}) of this run's seed; deterministic, so stages redraw instead of storing them."""
  d = config.data
  world = _world(config)
  rng = np.random.default_rng([config.seed, 1])
  draw = method.draw_source(world)
  train, val = draw(rng, d.train_size), draw(rng, d.val_size)
  tests = {s: method.draw_shift(world, rng, s, d.test_size, d.region_prior) for s in method.SHIFTS}
  return train, val, tests


def data_stage(ctx) -> dict:
  train, val, tests = _draw(ctx.config)
  out = {"train/size": len(train["y"]), "train/positive_rate": float(np.mean(train["y"]))}
  for s, t in tests.items():
    out[f"test/{s}/size"] = len(t["y"])
    out[f"test/{s}/positive_rate"] = float(np.mean(t["y"]))
    if "accept_rate" in t:
      out[f"test/{s}/accept_rate"] = float(t["accept_rate"])
  return out


def theory_stage(ctx) -> dict:
  config = ctx.config
  world = _world(config)
  train, val, tests = _draw(config)
  arms = method.fit_theory(world, train, val)
  out, rel = method.evaluate_theory(world, arms, tests, ctx.key(), config.eval.n_bins, config.eval.n_boot)
  out.update({f"temperature/hard/{k}": float(t) for k, t in enumerate(arms.t_hard)})
  out.update({f"temperature/soft/{k}": float(t) for k, t in enumerate(arms.t_soft)})
  out["temperature/soft_global_ts"] = float(arms.t_global)
  out["reliability"] = rel          # arrays: stages/001_theory.npz (the reliability diagrams)
  return out


def robust_world(config) -> method.World:
  d, r = config.data, config.robust
  return method.make_world(config.seed, d.sep, r.slope, d.offset, r.noise_dims)


def draw_robust(config, seed_offset: int = 2) -> tuple[dict, dict, dict]:
  """(train, val, {shift: test}) of the overfitting world of this run's seed."""
  d, r = config.data, config.robust
  world = robust_world(config)
  rng = np.random.default_rng([config.seed, seed_offset])
  draw = method.draw_source(world)
  train, val = draw(rng, r.train_size), draw(rng, r.val_size)
  return train, val, {s: method.draw_shift(world, rng, s, r.test_size, d.region_prior) for s in method.SHIFTS}


def robust_stage(ctx) -> dict:
  config = ctx.config
  train, val, tests = draw_robust(config)
  trainer = training.Trainer(train["x"].shape[1], config.robust)
  with progress.bar(total=5, desc="robust arms") as bar:
    params = trainer.train_arms(train["x"][None], train["y"][None], [config.seed],
                                progress=lambda _: bar.update(1))
  probs, temps = training.arm_probs(trainer, params, val, tests)
  out, rel = method.evaluate_probs(probs, tests, ctx.key(), config.eval.n_bins, config.eval.n_boot)
  out.update({f"temperature/{a}/{k}": float(t) for a, ts in temps.items() for k, t in enumerate(ts)})
  for arm in ("vanilla", "robust"):     # what the tilt sees at the end of training (README: why it barely acts)
    diag = training.tilt_diagnostics(trainer, params[arm], train["x"][None], train["y"][None], config.robust.eta,
                                     seed=config.seed)[0]
    out.update({f"{arm}/train/{k}": v for k, v in diag.items()})
  out["reliability"] = rel
  return out


def reliability_data(workdir: str, stage: str = "theory") -> dict:
  """{"<arm>/<shift>": {"edges", "share", "conf", "acc"}} saved by the theory (or robust) stage."""
  index = {"theory": 1, "robust": 2}[stage]
  return stages_lib.stage_arrays(workdir, index, stage).get("reliability", {})


def _reliability_grid(plt, rel, runs, arms, title):
  shifts_ = method.SHIFTS
  fig, axes = plt.subplots(len(arms), len(shifts_), figsize=(3.2 * len(shifts_), 3.0 * len(arms)), squeeze=False)
  for i, a in enumerate(arms):
    for j, s in enumerate(shifts_):
      ax, r = axes[i, j], rel.get(f"{a}/{s}")
      ax.plot([0, 1], [0, 1], ":", color="gray")
      if r is not None:
        mid = (r["edges"][:-1] + r["edges"][1:]) / 2
        ok = np.isfinite(r["acc"])
        ax.bar(mid[ok], r["acc"][ok] - r["conf"][ok], bottom=r["conf"][ok], width=1 / len(mid),
               color="tab:red", alpha=0.35, label="gap")
        ax.plot(r["conf"][ok], r["acc"][ok], "o-", ms=3, color="tab:blue", label="accuracy")
      ece = runs[0].get(f"{a}/{s}/ece")
      ax.set_title(f"{a}, {s}" + (f": ECE {ece:.4f}" if ece is not None else ""), fontsize=9)
      ax.set_xlim(0.45, 1.0)
      ax.set_ylim(0.45, 1.0)
      if i == len(arms) - 1:
        ax.set_xlabel("confidence")
      if j == 0:
        ax.set_ylabel("accuracy")
  fig.suptitle(title)
  return fig


def _ece_bars(plt, runs, arms, title):
  shifts_ = method.SHIFTS
  fig, ax = plt.subplots(figsize=(max(6.5, 1.1 * len(arms) + 2), 4))
  x = np.arange(len(shifts_))
  width = 0.8 / len(arms)
  for i, a in enumerate(arms):
    vals = np.array([[r.get(f"{a}/{s}/ece", np.nan) for s in shifts_] for r in runs])
    ax.bar(x + (i - (len(arms) - 1) / 2) * width, vals.mean(0), width=width, label=a,
           yerr=vals.std(0, ddof=1) if len(runs) > 1 else None, capsize=3)
  ax.set_xticks(x, ["S0 source", "S1 region prior", "S2 boundary"])
  ax.set_ylabel("top-label ECE (15 bins)")
  ax.set_title(title)
  ax.legend(fontsize=8)
  return fig


def plot(runs, workdirs, out_dir):
  """Reliability diagrams (first seed) per arm and shift, and ECE per shift per arm (mean over seeds): the theory
  arms, and the trained arms when the robust stage ran."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  run_name = os.path.basename(os.path.normpath(workdirs[0]))
  paths = []
  groups = [("theory", method.THEORY_ARMS, "tiny"),
            ("robust", ("vanilla", "mocae", "robust", "filtered", "filtered_w1"), "trained_tiny")]
  for stage, arms, suffix in groups:
    if not any(f"{arms[0]}/S0/ece" in r for r in runs):
      continue
    rel = reliability_data(workdirs[0], stage)
    if rel:
      fig = _reliability_grid(plt, rel, runs, arms, f"reliability diagrams ({run_name}; 15 bins; red: accuracy - "
                              "confidence)")
      paths.append(save(fig, out_dir, f"reliability_{suffix}.png"))
    shown = arms if stage == "theory" else training.REPORTED_ARMS
    paths.append(save(_ece_bars(plt, runs, shown, f"ECE per shift (mean over {len(runs)} seeds)"), out_dir,
                      f"ece_{suffix}.png"))
  return paths
