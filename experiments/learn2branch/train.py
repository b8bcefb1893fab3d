"""Learned branching: collect strong-branching samples in SCIP, imitate them with a GCNN, branch with it in SCIP.

Launch: python -m jaxlab.main --config experiments/learn2branch/config.py:tiny --workdir /tmp/learn2branch

Stages (`jaxlab.train.run_stages`, resumable):
* "collect": train / valid / test instances (`data.generator` from `data.seed`, or the user's files) sampled by
  Gasse's explore-then-strong-branch rule in `data.workers` processes (`jaxlab.milp.collect`), cached by the data
  and solver sections (runs that share them, e.g. the seeds, collect once); reports sample counts, depths and the
  collection throughput.
* "train": the GCNN's PreNorm layers fitted on training batches, then `train.num_steps` Adam steps of
  cross-entropy on the strong-branching argmax (`jaxlab.train.run_loop` in the stage's subdir: resumable by step);
  validation acc@k at the end; the trained parameters go to the stage's .npz.
* "evaluate": test acc@k (k in eval.ks) of the GCNN, most-fractional branching and a uniformly random candidate,
  overall and by depth.
* "solve": on `solve.instances` held-out instances, SCIP with the GCNN policy and with each of `solve.rules`
  (nodes, time, gap; the baselines are cached per instance, they do not depend on the run seed); the per-instance
  log((nodes_rule + 1) / (nodes_gcnn + 1)) and shifted geometric means (nodes shift 10, time shift 1 s).

summary.json: "gcnn|mostfrac|random/acc<k>" (and "/depth" lists, "/upstream"), "valid/acc<k>", "collect/*",
"solve/<rule>/{nodes, time}_sgm", "solve/log_ratio/<rule>" (per instance), "solve/<rule>/nodes" (per instance).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxlab import cache, metrics, progress
from jaxlab import mesh as mesh_lib
from jaxlab.milp import collect as collect_lib
from jaxlab.milp import gcnn, imitation
from jaxlab.train import make_optimizer, make_train_step, run_loop, run_stages
from jaxlab.errors import ConfigError
from jaxlab.state import ModelDef, create_train_state

SPLITS = ("train", "valid", "test")
NODE_SHIFT, TIME_SHIFT = 10.0, 1.0


def train_and_evaluate(config, workdir: str) -> dict:
  stages = {"collect": collect_stage, "train": train_stage, "evaluate": evaluate_stage, "solve": solve_stage}
  return run_stages(config, workdir, stages)


# ------------------------------------------------------------------------------------------------ data

def data_dir(config) -> str:
  """The cache folder of this config's samples (keyed by the data and solver sections and the feature sets)."""
  from jaxlab.milp import scip_env  # pylint: disable=g-import-not-at-top
  spec = {"data": {k: v for k, v in config.data.to_dict().items() if k not in ("workers", "cache_dir")},
          "scip": config.scip.to_dict(), "features": [scip_env.ROW_FEATURES, scip_env.COL_FEATURES,
                                                       scip_env.EDGE_FEATURES, scip_env.NODE_FEATURES]}
  return cache.path("milp", f"{config.data.generator}_{cache.digest(spec)}", config.data.cache_dir)


def _files(config) -> list[str]:
  folder = config.data.files
  names = sorted(f for f in os.listdir(folder) if f.endswith((".lp", ".mps", ".lp.gz", ".mps.gz")))
  need = config.data.train_instances + config.data.valid_instances + config.data.test_instances
  if len(names) < need + config.solve.instances:
    raise FileNotFoundError(f"config.data.files={folder} holds {len(names)} .lp/.mps files; the splits need "
                            f"{need} + {config.solve.instances} held-out (lower config.data.*_instances)")
  return [os.path.join(folder, n) for n in names]


def _counts(config) -> dict[str, int]:
  d = config.data
  return {"train": d.train_instances, "valid": d.valid_instances, "test": d.test_instances}


def jobs(config, split: str) -> list[dict]:
  """The collection jobs of one split (split ids 0 / 1 / 2 in the instance seeds)."""
  d = config.data
  sid, n = SPLITS.index(split), _counts(config)[split]
  settings = dict(config.scip.to_dict(), seed=0)
  common = dict(settings=settings, p_expert=d.p_expert, explore=d.explore, itlim=None if d.itlim < 0 else d.itlim,
                max_samples=d.max_samples, record_tied=d.record_tied)
  if d.files:
    offset = sum(list(_counts(config).values())[:sid])
    paths = _files(config)[offset:offset + n]
    return [collect_lib.job(i, path=p, seed=(d.seed, sid, i), **common) for i, p in enumerate(paths)]
  return [collect_lib.job(i, generator=d.generator, sizes=d.sizes.to_dict(), seed=(d.seed, sid, i), **common)
          for i in range(n)]


def load_split(config, split: str) -> list[dict]:
  samples, _ = collect_lib.load(os.path.join(data_dir(config), split), range(_counts(config)[split]))
  return samples


def collect_stage(ctx) -> dict:
  config = ctx.config
  out, _ = collect_lib.collect_splits({split: (jobs(config, split), os.path.join(data_dir(config), split))
                                       for split in SPLITS}, config.data.workers)
  depths = np.concatenate([s["depth"][None] for s in load_split(config, "train")])
  out["collect/train/depth_hist"] = np.bincount(depths).tolist()
  return out


# ------------------------------------------------------------------------------------------------ model

def make_model(config, dims, rngs):
  """The GCNN for feature sizes `dims` = (row, column, edge)."""
  return gcnn.BipartiteGCNN(*dims, emb=config.model.emb, rngs=rngs)


def _dims(sample) -> tuple[int, int, int]:
  return sample["row_feats"].shape[1], sample["col_feats"].shape[1], sample["edge_feats"].shape[1]


def _loss_fn(ties: bool):
  def loss_fn(model, batch, key):
    del key
    loss, metrics = gcnn.imitation_loss(model, batch, ties=ties)
    return loss, dict(metrics, weight=batch["sample_weight"].sum())
  return loss_fn


class TrainSetup(NamedTuple):
  """The train stage before its first step: the state has its PreNorm fitted; `batches(step)` is the packed
  batch of a step; `sizes` the shape buckets of every split."""
  modeldef: ModelDef
  state: Any
  shardings: Any
  tx: Any
  schedule: Any
  batches: imitation.Batches
  loss_fn: Any
  batch_sharding: Any
  sizes: dict
  valid: list


def setup_training(config, mesh) -> TrainSetup:
  """The train stage's model, state, data and loss under `mesh` (entered by the caller)."""
  train = load_split(config, "train")
  valid = load_split(config, "valid")
  sizes = imitation.buckets(train + valid + load_split(config, "test"))
  split = mesh_lib.data_split(mesh)
  if config.train.batch_size % split:
    raise ConfigError(f"config.train.batch_size={config.train.batch_size} is not divisible by the "
                              f"{split}-way data split of mesh {dict(mesh.shape)}")
  batches = imitation.Batches(train, config.train.batch_size, config.seed, sizes)
  modeldef = ModelDef(lambda rngs: make_model(config, _dims(train[0]), rngs))
  tx, schedule = make_optimizer(config.train.optimizer, config.train.num_steps)
  state, shardings = create_train_state(modeldef, tx, mesh, mesh_lib.current_rules(), config.seed)
  # Gasse's PreNorm pre-training: fitted on the first training batches, then frozen (deterministic, so a resumed
  # run fits the same statistics; the checkpoint restores them anyway).
  model = modeldef.merge(*jax.device_get((state.params, state.model_state)))
  gcnn.fit_prenorm(model, [batches(i) for i in range(config.model.prenorm_batches)])
  state = state.replace(model_state=jax.device_put(ModelDef.split(model)[1], shardings.model_state))
  return TrainSetup(modeldef, state, shardings, tx, schedule, batches, _loss_fn(config.method.loss == "ties"),
                    mesh_lib.batch_sharding(mesh), sizes, valid)


def train_stage(ctx) -> dict:
  config, mesh = ctx.config, ctx.mesh
  t = setup_training(config, mesh)
  step = make_train_step(t.modeldef, t.loss_fn, t.tx, t.schedule, t.shardings, t.batch_sharding)
  state, summary = run_loop(config, ctx.subdir(), t.state, t.shardings, step,
                            lambda i: jax.device_put(t.batches(i), t.batch_sharding))
  model = t.modeldef.merge(*jax.device_get((state.params, state.model_state)))
  acc = imitation.policy_accuracy(model, t.valid, config.eval.ks, config.eval.batch_size, t.sizes,
                                  mesh_lib.data_split(mesh))
  out = {f"valid/{k}": float(v.mean()) for k, v in acc.items()}
  out["train/final_loss"] = float(summary.get("train/loss", np.nan))
  out["sizes"] = t.sizes
  out["params"] = ModelDef.split(model)[0]
  out["model_state"] = ModelDef.split(model)[1]
  return out


def trained_model(ctx):
  r = ctx.results["train"]
  p = r["params"]     # the input layers' kernels give the feature sizes: no data to load
  dims = (p["row_fc1"]["kernel"].shape[0], p["col_fc1"]["kernel"].shape[0], p["conv_c2r"]["edge"]["kernel"].shape[0])
  modeldef = ModelDef(lambda rngs: make_model(ctx.config, dims, rngs))
  return modeldef.merge(r["params"], r["model_state"]), {k: int(v) for k, v in r["sizes"].items()}


# ------------------------------------------------------------------------------------------------ evaluation

def evaluate_stage(ctx) -> dict:
  config = ctx.config
  test = load_split(config, "test")
  model, sizes = trained_model(ctx)
  ks = tuple(config.eval.ks)
  per = {f"gcnn/{k}": v for k, v in imitation.policy_accuracy(model, test, ks, config.eval.batch_size, sizes,
                                                               mesh_lib.data_split(ctx.mesh)).items()}
  per.update(imitation.heuristic_accuracy(test, ks))
  depths = np.array([int(s["depth"]) for s in test])
  out = {"test/samples": len(test), "test/cands_mean": float(np.mean([len(s["cands"]) for s in test]))}
  for name, v in per.items():
    out[name] = float(v.mean())
    out[f"{name}/depth"], counts = imitation.by_depth(v, depths, config.eval.max_depth_bin)
  out["test/depth_counts"] = counts
  upstream = depths <= 2
  out.update({f"{name}/upstream": float(v[upstream].mean()) if upstream.any() else None
              for name, v in per.items()})
  return out


def held_out(config, i: int):
  """Held-out instance i of the solve stage (split id 3; files: after the test split)."""
  from jaxlab.milp import generators, instance  # pylint: disable=g-import-not-at-top
  d = config.data
  if d.files:
    return instance.read(_files(config)[sum(_counts(config).values()) + i])
  return generators.generate(d.generator, np.random.default_rng((d.seed, 3, i)), **d.sizes.to_dict())


def _settings(config, i: int):
  from jaxlab.milp import scip_env  # pylint: disable=g-import-not-at-top
  s = config.solve
  return scip_env.Settings.from_config(config.scip, time_limit=s.time_limit,
                                       node_limit=None if s.node_limit < 0 else s.node_limit,
                                       seed=s.seed_offset + i)


def _baseline(config, rule: str, i: int) -> dict:
  """A baseline solve of held-out instance i, cached next to the samples (independent of the run seed)."""
  from jaxlab.milp import scip_env  # pylint: disable=g-import-not-at-top
  s = config.solve
  key = cache.digest({"rule": rule, "i": i, "time_limit": s.time_limit, "node_limit": s.node_limit,
                      "seed_offset": s.seed_offset})
  path = os.path.join(data_dir(config), "solves", f"{rule}_{i:04d}_{key}.json")
  if os.path.exists(path):
    return metrics.read_json(path)
  res = scip_env.solve(held_out(config, i), rule, _settings(config, i))
  metrics.write_json(path, res)
  return res


def solve_stage(ctx) -> dict:
  from jaxlab.milp import scip_env  # pylint: disable=g-import-not-at-top
  config = ctx.config
  model, sizes = trained_model(ctx)
  policy = imitation.GCNNPolicy(model, sizes)
  rules = tuple(config.solve.rules)
  res = {r: [] for r in ("gcnn",) + rules}
  with progress.bar(total=config.solve.instances, desc="solve held-out") as bar:
    for i in range(config.solve.instances):
      res["gcnn"].append(scip_env.solve(held_out(config, i), "policy", _settings(config, i), policy=policy))
      for r in rules:
        res[r].append(_baseline(config, r, i))
      bar.update(1)
  out = {}
  g = np.array([x["nodes"] for x in res["gcnn"]], np.float64)
  for r, xs in res.items():
    nodes = np.array([x["nodes"] for x in xs], np.float64)
    out[f"solve/{r}/nodes"] = nodes.astype(int).tolist()
    out[f"solve/{r}/nodes_sgm"] = scip_env.shifted_geometric_mean(nodes, NODE_SHIFT)
    out[f"solve/{r}/time_sgm"] = scip_env.shifted_geometric_mean([x["time"] for x in xs], TIME_SHIFT)
    out[f"solve/{r}/solved"] = float(np.mean([x["status"] == "optimal" for x in xs]))
    out[f"solve/{r}/gap_mean"] = float(np.mean([min(x["gap"], 1.0) for x in xs]))
    if r != "gcnn":
      out[f"solve/log_ratio/{r}"] = np.log((nodes + 1) / (g + 1)).tolist()
  out["solve/gcnn/policy_ms_per_node"] = 1e3 * sum(x["policy_time"] for x in res["gcnn"]) / max(
      sum(x["policy_calls"] for x in res["gcnn"]), 1)
  return out


# ------------------------------------------------------------------------------------------------ plots

def plot(runs, workdirs, out_dir):
  """acc@1 and acc@5 by depth (GCNN, most-fractional, random; mean over seeds) and nodes per rule."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  del workdirs
  paths = []
  if "gcnn/acc1/depth" in runs[0]:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, k in zip(axes, (1, 5)):
      for arm, color in (("gcnn", "tab:blue"), ("mostfrac", "tab:orange"), ("random", "tab:gray")):
        v = np.array([r[f"{arm}/acc{k}/depth"] for r in runs], np.float64)
        ax.plot(np.arange(v.shape[1]), np.nanmean(v, 0), "o-", color=color, label=arm)
      ax.set_xlabel("node depth (last bin: deeper)")
      ax.set_ylabel(f"test acc{k}")
      ax.set_ylim(0, 1)
      ax.set_title(f"acc{k} by depth (mean over {len(runs)} seeds)")
      ax.legend(fontsize=8)
    paths.append(save(fig, out_dir, "accuracy_by_depth.png"))
  if "solve/gcnn/nodes_sgm" in runs[0]:
    arms = ["gcnn"] + [k.split("/")[2] for k in runs[0] if k.startswith("solve/log_ratio/")]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    v = np.array([[r[f"solve/{a}/nodes_sgm"] for a in arms] for r in runs])
    ax.bar(arms, v.mean(0), yerr=v.std(0, ddof=1) if len(runs) > 1 else None, capsize=3,
           color=["tab:blue"] + ["tab:gray"] * (len(arms) - 1))
    ax.set_ylabel("nodes (shifted geometric mean, shift 10)")
    ax.set_title("SCIP nodes on held-out instances")
    paths.append(save(fig, out_dir, "nodes.png"))
  return paths
