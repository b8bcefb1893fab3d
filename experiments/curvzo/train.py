"""CurvZO experiment: estimator studies on quadratics, the ZO optimizer race, digits and LM fine-tuning.

Launch: python -m jaxlab.main --config experiments/curvzo/config.py:tiny --workdir /tmp/curvzo
Expected (tiny, 2 CPU cores, about a minute per seed): MeZO's projected gradient matches z . grad f to ~1e-13
(float64); the HT mean over 20k keys is within ~3% of grad f; pi ~ sqrt(F) beats uniform and pi ~ F by > 10%
in Prop. 3.3's setting; CurvZO (ht=False) ends the block-sparse race well below MeZO.

Tiny / small (`config.task.kind = "quadratic"`): a sequence of stages driven by `jaxlab.train.run_loop`
(resumable, one checkpoint per stage): "exact", "unbiased", "variance", one "race/<method>" stage per
optimizer (lr grid on a validation instance, final loss on the test instance) and, in `small`, one
"digits/<method>" stage per optimizer. Full (`"lm"`): ZO fine-tuning of a decoder LM on a TFDS task
(`experiments/curvzo/lm_task.py`).
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import configs, metrics
from jaxlab import mesh as mesh_lib
from jaxlab.train import run_loop

from . import config as config_lib  # noqa: E402  (relative: works for installed and path-loaded experiments)
from . import method


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the variant; returns the summary (the claim keys for tiny, see config.CLAIMS)."""
  config_lib.validate(config)
  configs.validate(config, num_devices=jax.device_count())
  if config.task.kind == "lm":
    from . import lm_task  # pylint: disable=g-import-not-at-top
    return lm_task.train_and_evaluate(config, workdir)
  mesh = mesh_lib.make_mesh(config.mesh)
  names = config_lib.stages(config)
  m = config.method
  repl = NamedSharding(mesh, P())
  state = {"stages_done": jax.device_put(jnp.zeros((), jnp.int32), repl)}
  shardings = {"stages_done": repl}
  r = config.race
  instances = (method.block_sparse_instance(10_000 + config.seed, r.d, r.blocks, r.relevant),   # validation
               method.block_sparse_instance(config.seed, r.d, r.blocks, r.relevant))            # test

  def step_fn(state, stage):
    name = names[stage]
    if name == "exact":
      out = method.exactness(config.seed, config.exact.d, config.exact.n_keys, m.eps)
    elif name == "unbiased":
      u = config.unbiased
      out = method.ht_unbiasedness(config.seed, u.d, u.blocks, u.n_keys, u.density, u.pmin, m.eps, mesh)
    elif name == "variance":
      v = config.variance
      out = method.variance_study(config.seed, v.d, v.blocks, v.n_keys, v.density, v.sigma, v.chunk, mesh)
    elif name.startswith("race/"):
      opt = name.split("/")[1]
      res = method.race(opt, m, config.seed, instances, tuple(r.lrs), r.steps, r.log_every, r.repeats,
                        r.val_repeats, mesh)
      _write_curve(workdir, name, res["curve"], r.log_every)
      out = {f"{name}/final": res["test_final"], f"{name}/final_std": res["test_std"], f"{name}/val": res["val_final"],
             f"{name}/lr": res["lr"]}
    else:
      from . import digits  # pylint: disable=g-import-not-at-top
      opt = name.split("/")[1]
      res = digits.finetune(opt, config, mesh)
      out = {f"{name}/{k}": v for k, v in res.items()}
    return {"stages_done": state["stages_done"] + 1}, {"stage": stage, **out}

  run_loop(config, workdir, state, shardings, step_fn, lambda s: s)
  summary = summarise(metrics.read_metrics(workdir))
  if "race/curvzo/final" in summary and "race/mezo/final" in summary:
    summary["race/curvzo_over_mezo"] = summary["race/curvzo/final"] / summary["race/mezo/final"]
  metrics.write_json(os.path.join(workdir, "summary.json"), summary)
  return summary


def summarise(rows) -> dict:
  """The stage rows merged into one dict (the claim keys)."""
  out = {}
  for row in rows:
    out.update({k: v for k, v in row.items() if k not in ("step", "stage", "train/steps_per_sec")})
  return out


def _write_curve(workdir: str, name: str, curve, log_every: int) -> None:
  if metrics.is_main_process():
    path = os.path.join(workdir, "curves.json")
    data = json.load(open(path)) if os.path.exists(path) else {}
    data[name] = {"forward_passes": [2 * log_every * (i + 1) for i in range(len(curve))], "loss_ratio": curve}
    with open(path, "w") as f:
      json.dump(data, f)


def plot(runs, workdirs, out_dir):
  """Race curves (f / f0 vs forward passes, mean over seeds) and the variance study."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
  curves = [json.load(open(os.path.join(w, "curves.json"))) for w in workdirs
            if os.path.exists(os.path.join(w, "curves.json"))]
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
