"""PETS: offline (OKG) and online (bucketed) trajectory allocation for test-time self-consistency.

Paper: Liu, Qu, Yin, Sun, Han, Chen, Deng, "PETS: A Principled Framework Towards Optimal Trajectory Allocation
for Efficient Test-Time Self-Consistency", ICML 2026 (arXiv 2602.16745); official code github.com/ZDCSlab/PETS.

Variants: tiny (198 simulated GPQA-sized questions, 4 options, 64-answer Dirichlet-mixture pools, offline
budgets 1..64 per question, online average budgets 4..64 in steps of 1), small (1000 questions, 128-answer
pools), full (answer pools of a large model in the official PETS JSONL format, e.g. GPQA-Diamond sampled 64x
from Qwen3-8B: `--config.data.pool_file=gpqa_conf_qwen3_64.jsonl`; shuffled multi-runs = seeds).
`--config.data.pool_file=PATH` switches any variant to a user's pools.
"""

import ml_collections
import numpy as np

from jaxlab import claims, configs

SEEDS = tuple(range(200, 210))   # claim seeds (issue 24); validation runs use seeds 100-199


def _key(kind, budget):
  return f"sc_rate/{kind}/B{budget}"


def _okg16_vs_uniform32(run):
  return run[_key("offline", 16)] >= run[_key("uniform", 32)]


def _mean_gain(runs):
  return float(np.mean([r[_key("offline", b)] - r[_key("uniform", b)] for r in runs for b in (4, 8)]))


def t_lower_bound(values, level: float = 0.95) -> float:
  """One-sided `level` Student-t lower confidence bound on the mean of `values` (n >= 2)."""
  return claims.t_bound(values, level, "lower")


def _savings(kind):
  """Per-seed `saving_sc1/<kind>`; a seed on which a method never reaches SC = 1 fails the claim (raises)."""
  def values(runs):
    out = [r[f"saving_sc1/{kind}"] for r in runs]
    if any(v is None for v in out):
      raise ValueError(f"{kind} (or its uniform baseline) never reaches SC = 1 on {sum(v is None for v in out)} "
                       "seed(s)")
    return out
  return values


def _reaches_sc1(kind):
  return claims.fraction(lambda r: r[f"budget_at_sc1/{kind}"] is not None)


def _sc1_claims(kind, name, who, short, where, spend, paper):
  """The three SC = 1 claims of one method: it reaches SC = 1 on every seed, and its budget saving over uniform
  there has a positive mean and a positive one-sided 95% t lower bound."""
  return [
      claims.Claim(f"{name}_reaches_sc1", f"{who} reaches SC = 1 {where}, on every seed", _reaches_sc1(kind),
                   ">=", 1.0),
      claims.Claim(f"{name}_saving_sc1", f"mean over seeds of {short}'s budget saving at SC = 1, 1 - {spend} / "
                   f"budget(uniform) at each one's first SC = 1 budget (paper: up to {paper})",
                   lambda runs: float(np.mean(_savings(kind)(runs))), ">", 0.0),
      claims.Claim(f"{name}_saving_sc1_lb95", f"one-sided 95% t lower bound of {short}'s mean saving at SC = 1",
                   lambda runs: t_lower_bound(_savings(kind)(runs)), ">", 0.0),
  ]


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`pets` (PETS, arXiv 2602.16745)",
    claim=("198 simulated questions, 4 options, 64-answer pools, 10 seeds: offline OKG at budget 16 >= uniform "
           "at 32 on every seed; mean OKG gain >= 0.03 at budgets 4 and 8; OKG and PETS online reach SC = 1 on "
           "every seed, and their budget savings at SC = 1 over uniform (paper: up to 75% / 55%) have mean > 0 "
           "and one-sided 95% t lower bound > 0; online spends <= 16 per question at average budget 16"),
    note="see experiments/pets/README.md",
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"data.num_questions": 24, "data.pool_size": 16, "method.budgets": (2, 4), "method.nsamples": 64,
          "online.train_size": 8, "online.budgets": (4, 8), "online.subsample_draws": 100,
          "online.max_per_question": 16}

CLAIMS = [
    claims.Claim("okg16_ge_uniform32", "offline PETS (OKG) at an average budget of 16 >= uniform at 32, on every seed",
                 claims.fraction(_okg16_vs_uniform32), ">=", 1.0),
    claims.Claim("okg_gain_B4_B8", "mean over seeds and budgets {4, 8} of SC(OKG) - SC(uniform)", _mean_gain,
                 ">=", 0.03),
    *_sc1_claims("offline", "okg", "offline OKG", "OKG", "within the budget sweep 1..64", "spend(OKG)", "75%"),
    *_sc1_claims("online", "online", "PETS online", "PETS online", "on the test split within the average-budget "
                 "sweep 4..64", "realised spend(online)", "55%"),
    claims.Claim("online_spend_B16", "online policy's realised answers per test question at average budget 16 "
                 "(worst seed, exact)", claims.maximum("budget/online_spent/B16"), "<=", 16.0),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=full,seed=1")."""
  c, arg = configs.variant_config(arg)
  c.data = ml_collections.ConfigDict(dict(
      pool_file="",            # official PETS JSONL answer pools; "" = simulate
      dataset="simulated",     # what the pools are (informational): simulated | gpqa_diamond | aime24 | ...
      choices="A,B,C,D",       # option names of a multiple-choice file; "" = free-form answers (AIME)
      max_options=8,           # free form: distinct answers kept per question
      conf_metric="mean_confidence",
      shuffle=False,           # shuffle each file pool by the seed (the official multi-run protocol)
      relabel_mv=False,        # pseudo-label = majority of the (shuffled, truncated) pool instead of `final`
      pool_size=64,            # simulated pool size; for files: keep the first pool_size answers (0 = all)
      num_questions=198, num_options=4, easy_prob=0.7, easy_alpha=(20.0, 1.0, 1.0, 1.0),
      hard_alpha=(5.0, 2.0, 1.0, 1.0)))
  c.method = ml_collections.ConfigDict(dict(
      budgets=tuple(range(1, 65)),   # average answers per question at which offline/uniform are scored (stages)
      nsamples=500, c=1.0, batch_size=1, warm_up=1, weighted=False, conf_scale=16.0,
      tie_break="min",        # ONE rule for labels and all votes (offline, uniform, online): the smallest option
      coupled=True))          # common random numbers in the Monte Carlo gains (calibrated, see README)
  c.online = ml_collections.ConfigDict(dict(
      enabled=True, train_size=30, k0=4, budgets=tuple(range(4, 65)), max_per_question=64, k_min_curve=3,
      k_max_curve=40, subsample_draws=2000, curve="probit", probit_eps=1e-12, budget_guard=True))
  if arg.variant == "small":
    c.data.num_questions = 1000
    c.data.pool_size = 128
    c.online.train_size = 100
    c.online.max_per_question = 128
  elif arg.variant == "full":
    c.data.dataset = "gpqa_diamond"
    c.data.shuffle = True
    c.data.relabel_mv = True
  return configs.finalize(c, validate)


def largest_budget(c) -> tuple[int, str]:
  """(the most answers per question the config asks of a pool, the key asking for it)."""
  asks = [(c.method.budgets[-1], "method.budgets")] if len(c.method.budgets) else []
  if c.online.enabled and len(c.online.budgets):
    asks += [(c.online.budgets[-1], "online.budgets"), (c.online.max_per_question, "online.max_per_question")]
  return max(asks, key=lambda a: a[0], default=(0, "method.budgets"))


def validate(c):
  """Experiment-specific checks (run once by configs.finalize, again by configs.apply_overrides)."""
  from jaxlab.errors import ConfigError
  d, m, o = c.data, c.method, c.online
  b = list(m.budgets)
  if not b or any(not isinstance(x, int) or x < 1 for x in b) or b != sorted(set(b)):
    raise ConfigError(f"config.method.budgets={tuple(b)} must be strictly increasing positive integers")
  if m.warm_up < 0 or m.warm_up > b[0]:
    raise ConfigError(f"config.method.warm_up={m.warm_up} must be in [0, smallest budget {b[0]}]")
  if m.nsamples < 1 or m.batch_size < 1:
    raise ConfigError("config.method.nsamples and config.method.batch_size must be >= 1")
  if not (m.c > 0 and m.conf_scale > 0):
    raise ConfigError("config.method.c and config.method.conf_scale must be > 0")
  if m.tie_break not in ("first", "min"):
    raise ConfigError(f"config.method.tie_break={m.tie_break!r}: use min or first")
  if not d.pool_file:
    if d.num_options < 2 or len(d.easy_alpha) != d.num_options or len(d.hard_alpha) != d.num_options:
      raise ConfigError(f"config.data.easy_alpha / hard_alpha need data.num_options={d.num_options} (>= 2) entries")
    if min(d.easy_alpha) <= 0 or min(d.hard_alpha) <= 0 or not 0 <= d.easy_prob <= 1:
      raise ConfigError("config.data.easy_alpha / hard_alpha must be positive and data.easy_prob in [0, 1]")
    if d.num_questions < 2 or d.pool_size < 1:
      raise ConfigError("config.data.num_questions must be >= 2 and data.pool_size >= 1")
    need, key = largest_budget(c)
    if need > d.pool_size:
      raise ConfigError(f"simulated pools hold data.pool_size={d.pool_size} answers per question but config.{key} "
                        f"asks for {need}; raise --config.data.pool_size to >= {need} or lower config.{key}")
  elif d.pool_size < 0 or d.max_options < 2:
    raise ConfigError("config.data.pool_size must be >= 0 (0 = whole pools) and data.max_options >= 2")
  if o.enabled:
    ob = list(o.budgets)
    if not ob or ob != sorted(set(ob)) or ob[0] < o.k0 or ob[-1] > o.max_per_question:
      raise ConfigError(f"config.online.budgets={tuple(ob)} must be increasing, >= online.k0={o.k0} and <= "
                        f"online.max_per_question={o.max_per_question}")
    if o.k0 < 1 or o.train_size < 1 or o.subsample_draws < 1:
      raise ConfigError("config.online.k0, online.train_size and online.subsample_draws must be >= 1")
    if not 1 <= o.k_min_curve < o.k_max_curve:
      raise ConfigError(f"config.online.k_min_curve={o.k_min_curve} must be >= 1 and < k_max_curve={o.k_max_curve}")
    if o.curve not in ("probit", "exact"):
      raise ConfigError(f"config.online.curve={o.curve!r}: use probit (the paper's fits) or exact")
    if not d.pool_file and o.train_size >= d.num_questions:
      raise ConfigError(f"config.online.train_size={o.train_size} leaves no test questions of "
                        f"data.num_questions={d.num_questions}")


def sweep(arg=None):
  """Monte Carlo size x warm-up of the offline allocator (warm-ups up to the smallest budget, 1 answer)."""
  del arg   # every variant's budget sweep starts at 1 answer per question
  return [{"method.nsamples": n, "method.warm_up": w} for n in (100, 500, 2000) for w in (0, 1)]
