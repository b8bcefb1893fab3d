"""SLOT-Align experiment: macro accuracy of one-shot FedAvg heads over a grid of label skew and transport strength.

Launch: python -m jaxlab.main --config experiments/slot_align/config.py:tiny --workdir /tmp/slot_align
Expected (tiny, 2 CPU cores, a few seconds per seed): at alpha = 0.1 partial transport (tau = 0.4) beats no
alignment by several points; at alpha = 0 full transport (tau = 1) is best; every client's pushed-forward
Gaussian equals the barycenter to ~1e-12 (float64).

The run is `jaxlab.train.run_stages` with one stage per (alpha, tau), alpha-major, named like "a0.1/t0.4".
Each stage trains the clients' heads at one transport strength and returns its accuracies and map checks
(one metrics.jsonl row, checkpointed), so a resumed run recomputes only the missing stages (partitions,
statistics and maps are pure functions of seed and alpha, recomputed once per alpha in a session). The
summary, written once after the last stage, collects the claim keys from the stages' results.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab.federated import head as head_lib
from jaxlab.train import run_stages

from . import config as config_lib  # noqa: E402  (relative: works for installed and path-loaded experiments)
from . import method


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the (alpha, tau) stages; returns the summary (acc/a<alpha>/t<tau>, std/..., map/*, comm/*)."""
  data = method.load_domains(config)
  alphas, taus = tuple(config.method.alphas), tuple(config.method.taus)
  k = data["train_x"].shape[0]
  root = jax.random.key(config.seed)
  cache: dict[int, dict] = {}
  rounds: dict[tuple, object] = {}

  def prepare(ai: int, kp: int) -> dict:
    """Partition, client statistics over the channel and the server's alignment for alpha index ai."""
    if ai not in cache:
      mask = method.client_masks(config, data, ai)
      channel, center, basis = method.communicate(config, data["train_x"], mask)
      al, em, ec = method.align(config, channel)
      x, tx = data["train_x"], data["test_x"]
      mask, x, y = head_lib.compact_rows(mask, x, data["train_y"])  # each client's own rows first
      if basis is not None:
        x = ((x - center) @ basis).astype(np.float32)
        tx = ((tx - center) @ basis).astype(np.float32)
      steps, budgets = method.client_steps(config, mask)
      sig = (steps, budgets is not None)
      if sig not in rounds:  # one compiled round per static signature, reused across alphas
        rounds[sig] = method.make_round(config, steps, budgets is not None)
      cache.clear()
      cache[ai] = dict(mask=mask, al=al, em=em, ec=ec, x=x, y=y, tx=tx, steps=steps, budgets=budgets,
                       floats=channel.floats_sent / k, fn=rounds[sig])
    return cache[ai]

  def run_stage(ctx, ai: int, ti: int) -> dict:
    """One (alpha, tau): local heads on the tau-transported features, one FedAvg, macro accuracy over domains."""
    kp = method.padded_count(k)   # clients padded to a multiple of the mesh's data axis
    weights = method.pad_clients(np.ones((k,), np.float32), kp)
    p = prepare(ai, kp)
    a, b = method.geodesic_maps(p["al"], taus[ti], kp)
    keys = jax.random.split(jax.random.fold_in(root, ctx.index), kp)   # ctx.index = ai * len(taus) + ti
    # eager ops inside the run's mesh leave the keys replicated on it; the round takes them client-sharded
    keys = jax.device_put(keys, NamedSharding(ctx.mesh, P("data")))
    budgets = method.pad_clients(p["budgets"] if p["budgets"] is not None else np.zeros((k,), np.int32), kp)
    init = head_lib.init_head(p["x"].shape[-1], data["num_classes"], jax.random.fold_in(root, 10_000),
                              config.head.init_scale)
    out = p["fn"](method.pad_clients(p["x"], kp), method.pad_clients(p["y"], kp),
                  method.pad_clients(p["mask"], kp), a, b, keys, budgets, weights, init,
                  method.pad_clients(p["tx"], kp), method.pad_clients(data["test_y"], kp),
                  method.pad_clients(data["test_mask"], kp))
    row = {"alpha": alphas[ai], "tau": taus[ti], "eval/macro_acc": out["macro"], "eval/domain_std": out["std"],
           "train/loss": out["loss"], "map/mean_rel_err": p["em"], "map/cov_rel_err": p["ec"],
           "bary/iterations": float(p["al"].iterations), "comm/floats_per_client": float(p["floats"]),
           "data/min_client_n": float(p["mask"].sum(1).min()), "head/local_steps": float(p["steps"])}
    per_domain = np.asarray(out["per_domain"])
    for j in range(k):
      row[f"eval/acc_domain{j}"] = per_domain[j]
    return row

  stages = {config_lib.stage_name(alpha, tau): functools.partial(run_stage, ai=ai, ti=ti)
            for ai, alpha in enumerate(alphas) for ti, tau in enumerate(taus)}
  return run_stages(config, workdir, stages, summarise=lambda results: summarise([results[n] for n in stages]),
                    extra_summary=dict(num_clients=k, feature_dim=int(data["train_x"].shape[-1])))


def summarise(rows) -> dict:
  """Claim keys from the stages' results (or metrics rows), in stage order: acc/a<alpha>/t<tau>, std/..., gain/... (vs tau = 0), map/max_rel_err."""
  out, errs = {}, []
  for r in rows:
    if "alpha" not in r:
      continue
    tag = f"a{r['alpha']:g}/t{r['tau']:g}"
    out[f"acc/{tag}"] = r["eval/macro_acc"]
    out[f"std/{tag}"] = r["eval/domain_std"]
    errs += [r["map/mean_rel_err"], r["map/cov_rel_err"]]
    out["comm/floats_per_client"] = r["comm/floats_per_client"]
    out["bary/max_iterations"] = max(out.get("bary/max_iterations", 0), r["bary/iterations"])
  for key in list(out):
    if key.startswith("acc/"):
      base = key.rsplit("/t", 1)[0] + "/t0"
      if base in out:
        out["gain/" + key[4:]] = out[key] - out[base]
  if errs:
    out["map/max_rel_err"] = float(max(errs))
  return out


def plot(runs, workdirs, out_dir):
  """Macro accuracy vs tau, one line per alpha (mean +- std over seeds)."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  del workdirs
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  alphas = sorted({k.split("/")[1] for r in runs for k in r if k.startswith("acc/")})
  for a in alphas:
    taus = sorted({float(k.split("/t")[-1]) for k in runs[0] if k.startswith(f"acc/{a}/")})
    acc = np.array([[r[f"acc/{a}/t{t:g}"] for t in taus] for r in runs])
    ax.errorbar(taus, acc.mean(0), yerr=acc.std(0), marker="o", capsize=3, label=f"alpha = {a[1:]}")
  ax.set_xlabel("transport strength tau (0 = no alignment)")
  ax.set_ylabel("macro accuracy over domains")
  ax.set_title("SLOT-Align: one-shot FedAvg on aligned features")
  ax.legend()
  path = save(fig, out_dir, "slot_align_tau.png")
  return [path]
