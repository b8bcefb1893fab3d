"""Learned branching for MILP (Gasse et al. 2019): strong-branching imitation by a bipartite GCNN inside SCIP.

Not one of the papers: the reference experiment of the MILP core (`jaxlab.milp`), which SC-MILP builds on.
Paper: M. Gasse, D. Chetelat, N. Ferroni, L. Charlin, A. Lodi, "Exact Combinatorial Optimization with Graph
Convolutional Neural Networks", NeurIPS 2019 (arXiv 1906.01629); official code ds4dm/learn2branch (TF1, Ecole's
predecessor; read for the architecture, our code is written from the paper).

Variants: tiny (set cover 250 rows x 500 columns, density 0.05, presolve and cuts off, explore-then-strong-branch
samples from 400 training, 30 validation and 80 test instances, a 32-wide GCNN trained 1000 steps of 8 nodes with
the tie-aware loss, then the policy inside SCIP on 20 held-out instances; CPU, collection shared by the seeds),
small (set cover at Gasse's easy size 500 x 1000 with root cuts, 1000 instances), full (the four benchmarks at
Gasse's sizes, 100k samples: `--config.data.generator=cauctions` etc.; collection is CPU work, training runs on
the accelerator).

Launch: python -m jaxlab.main --config experiments/learn2branch/config.py:tiny --workdir /tmp/learn2branch
"""

import ml_collections
import numpy as np

from jaxlab import claims, configs

SEEDS = (0, 1, 2)       # training seeds; the collected data is shared (data.seed), as in Gasse's 5-seed protocol
CONFIDENCE = 0.95


def _policy_vs(rule):
  """Lower end of the one-sided 95% t interval, over the held-out instances, of log((nodes_rule + 1) /
  (nodes_gcnn + 1)) averaged over the seeds' policies (paired by instance; > 0: the GCNN needs fewer nodes)."""
  def stat(runs):
    per_instance = np.mean([r[f"solve/log_ratio/{rule}"] for r in runs], axis=0)
    return claims.t_bound(per_instance, CONFIDENCE, "lower")
  return stat


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`learn2branch` (reference for the MILP core: Gasse et al. 2019 GCNN branching; not a paper)",
    claim=("set cover 250 x 500, 3 training seeds: the GCNN imitates strong branching with acc@1 >= 3x uniform "
           "random and >= most-fractional + 10 points, acc@5 >= 0.6; inside SCIP on 20 held-out instances it "
           "needs fewer nodes than random and than most-fractional branching (paired t interval of the log node "
           "ratio above 0); equivariance and strong-branching invariance are exact-property tests"),
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"data.sizes": {"n_rows": 100, "n_cols": 200, "density": 0.05}, "data.train_instances": 14,
          "data.valid_instances": 4, "data.test_instances": 6, "data.p_expert": 0.5, "data.max_samples": 6,
          "data.cache_dir": "{tmp}/cache", "model.emb": 16, "model.prenorm_batches": 2, "train.num_steps": 20,
          "train.checkpoint_every": 10, "train.log_every": 10, "solve.instances": 3}
CANARY_VOLATILE = (r"sb_share",)   # the strong-branching share of the collection's wall time

CLAIMS = [
    claims.Claim("acc1_vs_random", "test acc@1 of the GCNN / that of a uniformly random candidate (mean over seeds)",
                 claims.ratio_of_means("gcnn/acc1", "random/acc1"), ">=", 3.0),
    claims.Claim("acc1_vs_mostfrac", "test acc@1 of the GCNN - that of most-fractional (lower 95% t bound over "
                 "seeds)", lambda runs: claims.t_bound([r["gcnn/acc1"] - r["mostfrac/acc1"] for r in runs],
                                                       CONFIDENCE, "lower"), ">=", 0.10),
    claims.Claim("acc5", "test acc@5 of the GCNN (lower 95% t bound over seeds)",
                 lambda runs: claims.t_bound([r["gcnn/acc5"] for r in runs], CONFIDENCE, "lower"), ">=", 0.6),
    claims.Claim("fewer_nodes_than_random", "inside SCIP: log((nodes random + 1) / (nodes GCNN + 1)), lower 95% t "
                 "bound over the held-out instances (seed-averaged)", _policy_vs("random"), ">", 0.0),
    claims.Claim("fewer_nodes_than_mostfrac", "inside SCIP: log((nodes most-fractional + 1) / (nodes GCNN + 1)), "
                 "lower 95% t bound over the held-out instances (seed-averaged)", _policy_vs("mostinf"), ">", 0.0),
]

GENERATORS = ("setcover", "cauctions", "facilities", "indset")
# Gasse et al. 2019, section 5.1: the training ("easy") sizes of the four benchmarks.
EASY = {"setcover": dict(n_rows=500, n_cols=1000, density=0.05), "cauctions": dict(n_items=100, n_bids=500),
        "facilities": dict(n_customers=100, n_facilities=100, ratio=5.0), "indset": dict(n_nodes=500, affinity=4)}
BASELINES = ("random", "mostinf", "pscost", "relpscost")


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  # data: instances of one generator (`jaxlab.milp.generators`), drawn from data.seed (shared by the run seeds);
  # samples by Gasse's explore-then-strong-branch rule (p_expert, exploration random | pscost | scip), at most
  # max_samples per instance, nodes where every candidate ties left out unless record_tied (they carry no
  # label); collected by `workers` processes into the cache (cache_dir: "" = $JAXLAB_CACHE_DIR or
  # ~/.cache/jaxlab) and reused by every run with the same data section. files: a folder of the user's
  # .lp / .mps instances instead of a generator (split train/valid/test by sorted order).
  c.data = ml_collections.ConfigDict(dict(
      generator="setcover", sizes=dict(n_rows=250, n_cols=500, density=0.05), seed=0, files="",
      train_instances=400, valid_instances=30, test_instances=80, max_samples=25, p_expert=0.3, explore="random",
      record_tied=False, itlim=-1, workers=2, cache_dir=""))
  # scip: the solver settings of collection and evaluation (`jaxlab.milp.scip_env.Settings`).
  c.scip = ml_collections.ConfigDict(dict(presolve=False, cuts="off", restarts=False, time_limit=20.0))
  # model: the GCNN (`jaxlab.milp.gcnn.BipartiteGCNN`).
  c.model = ml_collections.ConfigDict(dict(emb=32, prenorm_batches=8))     # Gasse's 64 in small / full
  # method.loss: "ce" = cross-entropy against the first strong-branching argmax (Gasse et al. 2019); "ties" = -log
  # of the probability of the set of tied best candidates (`jaxlab.milp.gcnn.imitation_loss(ties=True)`).
  c.method = ml_collections.ConfigDict(dict(loss="ties"))                  # "ce" in small / full
  # eval: acc@k on the test samples; solve: the policy and the baselines inside SCIP on held-out instances.
  c.eval = ml_collections.ConfigDict(dict(ks=(1, 5, 10), batch_size=32, max_depth_bin=10))
  c.solve = ml_collections.ConfigDict(dict(instances=20, rules=BASELINES, time_limit=60.0, node_limit=-1,
                                           seed_offset=10_000))
  c.train = configs.train_config(
      batch_size=8, num_steps=1000, log_every=50, eval_every=0, checkpoint_every=250,
      optimizer=dict(name="adam", learning_rate=3e-3, schedule="constant", warmup_steps=0, weight_decay=0.0))
  if arg.variant in ("small", "full"):      # Gasse et al. 2019: embeddings of 64, cross-entropy, Adam 1e-3
    c.model.emb = 64
    c.method.loss = "ce"
    c.train.optimizer.learning_rate = 1e-3
  if arg.variant == "small":
    c.data.sizes = EASY["setcover"]
    c.data.update(train_instances=1000, valid_instances=200, test_instances=200, max_samples=50)
    c.scip.update(cuts="root", time_limit=60.0)
    c.solve.update(instances=40, time_limit=300.0)
    c.train.num_steps = 5000
  elif arg.variant == "full":   # Gasse et al. 2019: 10k training instances, 100k samples, 1 h limits
    c.data.sizes = EASY["setcover"]
    c.data.update(train_instances=10_000, valid_instances=2_000, test_instances=2_000, max_samples=10,
                  p_expert=0.05, explore="pscost", workers=16)      # Gasse's 02_generate_dataset.py settings
    c.scip.update(cuts="root", time_limit=3600.0)
    c.solve.update(instances=20, time_limit=3600.0)
    c.train.update(batch_size=32, num_steps=100_000, checkpoint_every=5000, log_every=500)
    c.mesh = (("data", -1), ("model", 1))
  return configs.finalize(c, validate)


def validate(c):
  """Experiment-specific checks (run by configs.finalize and again by configs.apply_overrides)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  d = c.data
  if not d.files and d.generator not in GENERATORS:
    raise ConfigError(f"config.data.generator={d.generator!r}: use one of {', '.join(GENERATORS)} (or set "
                      "config.data.files to a folder of .lp / .mps instances)")
  if min(d.train_instances, d.valid_instances, d.test_instances) < 1:
    raise ConfigError(f"config.data train/valid/test_instances ({d.train_instances}, {d.valid_instances}, "
                      f"{d.test_instances}) must all be >= 1")
  if not 0.0 < d.p_expert <= 1.0:
    raise ConfigError(f"config.data.p_expert={d.p_expert} must be in (0, 1]")
  if c.method.loss not in ("ce", "ties"):
    raise ConfigError(f"config.method.loss={c.method.loss!r} must be 'ce' or 'ties'")
  if d.explore not in ("random", "pscost", "scip"):
    raise ConfigError(f"config.data.explore={d.explore!r} must be 'random', 'pscost' or 'scip'")
  if c.scip.cuts not in ("off", "root", "all"):
    raise ConfigError(f"config.scip.cuts={c.scip.cuts!r} must be 'off', 'root' or 'all'")
  bad = [r for r in c.solve.rules if r not in BASELINES]
  if bad:
    raise ConfigError(f"config.solve.rules has {bad}: use some of {', '.join(BASELINES)}")
  if c.solve.instances < 2:
    raise ConfigError(f"config.solve.instances={c.solve.instances} must be >= 2 (a paired interval needs two)")
  if any(int(k) < 1 for k in c.eval.ks) or 1 not in tuple(c.eval.ks):
    raise ConfigError(f"config.eval.ks={tuple(c.eval.ks)} must be positive and include 1")
  if np.any(np.asarray(c.train.batch_size) < 1):
    raise ConfigError(f"config.train.batch_size={c.train.batch_size} must be >= 1")


def sweep(arg=None):
  """The sampling rule: expert probability x samples per instance."""
  del arg
  return [{"data.p_expert": p, "data.max_samples": m} for p in (0.05, 0.15, 0.3) for m in (10, 25, 50)]
