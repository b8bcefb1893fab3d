"""CurvZO experiment: estimator studies on quadratics, the ZO optimizer race, digits and LM fine-tuning.

Launch: python -m jaxlab.main --config experiments/curvzo/config.py:tiny --workdir /tmp/curvzo
Expected (tiny, 2 CPU cores, about a minute per seed): MeZO's projected gradient matches z . grad f to ~1e-13
(float64); the HT mean over 20k keys is within ~3% of grad f; pi ~ sqrt(F) beats uniform and pi ~ F by > 10%
in Prop. 3.3's setting; CurvZO (ht=False) ends the block-sparse race well below MeZO.

Tiny / small (`config.task.kind = "quadratic"`): stages run by `jaxlab.train.run_stages` (resumable, each
stage recorded and checkpointed once): "exact", "unbiased", "variance", one "race/<method>" stage per optimizer
(lr grid on a validation instance, final loss on the test instance; its f / f0 curve is saved with the stage,
`race_curves`) and, in `small`, one "digits/<method>" stage per optimizer. Full (`"lm"`): ZO fine-tuning of a
decoder LM on a TFDS task, a `jaxlab.train.run_loop` (`experiments/curvzo/lm_task.py`).
"""

from __future__ import annotations

import functools

import numpy as np

from jaxlab.train import run_stages, stage_arrays, union

from . import config as config_lib  # noqa: E402  (relative: works for installed and path-loaded experiments)
from . import method


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the variant; returns the summary (the claim keys for tiny, see config.CLAIMS)."""
  if config.task.kind == "lm":
    from . import lm_task  # pylint: disable=g-import-not-at-top
    return lm_task.train_and_evaluate(config, workdir)
  r = config.race
  instances = (method.block_sparse_instance(10_000 + config.seed, r.d, r.blocks, r.relevant),   # validation
               method.block_sparse_instance(config.seed, r.d, r.blocks, r.relevant))            # test
  fns = {"exact": exact_stage, "unbiased": unbiased_stage, "variance": variance_stage}
  stages = {}
  for name in config_lib.stages(config):
    kind, _, opt = name.partition("/")
    if kind == "race":
      stages[name] = functools.partial(race_stage, opt=opt, instances=instances)
    elif kind == "digits":
      stages[name] = functools.partial(digits_stage, opt=opt)
    else:
      stages[name] = fns[kind]
  return run_stages(config, workdir, stages, summarise=summarise)


def exact_stage(ctx) -> dict:
  c = ctx.config
  return method.exactness(c.seed, c.exact.d, c.exact.n_keys, c.method.eps)


def unbiased_stage(ctx) -> dict:
  c, u = ctx.config, ctx.config.unbiased
  return method.ht_unbiasedness(c.seed, u.d, u.blocks, u.n_keys, u.density, u.pmin, c.method.eps, ctx.mesh)


def variance_stage(ctx) -> dict:
  c, v = ctx.config, ctx.config.variance
  return method.variance_study(c.seed, v.d, v.blocks, v.n_keys, v.density, v.sigma, v.chunk, ctx.mesh)


def race_stage(ctx, opt: str, instances) -> dict:
  """One optimizer's race: the claim keys `race/<opt>/{final, final_std, val, lr}` and its test curve."""
  c, r = ctx.config, ctx.config.race
  res = method.race(opt, c.method, c.seed, instances, tuple(r.lrs), r.steps, r.log_every, r.repeats,
                    r.val_repeats, ctx.mesh)
  name = ctx.name
  return {f"{name}/final": res["test_final"], f"{name}/final_std": res["test_std"], f"{name}/val": res["val_final"],
          f"{name}/lr": res["lr"],
          # arrays: saved with the stage (workdir/stages/<i>_race_<opt>.npz), read back by `race_curves`
          "forward_passes": np.array([2 * r.log_every * (i + 1) for i in range(len(res["curve"]))], np.int64),
          "loss_ratio": np.array(res["curve"], np.float64)}


def digits_stage(ctx, opt: str) -> dict:
  from . import digits  # pylint: disable=g-import-not-at-top
  res = digits.finetune(opt, ctx.config, ctx.mesh)
  return {f"{ctx.name}/{k}": v for k, v in res.items()}


def summarise(results) -> dict:
  """The stages' scalar results merged into one dict (the claim keys) plus the CurvZO / MeZO race ratio."""
  out = union(results)
  if "race/curvzo/final" in out and "race/mezo/final" in out:
    out["race/curvzo_over_mezo"] = out["race/curvzo/final"] / out["race/mezo/final"]
  return out


def race_curves(workdir: str, stages: list[str]) -> dict:
  """{"race/<opt>": {"forward_passes", "loss_ratio"}} of a finished run (`stages`: its summary's "stages")."""
  out = {}
  for i, name in enumerate(stages):
    if name.startswith("race/"):
      arrays = stage_arrays(workdir, i, name)
      if arrays:
        out[name] = {"forward_passes": arrays["forward_passes"], "loss_ratio": arrays["loss_ratio"]}
  return out


def plot(runs, workdirs, out_dir):
  """Race curves (f / f0 vs forward passes, mean over seeds) and the variance study."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
  curves = [race_curves(w, r.get("stages", [])) for r, w in zip(runs, workdirs)]
  colors = {"mezo": "tab:red", "sparse": "tab:orange", "curvzo": "tab:blue", "curvzo_ht": "tab:purple"}
  for opt, color in colors.items():
    key = f"race/{opt}"
    got = [c[key] for c in curves if key in c]
    if not got:
      continue
    y = np.mean([g["loss_ratio"] for g in got], axis=0)
    lr = np.mean([r.get(f"{key}/lr", np.nan) for r in runs])
    axes[0].plot(got[0]["forward_passes"], y, color=color, label=f"{opt} (lr ~{lr:.2g})")
  axes[0].set_yscale("log")
  axes[0].set_xlabel("forward passes")
  axes[0].set_ylabel("f / f0 (mean over seeds)")
  axes[0].set_title("block-sparse quadratic (d = 2000, 3 of 100 blocks)")
  axes[0].legend(fontsize=8)
  rules = ("sqrt", "uniform", "linear")
  if runs and all(f"var/{a}_emp" in runs[0] for a in rules):
    x = np.arange(3)
    emp = [np.mean([r[f"var/{a}_emp"] for r in runs]) for a in rules]
    closed = [np.mean([r[f"var/{a}_closed"] for r in runs]) for a in rules]
    shared = [np.mean([r[f"var/{a}_shared_emp"] for r in runs]) for a in rules]
    axes[1].bar(x - 0.27, emp, 0.27, label="fixed F: empirical")
    axes[1].bar(x, closed, 0.27, label="fixed F: closed form")
    axes[1].bar(x + 0.27, shared, 0.27, label="shared Delta (CurvZO): empirical")
    axes[1].set_xticks(x, ["pi ~ sqrt(F)", "uniform", "pi ~ F"])
    axes[1].set_yscale("log")
    axes[1].set_ylabel("total variance of the HT estimator")
    axes[1].legend(fontsize=8)
  path = save(fig, out_dir, "curvzo.png")
  return [path]
