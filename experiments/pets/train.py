"""PETS experiment: self-consistency rate vs budget for uniform, offline OKG and online bucketed allocation.

Launch: python -m jaxlab.main --config experiments/pets/config.py:tiny --workdir /tmp/pets
Expected (tiny, 2 CPU cores, about a minute per seed): OKG at an average budget of 16 is at least as
self-consistent as uniform allocation at 32 and beats it by >= 0.03 on average at budgets 4 and 8; OKG and the
online policy reach perfect self-consistency (SC = 1) with less budget than uniform allocation; the online
policy at average budget 16 spends <= 16 answers per question.

Stages (`jaxlab.train.run_stages`, resumable, one checkpoint per stage): `offline@B<b>` for each entry of
method.budgets (tiny: every budget 1..64) runs the OKG allocator on to an average of b answers per question and
scores OKG and uniform allocation at that budget; the carried state (the Dirichlet posteriors, votes, pool
pointers and cached gains, sharded over questions on the "data" mesh axis) continues from one budget to the
next. `online` (when online.enabled) calibrates the online policy on the first online.train_size questions and
sweeps its average budget (tiny: 4..64 in steps of 1, as the official online script) on the rest. summary.json
holds flat keys `sc_rate/{uniform,offline,online,online_unguarded,uniform_test}/B{budget}` (+ `acc/...`
against gold answers when known), the budget savings at SC = 1 (`method.budget_savings`) and the pools' sizes.
The budget-saving table (`method.saving_table`) is logged at the end of a run and, over all seeds, printed and
written to `budget_saving.md` by `plot` (so `python -m jaxlab.reproduce pets --variant full ...` prints it for
a user's pools).
"""

from __future__ import annotations

import functools
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import mesh as mesh_lib
from jaxlab.train import run_stages

from . import method

log = logging.getLogger("jaxlab")


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages and returns the summary."""
  root = jax.random.key(config.seed)
  data = method.load_pools(config, jax.random.fold_in(root, 3))
  with mesh_lib.use_config(config) as mesh:
    padded = method.pad_questions(data, mesh.shape["data"])
    qsh = NamedSharding(mesh, P("data"))
    repl = mesh_lib.replicated(mesh)
    alloc = method.allocator(config, data["num_options"])
    okg_key = jax.random.fold_in(root, 1)
    order = method.draw_order(padded, jax.random.fold_in(root, 2))
    dev = {k: jax.device_put(jnp.asarray(v), qsh) for k, v in order.items()}
    shardings = {"alpha": qsh, "votes": qsh, "first": qsh, "ptr": qsh, "gain": qsh, "draws": repl}
    state = jax.device_put(alloc.init(okg_key, dev["answers"], dev["lengths"], dev["conf"]), shardings)
    k_real = data["answers"].shape[0]
    real = jax.device_put(jnp.arange(padded["answers"].shape[0]) < k_real, qsh)
    labels = jax.device_put(jnp.asarray(padded["labels"]), qsh)
    gold = jax.device_put(jnp.asarray(padded["gold"]), qsh)
    has_gold = bool((data["gold"] != -1).any())
    pools_dev = jax.device_put(jnp.asarray(padded["answers"]), qsh)
    conf_dev = jax.device_put(jnp.asarray(padded["conf"]), qsh) if config.method.weighted else None

    def offline(ctx, budget):
      """OKG continues to an average of `budget` answers per question; OKG and uniform scored there."""
      need = k_real * budget - int(ctx.state["draws"])
      ctx.state = jax.device_put(alloc.allocate(ctx.state, okg_key, dev["answers"], dev["lengths"], max(need, 0),
                                                dev["conf"]), shardings)
      pred_o = alloc.predict(ctx.state)
      pred_u = method.uniform_predictions(config, pools_dev, conf_dev, budget, data["num_options"])
      out = {"budget": budget, "offline/spent": int(ctx.state["draws"]) / k_real,
             "sc_rate/offline": method.rate(pred_o, labels, real), "sc_rate/uniform": method.rate(pred_u, labels, real)}
      if has_gold:
        out.update({"acc/offline": method.rate(pred_o, gold, real), "acc/uniform": method.rate(pred_u, gold, real)})
      return out

    stages = {f"offline@B{b}": functools.partial(offline, budget=b) for b in config.method.budgets}
    if config.online.enabled:
      stages["online"] = lambda ctx: method.online_metrics(config, data)
    extra = dict(num_questions=k_real, num_options=int(data["num_options"]), max_pool=int(data["lengths"].max()),
                 skipped_answers=int(data["skipped_answers"]))
    summary = run_stages(config, workdir, stages, state=state, shardings=shardings,
                         summarise=functools.partial(summarise, config=config), extra_summary=extra)
  log.info("budget saving (%s, seed %d):\n%s", config.variant, config.seed,
           method.saving_table([summary], [f"seed {config.seed}"]))
  return summary


def summarise(results, config) -> dict:
  """Flat `sc_rate/<kind>/B<budget>` keys (from the offline stages' results), online extras, budget savings
  (`method.budget_savings`: OKG over uniform on all questions; online, with and without the ledger, over
  uniform on the test split)."""
  out = {}
  for name, r in results.items():
    if name.startswith("offline@"):
      b = int(r["budget"])
      for k, v in r.items():
        if k.startswith(("sc_rate/", "acc/", "offline/")):
          out[f"{k}/B{b}"] = v
    else:
      out.update(r)
  out.update(method.budget_savings(out, "offline", "uniform", list(config.method.budgets), "offline/spent"))
  if config.online.enabled:
    ob = list(config.online.budgets)
    out.update(method.budget_savings(out, "online", "uniform_test", ob, "budget/online_spent"))
    out.update(method.budget_savings(out, "online_unguarded", "uniform_test", ob, "budget/online_unguarded_spent"))
  return out


def plot(runs, workdirs, out_dir):
  """SC rate vs budget (mean, band: +-1 s.d. over runs): offline OKG vs uniform, online vs uniform (test split),
  online spend vs target.

  Also prints the budget-saving table over the runs and writes it to `out_dir/budget_saving.md`.
  """
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)

  labels = [os.path.basename(os.path.normpath(w)) for w in workdirs]
  table = method.saving_table(runs, labels)
  print(f"PETS budget saving at perfect self-consistency ({len(runs)} runs):\n{table}", flush=True)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "budget_saving.md"), "w") as f:
    f.write(table + "\n")

  def curve(kind):
    pts = {}
    for r in runs:
      for k, v in r.items():
        if k.startswith(f"sc_rate/{kind}/B") and v is not None:
          pts.setdefault(int(k.rsplit("B", 1)[1]), []).append(v)
    bs = sorted(pts)
    return np.array(bs), np.array([np.mean(pts[b]) for b in bs]), np.array([np.std(pts[b]) for b in bs])

  fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
  panels = ((axes[0], (("uniform", "tab:gray", "uniform"), ("offline", "tab:blue", "PETS offline (OKG)")),
             "offline: all questions"),
            (axes[1], (("uniform_test", "tab:gray", "uniform"), ("online", "tab:orange", "PETS online"),
                       ("online_unguarded", "tab:green", "online, no ledger")), "online: test split"))
  for ax, series, title in panels:
    for kind, color, label in series:
      b, mu, sd = curve(kind)
      if len(b):
        ax.plot(b, mu, marker="o" if len(b) <= 16 else None, ms=4, color=color, label=label,
                ls="--" if kind == "online_unguarded" else "-")
        if len(runs) > 1 and kind != "online_unguarded":
          ax.fill_between(b, mu - sd, mu + sd, color=color, alpha=0.15, lw=0)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("average answers per question")
    ax.set_ylabel("self-consistency rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  for key, color, label in (("budget/online_spent", "tab:orange", "realised (ledger)"),
                            ("budget/online_unguarded_spent", "tab:green", "realised (no ledger)"),
                            ("budget/online_planned", "tab:purple", "plan's expected")):
    keys = [k for k in (runs[0] if runs else {}) if k.startswith(key + "/B")]
    pts = sorted((int(k.rsplit("B", 1)[1]), [r[k] for r in runs]) for k in keys)
    if pts:
      axes[2].plot([p[0] for p in pts], [np.mean(p[1]) for p in pts], marker="o" if len(pts) <= 16 else None,
                   ms=4, color=color, label=label)
  lim = [4, max([4] + [int(k.rsplit("B", 1)[1]) for r in runs[:1] for k in r if k.startswith("budget/online_spent/B")])]
  axes[2].plot(lim, lim, "k:", label="target")
  axes[2].set_xlabel("target average budget")
  axes[2].set_ylabel("answers per test question")
  axes[2].set_title("online spend")
  axes[2].legend(fontsize=8)
  axes[2].grid(alpha=0.3)
  path = save(fig, out_dir, "pets_sc_rate.png")
  return [path]
