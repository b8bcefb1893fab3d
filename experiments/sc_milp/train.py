"""SC-MILP: strong-branching samples in SCIP (plus upstream nodes of derived instances), the GCNN trained with and
without stratified contrast and upstream augmentation, scored on every upstream test node.

Launch: python -m jaxlab.main --config experiments/sc_milp/config.py:tiny --workdir /tmp/sc_milp

Stages (`jaxlab.train.run_stages`, resumable):
* "collect": training instances sampled by explore-then-strong-branch (as learn2branch); test instances with
  every node of depth <= data.upstream_depth recorded, then explore-then-SB deeper; `aug.copies` derived
  instances (equivalent or perturbed, `jaxlab.milp.augment`) per training instance, solved breadth-first with
  strong branching down to data.upstream_depth, every node recorded. Workers in processes, cached by the data,
  solver and aug sections (the seeds share it).
* "strata": the dynamic strata (`jaxlab.milp.sc.DynamicStrata`) of the training nodes (original + derived):
  K-means on the node summary features, the elbow's k, the strata's mean depths.
* "train/<arm>" for each of method.arms (`config.ARMS`): the GCNN from the run seed's initialisation (the same
  for every arm), PreNorm fitted on the arm's first batches, then train.num_steps Adam steps of the imitation loss
  (+ lambda(t) SupCon on the node embeddings for the contrastive arms) over the arm's training set (its share of
  the instances, + the derived upstream nodes and upstream oversampling for the augmented arms); resumable by
  step in the stage's subdir.
* "evaluate": per arm, per test node: acc@1 hit, acc@k, by depth, upstream (depth <= data.upstream_depth);
  most-fractional and random for reference.
* "solve" (solve.instances > 0): the plain and SC-MILP policies inside SCIP on held-out instances (nodes, time).

summary.json: "<arm>/hits1" (per test node, 0/1), "<arm>/acc<k>" ("/depth", "/upstream"), "test/depth",
"collect/*", "strata/*", "train/<arm>/*", "solve/<arm>/*".
"""

from __future__ import annotations

import functools
import os

import jax
import numpy as np

from jaxlab import cache, progress
from jaxlab import mesh as mesh_lib
from jaxlab.errors import ConfigError
from jaxlab.milp import collect as collect_lib
from jaxlab.milp import gcnn, imitation, sc
from jaxlab.state import ModelDef, create_train_state
from jaxlab.train import make_optimizer, make_train_step, run_loop, run_stages

from . import config as config_lib  # noqa: E402  (relative: works for installed and path-loaded experiments)

# Breadth-first node selection (SCIP's BFS selector above every other one), for the derived instances' upstream
# nodes: with a node limit of 2^(d+1) - 1 the tree is every node of depth <= d that is not pruned.
BFS = {"nodeselection/bfs/stdpriority": 1_000_000, "nodeselection/bfs/memsavepriority": 1_000_000}
NODE_SHIFT, TIME_SHIFT = 10.0, 1.0


def train_and_evaluate(config, workdir: str) -> dict:
  stages = {"collect": collect_stage, "strata": strata_stage}
  stages.update({f"train/{arm}": _train_stage(arm, *config_lib.ARMS[arm]) for arm in config.method.arms})
  stages["evaluate"] = evaluate_stage
  if config.solve.instances > 0:
    stages["solve"] = solve_stage
  return run_stages(config, workdir, stages)


# ------------------------------------------------------------------------------------------------ data

def data_dir(config) -> str:
  """The cache folder of this config's samples (data and solver sections, feature sets); the derived
  instances' samples go to a subfolder keyed by the aug section."""
  from jaxlab.milp import scip_env  # pylint: disable=g-import-not-at-top
  spec = {"data": {k: v for k, v in config.data.to_dict().items() if k not in ("workers", "cache_dir",
                                                                                 "small_share")},
          "scip": config.scip.to_dict(), "features": [scip_env.ROW_FEATURES, scip_env.COL_FEATURES,
                                                       scip_env.EDGE_FEATURES, scip_env.NODE_FEATURES]}
  return cache.path("milp", f"sc_{config.data.generator}_{cache.digest(spec)}", config.data.cache_dir)


def aug_dir(config) -> str:
  a = config.aug
  spec = {"kind": a.kind, "copies": a.copies, **({"kinds": list(a.kinds)} if a.kind == "equivalent" else
                                                  {"sigma": a.sigma})}
  return os.path.join(data_dir(config), f"aug_{cache.digest(spec)}")


def _transform(config, i: int, copy: int) -> dict:
  a = config.aug
  if a.kind == "equivalent":
    return {"kind": "equivalent", "seed": [config.data.seed, 4, i, copy], "kinds": list(a.kinds)}
  return {"kind": "perturb", "seed": [config.data.seed, 4, i, copy], "sigma": float(a.sigma), "what": ["c"]}


def jobs(config, split: str) -> list[dict]:
  """The collection jobs of a split: "train" (split id 0), "test" (2: learn2branch's test seeds), "aug"
  (derived copies of the training instances)."""
  d = config.data
  settings = dict(config.scip.to_dict(), seed=0)
  gen = dict(generator=d.generator, sizes=d.sizes.to_dict(), explore=d.explore, itlim=None, record_tied=False)
  if split == "train":
    return [collect_lib.job(i, seed=(d.seed, 0, i), settings=settings, p_expert=d.p_expert,
                            max_samples=d.max_samples, **gen) for i in range(d.train_instances)]
  if split == "test":
    return [collect_lib.job(i, seed=(d.seed, 2, i), settings=settings, p_expert=d.p_expert,
                            max_samples=d.max_samples, all_depth_le=d.upstream_depth, **gen)
            for i in range(d.test_instances)]
  bfs = dict(settings, node_limit=2 ** (d.upstream_depth + 1) - 1, params=BFS)
  c = config.aug.copies
  return [collect_lib.job(i * c + k, seed=(d.seed, 0, i), settings=bfs, p_expert=1e-9, max_samples=None,
                          all_depth_le=d.upstream_depth, transform=_transform(config, i, k), **gen)
          for i in range(d.train_instances) for k in range(c)]


def _folder(config, split: str) -> str:
  return aug_dir(config) if split == "aug" else os.path.join(data_dir(config), split)


@functools.lru_cache(maxsize=6)
def _load(folder: str, n: int, copies: int, split: str) -> tuple[dict, ...]:
  """A split's samples, read once per process (the shards of a cache folder never change once written)."""
  samples, _ = collect_lib.load(folder, range(n))
  for s in samples:
    i = int(s["instance"])
    s["source"] = i // copies if split == "aug" else (i if split == "train" else -1)
  return tuple(samples)


def load_split(config, split: str) -> list[dict]:
  """The samples of a split; each carries "source": the training instance it comes from (-1 for test)."""
  n = {"train": config.data.train_instances, "test": config.data.test_instances,
       "aug": config.data.train_instances * config.aug.copies}[split]
  return list(_load(_folder(config, split), n, config.aug.copies, split))


def collect_stage(ctx) -> dict:
  config = ctx.config
  out, _ = collect_lib.collect_splits({split: (jobs(config, split), _folder(config, split))
                                       for split in ("train", "test", "aug")}, config.data.workers)
  up = config.data.upstream_depth
  for split in ("train", "test", "aug"):
    depths = np.array([int(s["depth"]) for s in load_split(config, split)])
    out[f"collect/{split}/upstream"] = int((depths <= up).sum())
    out[f"collect/{split}/depth_hist"] = np.bincount(depths, minlength=up + 1).tolist()
  return out


# ------------------------------------------------------------------------------------------------ training sets

def _small_sources(config) -> np.ndarray:
  """The training instances of the "_small" arms: a subset drawn from the run seed."""
  n = config.data.train_instances
  k = max(1, int(round(config.data.small_share * n)))
  return np.sort(np.random.default_rng([config.seed, 7]).permutation(n)[:k])


def oversample_factor(n_up: int, n_down: int, share: float) -> int:
  """How many times each upstream sample is drawn so that upstream is about `share` of the draws (>= 1)."""
  if share <= 0 or n_up == 0:
    return 1
  return max(1, int(round(share * n_down / ((1 - share) * n_up))))


def training_set(config, augment: bool, part: str) -> tuple[list[dict], dict]:
  """(the arm's training list, with upstream samples repeated when oversampled; its counts)."""
  train, aug = load_split(config, "train"), load_split(config, "aug")
  keep = set(_small_sources(config).tolist()) if part == "small" else None
  samples = [s for s in train if keep is None or s["source"] in keep]
  if augment:
    samples += [s for s in aug if keep is None or s["source"] in keep]
  up = [int(s["depth"]) <= config.data.upstream_depth for s in samples]
  n_up = int(sum(up))
  r = oversample_factor(n_up, len(samples) - n_up, config.aug.upstream_share) if augment else 1
  out = [s for s, u in zip(samples, up) for _ in range(r if u else 1)]
  return out, {"samples": len(samples), "upstream": n_up, "oversample": r, "draws": len(out)}


def fit_strata(config, samples, num_steps: int) -> sc.DynamicStrata:
  """The dynamic strata of a set of training samples (K-means on their node summary features)."""
  m = config.method
  return sc.DynamicStrata.fit(np.stack([s["node_feats"] for s in samples]), np.array([int(s["depth"])
                              for s in samples]), num_steps, k_start=m.k_start, ks=tuple(m.ks), ramp=m.k_ramp,
                              seed=config.seed)


def strata_stage(ctx) -> dict:
  config = ctx.config
  samples, _ = training_set(config, True, "all")
  unique = list({id(s): s for s in samples}.values())
  st = fit_strata(config, unique, config.train.num_steps)
  final = st.fits[st.k_final]
  labels = st.labels(config.train.num_steps)
  return {"strata/k_final": st.k_final, "strata/depth_means": final.depth_means.tolist(),
          "strata/counts": np.bincount(labels, minlength=st.k_final).tolist(),
          "strata/inertias": {str(k): v for k, v in final.inertias.items()}}


# ------------------------------------------------------------------------------------------------ training

def _dims(sample) -> tuple[int, int, int]:
  return sample["row_feats"].shape[1], sample["col_feats"].shape[1], sample["edge_feats"].shape[1]


def make_model(config, dims, rngs):
  return sc.GCNNWithHead(*dims, emb=config.model.emb, proj_dim=config.model.proj_dim, rngs=rngs)


def _loss_fn(config, contrastive: bool):
  ties, tau = config.method.loss == "ties", config.method.tau

  def loss_fn(model, batch, key):
    del key
    if contrastive:
      loss, metrics = sc.sc_loss(model.gcnn, model.head, batch, batch["lam"][0], tau=tau, ties=ties)
    else:
      loss, metrics = gcnn.imitation_loss(model.gcnn, batch, ties=ties)
    return loss, dict(metrics, weight=batch["sample_weight"].sum())
  return loss_fn


def _sizes(config) -> dict:
  return imitation.buckets(load_split(config, "train") + load_split(config, "test") + load_split(config, "aug"))


def _train_stage(arm: str, contrastive: bool, augment: bool, part: str):
  def stage(ctx) -> dict:
    config, mesh = ctx.config, ctx.mesh
    split = mesh_lib.data_split(mesh)
    if config.train.batch_size % split:
      raise ConfigError(f"config.train.batch_size={config.train.batch_size} is not divisible by the {split}-way "
                        f"data split of mesh {dict(mesh.shape)}")
    samples, counts = training_set(config, augment, part)
    sizes = _sizes(config)
    batches = imitation.Batches(samples, config.train.batch_size, config.seed, sizes)
    steps = config.train.num_steps
    strata = None
    if contrastive:
      pos = {}                                                 # repeated samples share their stratum
      for s in samples:
        pos.setdefault(id(s), len(pos))
      unique = list({id(s): s for s in samples}.values())
      strata = (fit_strata(config, unique, steps), np.array([pos[id(s)] for s in samples]))
    m = config.method

    def get_batch(i):
      b = batches(i)
      if strata is not None:
        b["stratum"] = strata[0].labels(i)[strata[1][batches.indices(i)]].astype(np.int32)
      b["lam"] = np.full(len(b["label"]), sc.lambda_at(i, steps, m.lam_max, m.lam_ramp) if contrastive else 0.0,
                         np.float32)
      return jax.device_put(b, mesh_lib.batch_sharding(mesh))

    modeldef = ModelDef(lambda rngs: make_model(config, _dims(samples[0]), rngs))
    tx, schedule = make_optimizer(config.train.optimizer, steps)
    state, shardings = create_train_state(modeldef, tx, mesh, mesh_lib.current_rules(), config.seed)
    model = modeldef.merge(*jax.device_get((state.params, state.model_state)))
    gcnn.fit_prenorm(model.gcnn, [batches(i) for i in range(config.model.prenorm_batches)])
    state = state.replace(model_state=jax.device_put(ModelDef.split(model)[1], shardings.model_state))
    step = make_train_step(modeldef, _loss_fn(config, contrastive), tx, schedule, shardings,
                           mesh_lib.batch_sharding(mesh))
    state, summary = run_loop(config, ctx.subdir(), state, shardings, step, get_batch)
    model = modeldef.merge(*jax.device_get((state.params, state.model_state)))
    out = {f"train/{arm}/{k}": v for k, v in counts.items()}
    out[f"train/{arm}/final_loss"] = float(summary.get("train/loss", np.nan))
    if contrastive:
      out[f"train/{arm}/k_final"] = strata[0].k_final
      out[f"train/{arm}/final_contrastive"] = float(summary.get("train/contrastive", np.nan))
    out["sizes"] = sizes
    out["params"], out["model_state"] = ModelDef.split(model.gcnn)
    return out
  return stage


def trained_gcnn(ctx, arm: str):
  r = ctx.results[f"train/{arm}"]
  p = r["params"]     # the input layers' kernels give the feature sizes
  dims = (p["row_fc1"]["kernel"].shape[0], p["col_fc1"]["kernel"].shape[0], p["conv_c2r"]["edge"]["kernel"].shape[0])
  modeldef = ModelDef(lambda rngs: gcnn.BipartiteGCNN(*dims, emb=ctx.config.model.emb, rngs=rngs))
  return modeldef.merge(r["params"], r["model_state"]), {k: int(v) for k, v in r["sizes"].items()}


# ------------------------------------------------------------------------------------------------ evaluation

def evaluate_stage(ctx) -> dict:
  config = ctx.config
  test = load_split(config, "test")
  ks = tuple(config.eval.ks)
  per = {}
  for arm in config.method.arms:
    model, sizes = trained_gcnn(ctx, arm)
    acc = imitation.policy_accuracy(model, test, ks, config.eval.batch_size, sizes, mesh_lib.data_split(ctx.mesh))
    per.update({f"{arm}/{k}": v for k, v in acc.items()})
  per.update(imitation.heuristic_accuracy(test, ks))
  depths = np.array([int(s["depth"]) for s in test])
  upstream = depths <= config.data.upstream_depth
  out = {"test/samples": len(test), "test/upstream": int(upstream.sum()), "test/depth": depths.tolist(),
         "test/upstream_depth": config.data.upstream_depth}
  for name, v in per.items():
    out[name] = float(v.mean())
    out[f"{name}/upstream"] = float(v[upstream].mean()) if upstream.any() else None
    out[f"{name}/depth"], counts = imitation.by_depth(v, depths, config.eval.max_depth_bin)
  out["test/depth_counts"] = counts
  for arm in config.method.arms:
    out[f"{arm}/hits1"] = per[f"{arm}/acc1"].astype(int).tolist()
  return out


def held_out(config, i: int):
  from jaxlab.milp import generators  # pylint: disable=g-import-not-at-top
  d = config.data
  return generators.generate(d.generator, np.random.default_rng((d.seed, 3, i)), **d.sizes.to_dict())


def solve_stage(ctx) -> dict:
  from jaxlab.milp import scip_env  # pylint: disable=g-import-not-at-top
  config = ctx.config
  arms = [a for a in ("plain", "sc") if a in config.method.arms]
  policies = {a: imitation.GCNNPolicy(*trained_gcnn(ctx, a)) for a in arms}
  res = {a: [] for a in arms}
  with progress.bar(total=config.solve.instances * len(arms), desc="solve held-out") as bar:
    for i in range(config.solve.instances):
      settings = scip_env.Settings.from_config(config.scip, time_limit=config.solve.time_limit,
                                               seed=config.solve.seed_offset + i)
      for a in arms:
        res[a].append(scip_env.solve(held_out(config, i), "policy", settings, policy=policies[a]))
        bar.update(1)
  out = {}
  for a, xs in res.items():
    nodes = np.array([x["nodes"] for x in xs], np.float64)
    out[f"solve/{a}/nodes"] = nodes.astype(int).tolist()
    out[f"solve/{a}/nodes_sgm"] = scip_env.shifted_geometric_mean(nodes, NODE_SHIFT)
    out[f"solve/{a}/time_sgm"] = scip_env.shifted_geometric_mean([x["time"] for x in xs], TIME_SHIFT)
    out[f"solve/{a}/solved"] = float(np.mean([x["status"] == "optimal" for x in xs]))
  if len(arms) == 2:
    out["solve/log_ratio/plain_over_sc"] = np.log((np.array(out["solve/plain/nodes"]) + 1) /
                                                  (np.array(out["solve/sc/nodes"]) + 1)).tolist()
  return out


# ------------------------------------------------------------------------------------------------ plots

COLORS = {"plain": "tab:blue", "sc": "tab:red", "no_contrast": "tab:orange", "no_aug": "tab:purple",
          "plain_small": "tab:cyan", "sc_small": "tab:pink", "mostfrac": "tab:gray"}


def plot(runs, workdirs, out_dir):
  """acc@1 by depth for each arm (mean over seeds), and the per-seed upstream / overall acc@1 of each arm."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  del workdirs
  arms = [a for a in COLORS if f"{a}/acc1/depth" in runs[0]]
  if not arms:
    return []
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for a in arms:
    v = np.array([[np.nan if x is None else x for x in r[f"{a}/acc1/depth"]] for r in runs], np.float64)
    axes[0].plot(np.arange(v.shape[1]), np.nanmean(v, 0), "o-", color=COLORS[a], label=a, ms=3)
  axes[0].axvspan(-0.5, runs[0]["test/upstream_depth"] + 0.5, color="0.9", zorder=0)
  axes[0].set(xlabel="node depth (last bin: deeper; shaded: upstream)", ylabel="test acc@1", ylim=(0, 1),
              title=f"acc@1 by depth (mean over {len(runs)} seeds)")
  axes[0].legend(fontsize=7)
  for j, key in enumerate(("acc1/upstream", "acc1")):
    for i, a in enumerate(arms):
      v = [r[f"{a}/{key}"] for r in runs]
      axes[1].scatter(np.full(len(v), i + 0.2 * j - 0.1), v, color=COLORS[a], marker="os"[j], s=14)
  axes[1].set_xticks(range(len(arms)), arms, rotation=30, fontsize=7)
  axes[1].set(ylabel="acc@1 (o: upstream, s: all nodes)", title="per seed")
  fig.tight_layout()
  return [save(fig, out_dir, "accuracy_by_depth.png")]
