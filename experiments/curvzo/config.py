"""CurvZO: curvature-guided sparse zeroth-order optimization vs MeZO and random-mask sparse ZO.

Paper: S. Wang, Z. Chen, M. Tang, "Adaptive Curvature-Guided Sparse Zeroth-Order Optimization" (CurvZO), ICML 2026
(arXiv 2603.21725). The update rule is partly reconstructed and the adaptive budget (Eq. 20) is a pluggable
reconstruction; see README.md.

Variants: tiny (estimator studies on quadratics and the optimizer race on a block-sparse quadratic, CPU
minutes; the claims), small (tiny + ZO fine-tuning of a digits MLP from classes 0-4 to all 10, report only),
full (OPT / Llama ZO fine-tuning on SST-2 / SuperGLUE from TFDS with MeZO's prompt templates and
hyperparameters: `--config.model.hf_path=DIR --config.task.name=sst2`).

Launch: python -m jaxlab.reproduce curvzo   (tiny, seeds 0, 1, 2)
"""

import ml_collections

from jaxlab import claims, configs
from jaxlab import mesh as mesh_lib

SEEDS = (0, 1, 2)
METHODS = ("mezo", "sparse", "curvzo", "curvzo_ht")
TASKS = ("sst2", "rte", "cb", "boolq", "copa", "wic", "wsc", "multirc")
LR_GRID = tuple(float(2.5e-4 * 2 ** (i / 2)) for i in range(12))     # 2.5e-4 ... 1.1e-2, factor sqrt(2)


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`curvzo` (CurvZO, arXiv 2603.21725; update rule and budget rule reconstructed)",
    claim=("MeZO's projected gradient = z . grad f on a quadratic (<= 1e-5); HT estimator mean over 20k keys "
           "within 5% of grad f; pi ~ sqrt(F) >= 10% lower variance than uniform and pi ~ F (per-block feedback,"
           " fixed F); CurvZO (ht=False) final loss <= 0.92x MeZO's on the block-sparse quadratic at equal "
           "forward passes"),
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"exact.d": 256, "exact.n_keys": 16, "unbiased.n_keys": 512, "variance.d": 256, "variance.blocks": 16,
          "variance.n_keys": 256, "variance.chunk": 64, "race.d": 200, "race.blocks": 10, "race.relevant": 2,
          "race.steps": 40, "race.log_every": 20}

CLAIMS = [
    claims.Claim("mezo_exact", "MeZO's projected gradient equals z . grad f on a quadratic: max relative error "
                 "over 128 keys (float64, eps = 1e-3), worst seed", claims.maximum("exact/max_rel_err_f64"),
                 "<=", 1e-5),
    claims.Claim("ht_unbiased", "HT sparse estimator is unbiased: mean over 20480 keys within 5% (rel. l2) of "
                 "grad f for non-uniform pi, worst seed", claims.maximum("ht/rel_err"), "<=", 0.05),
    claims.Claim("sqrt_optimal", "pi ~ sqrt(F) has >= 10% lower total estimator variance than uniform pi and "
                 "than pi ~ F at equal budget (log-normal g, sigma 1.5; fixed F), worst seed",
                 claims.maximum("var/sqrt_vs_best_other"), "<=", 0.9),
    claims.Claim("curvzo_vs_mezo", "block-sparse quadratic: CurvZO (ht=False) final loss <= 0.92x MeZO's at equal "
                 "forward passes, per-method tuned lr (mean of 3 seeds x 4 runs)",
                 claims.ratio_of_means("race/curvzo/final", "race/mezo/final"), "<=", 0.92),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  # task (full): kind "lm", name in TASKS, source "tfds" (TFDS name from lm_task.TASKS) or "jsonl"
  # (<data_dir>/{train,validation}.jsonl); MeZO's 1000 / 500 / 1000 train / dev / eval examples.
  c.task = ml_collections.ConfigDict(dict(kind="quadratic", name="sst2", source="tfds", data_dir="", n_train=1000,
                                          n_dev=500, n_eval=1000, max_length=128))
  # The ZO optimizers (jaxlab.zo). impl: zo_perturb impl ("auto" = Pallas on GPU, XLA elsewhere).
  c.method = ml_collections.ConfigDict(dict(
      methods=METHODS, eps=1e-3, impl="auto", block_size=20, row_blocks=False, density=0.1, budget="fixed", rho=0.5,
      min_density=0.01, max_density=0.5, pmin=0.05, beta=0.9, warmup_steps=10, exact_stats=True,
      learning_rate=1e-6, weight_decay=0.0, method="curvzo"))
  c.exact = ml_collections.ConfigDict(dict(enabled=True, d=4096, n_keys=128))
  c.unbiased = ml_collections.ConfigDict(dict(enabled=True, d=8, blocks=4, n_keys=20480, density=0.5, pmin=0.2))
  c.variance = ml_collections.ConfigDict(dict(enabled=True, d=4096, blocks=64, n_keys=8192, density=0.1, sigma=1.5,
                                              chunk=256))
  c.race = ml_collections.ConfigDict(dict(d=2000, blocks=100, relevant=3, steps=2000, log_every=50, lrs=LR_GRID,
                                          repeats=4, val_repeats=2))
  c.digits = ml_collections.ConfigDict(dict(enabled=False, hidden=32, pretrain_steps=300, steps=3000, batch=64,
                                            lrs=(1e-3, 3e-3, 1e-2, 3e-2, 1e-1), block_size=32))
  c.model = ml_collections.ConfigDict(dict(hf_path="", arch="opt", hidden=64, n_layers=2, n_heads=4, mlp_hidden=256,
                                           vocab_size=512, dtype="float32"))
  if arg.variant == "small":
    c.digits.enabled = True
  elif arg.variant == "full":
    # MeZO's full-parameter setting (princeton-nlp/MeZO mezo.sh): BS 16, constant lr 1e-6 / 1e-7, eps 1e-3,
    # 20k steps, eval every 4k; 1000 / 500 / 1000 train / dev / test examples; density sweep 0.1 - 0.3.
    c.task.kind = "lm"
    c.task.max_length = 256
    c.model.hf_path = ""       # e.g. a local facebook/opt-13b or meta-llama/Llama-2-7b-hf snapshot
    c.model.dtype = "bfloat16"
    c.method.row_blocks = True     # one block per weight-matrix row (method.block_size then plays no part)
    c.method.exact_stats = False
    c.method.learning_rate = 1e-7
    c.method.density = 0.2
    c.method.warmup_steps = 100
    # The ZO run_loop (lm_task.py): no optax optimizer (the ZO update's lr is method.learning_rate) and no
    # init_from (pretrained weights come from model.hf_path).
    c.train = configs.train_config(optimizer=None, init_from=None, batch_size=16, num_steps=20000, log_every=100,
                                   eval_every=4000, checkpoint_every=4000)
    c.mesh = (("data", -1), ("model", 1))
    c.sharding_rules = mesh_lib.RULES["fsdp"]   # parameters FSDP-sharded over "data"
  return configs.finalize(c, validate)


def stages(c) -> list[str]:
  """The tiny/small run's stages, in order."""
  out = [s for s in ("exact", "unbiased", "variance") if c[s].enabled]
  out += [f"race/{m}" for m in c.method.methods]
  if c.digits.enabled:
    out += [f"digits/{m}" for m in c.method.methods]
  return out


def validate(c):
  """Experiment-specific checks (run once by `configs.finalize`, and again by `configs.apply_overrides`)."""
  from jaxlab.errors import ConfigError
  m = c.method
  if c.task.kind not in ("quadratic", "lm"):
    raise ConfigError(f"config.task.kind={c.task.kind!r}: use quadratic (tiny/small) or lm (full)")
  bad = [x for x in m.methods if x not in METHODS]
  if bad or not m.methods:
    raise ConfigError(f"config.method.methods={tuple(m.methods)!r}: choose from {METHODS}")
  if c.task.kind == "quadratic" and not {"mezo", "curvzo"} <= set(m.methods):
    raise ConfigError("config.method.methods must include 'mezo' and 'curvzo' (the claims compare them)")
  if not m.eps > 0:
    raise ConfigError(f"config.method.eps must be positive, got {m.eps!r}")
  if not 0.0 < m.density <= 1.0:
    raise ConfigError(f"config.method.density must be in (0, 1], got {m.density!r}")
  if not 0.0 <= m.pmin <= m.density:
    raise ConfigError(f"config.method.pmin must be in [0, density={m.density}], got {m.pmin!r}")
  if not 0.0 <= m.beta < 1.0:
    raise ConfigError(f"config.method.beta must be in [0, 1), got {m.beta!r}")
  if m.budget not in ("fixed", "participation"):
    raise ConfigError(f"config.method.budget={m.budget!r}: use fixed or participation")
  if not (isinstance(m.block_size, int) and m.block_size > 0):
    raise ConfigError(f"config.method.block_size must be a positive int, got {m.block_size!r}")
  if m.impl not in ("auto", "xla", "pallas", "interpret"):
    raise ConfigError(f"config.method.impl={m.impl!r}: use auto, xla, pallas or interpret")
  if c.task.kind == "lm" and "train" not in c:
    raise ConfigError("config.task.kind='lm' is the full variant's ZO fine-tuning (it needs its config.train "
                      "section); use variant=full")
  if c.task.kind == "quadratic" and "train" in c:
    raise ConfigError("config.task.kind='quadratic' is the tiny/small variants' staged study (no config.train); "
                      "use variant=tiny or variant=small")
  if c.task.kind == "quadratic":
    r = c.race
    if r.d % r.blocks or r.relevant > r.blocks or r.steps % r.log_every:
      raise ConfigError(f"config.race: d={r.d} must split into blocks={r.blocks}, relevant <= blocks and steps="
                        f"{r.steps} must be a multiple of log_every={r.log_every}")
    if not r.lrs or min(r.lrs) <= 0:
      raise ConfigError(f"config.race.lrs must be a non-empty tuple of positive learning rates, got {r.lrs!r}")
    if c.unbiased.enabled and c.unbiased.d % c.unbiased.blocks:
      raise ConfigError(f"config.unbiased.d={c.unbiased.d} must be a multiple of blocks={c.unbiased.blocks}")
    if c.variance.enabled and (c.variance.d % c.variance.blocks or c.variance.n_keys % c.variance.chunk):
      raise ConfigError("config.variance: d must be a multiple of blocks and n_keys a multiple of chunk")
  else:
    if c.task.name not in TASKS:
      raise ConfigError(f"config.task.name={c.task.name!r} is not one of {TASKS}")
    if c.task.source not in ("tfds", "jsonl"):
      raise ConfigError(f"config.task.source={c.task.source!r}: use tfds or jsonl")
    if c.task.source == "jsonl" and not c.task.data_dir:
      raise ConfigError("config.task.source='jsonl' needs --config.task.data_dir=DIR with train.jsonl and "
                        "validation.jsonl")
    if m.method not in METHODS:
      raise ConfigError(f"config.method.method={m.method!r}: choose from {METHODS}")
    if not m.learning_rate > 0:
      raise ConfigError(f"config.method.learning_rate must be positive, got {m.learning_rate!r}")


def block_size(c):
  """The block_size argument of jaxlab.zo: "row" or config.method.block_size."""
  return "row" if c.method.row_blocks else c.method.block_size


def sweep(arg=None):
  """Full scale: method x density (the sparsity sweep 0.1 - 0.3) x MeZO's two learning rates."""
  del arg
  out = [{"method.method": "mezo", "method.learning_rate": lr} for lr in (1e-6, 1e-7)]
  out += [{"method.method": m, "method.density": dens, "method.learning_rate": lr}
          for m in ("sparse", "curvzo") for dens in (0.1, 0.2, 0.3) for lr in (1e-6, 1e-7)]
  return out
