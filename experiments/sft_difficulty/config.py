"""Data difficulty in SFT: the optimal difficulty shifts harder as the data budget grows (n x difficulty grid).

Paper: S. Liu, T. Chen, X. Li, Y. Wang, J. Zhang, "Data Difficulty and the Generalization-Extrapolation
Tradeoff in LLM Fine-Tuning", ICML 2026 (arXiv 2605.12906; no public code). Only the abstract was reachable:
the synthetic model, its sizes and the thresholds are ours (README).

Two arms, each a budget x difficulty grid:
* (a) `synthetic` (stage "synthetic"): the controlled linear-Gaussian model of `method.py` (difficulty = the
  highest frequency a problem excites, a Gaussian prior at the pretrained low-frequency solution, the hardest
  level as target), with its exact PAC-Bayes terms. The claims are checked on it.
* (b) `lm` (stages "lm/pretrain", "lm/d<d>/n<n>"): a small Llama pretrained on easy addition, SFT'd on n problems
  of difficulty d (operand digits), evaluated on a harder target mix (`lm_arm.py`; reported, not gated).

Variants: tiny (arm a only; the claims), small (arm a + the LM arm's grid), full (arm b from a local checkpoint and
a JSONL with a difficulty field, n in {1k, 5k, 20k, 94k}; see README).

Launch: python -m jaxlab.main --config experiments/sft_difficulty/config.py:tiny --workdir /tmp/sft_difficulty
"""

import ml_collections
import numpy as np

from jaxlab import claims, configs

from . import lm_arm

SEEDS = (0, 1, 2, 3, 4)


def _seed_mean_grid(runs, key):
  return np.mean([np.asarray(r[key]) for r in runs], axis=0)


def _dstar_min_step(runs):
  """min over consecutive budgets of d*(n_{i+1}) - d*(n_i), d* of the seed-mean target error (>= 0: never easier)."""
  grid = _seed_mean_grid(runs, "grid/target_err")
  dstar = np.argmin(grid, axis=1) + 1
  return float(np.min(np.diff(dstar)))


def _gen_max_step_over_n(runs):
  """max over difficulties and consecutive budgets of the seed-mean generalisation gap's change (< 0: it falls)."""
  return float(np.max(np.diff(_seed_mean_grid(runs, "grid/gen_gap"), axis=0)))


def _bound_tracks(summary):
  sign = lambda x: (x > 0) - (x < 0)  # noqa: E731
  return sign(summary["dstar_bound/nmax"] - summary["dstar_bound/nmin"]) == sign(
      summary["dstar/nmax"] - summary["dstar/nmin"])


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`sft_difficulty` (Data difficulty in SFT, arXiv 2605.12906; synthetic model reconstructed)",
    claim=("linear-Gaussian fine-tuning model, 8 difficulty levels (highest frequency excited) x 7 budgets (16-1024), "
           "5 seeds: the target-optimal difficulty d*(n) never gets easier with n (seed means) and is harder at "
           "n = 1024 than at n = 16 on every seed; the generalisation gap rises with d at n = 16 (Spearman >= 0.8, "
           "every seed) and falls with n at every d; the extrapolation gap falls with d (Spearman <= -0.8); the "
           "Catoni PAC-Bayes bound's argmin over d moves the same way as d* on every seed"),
)

# Pre-registered (README, "Calibration"): thresholds from the issue; the model's sizes were fixed on a numpy
# prototype over validation worlds 1000-1019 and checked on worlds 1000-1099 before the claim seeds ran.
# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"synthetic.levels": 4, "synthetic.budgets": (8, 32, 128), "synthetic.repeats": 3,
          "synthetic.target_inputs": 256}

CLAIMS = [
    claims.Claim("dstar_never_easier", "min over consecutive budgets of the step of d*(n) = argmin_d seed-mean "
                 "target error (>= 0: non-decreasing in n)", _dstar_min_step, ">=", 0),
    claims.Claim("dstar_harder", "min over seeds of d*(n_max) - d*(n_min) (> 0: harder at n = 1024 on every seed)",
                 lambda runs: min(r["dstar/nmax"] - r["dstar/nmin"] for r in runs), ">", 0),
    claims.Claim("gen_rises_with_d", "min over seeds of Spearman(d, generalisation gap) at n_min = 16",
                 lambda runs: min(r["gen_spearman"][0] for r in runs), ">=", 0.8),
    claims.Claim("gen_falls_with_n", "max over d and consecutive budgets of the seed-mean generalisation gap's "
                 "change (< 0: falls with n at every d)", _gen_max_step_over_n, "<", 0),
    claims.Claim("extrap_falls_with_d", "max over seeds and budgets of Spearman(d, extrapolation gap)",
                 lambda runs: max(max(r["extrap_spearman"]) for r in runs), "<=", -0.8),
    claims.Claim("bound_tracks_dstar", "fraction of seeds where the Catoni bound's argmin over d moves between n_min "
                 "and n_max with the same sign as the measured d*", claims.fraction(_bound_tracks), ">=", 1.0),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=2")."""
  c, arg = configs.variant_config(arg)
  c.synthetic = ml_collections.ConfigDict(dict(
      enabled=True, levels=8, amplitude=0.5, decay=2.0, pretrained_levels=1, input_scale=1.0, noise=1.0,
      ridge=0.1, budgets=(16, 32, 64, 128, 256, 512, 1024), repeats=32, target_inputs=4096))
  c.bound = ml_collections.ConfigDict(dict(prior_var=0.25, tau=1.0, delta=0.05, catoni_c=1.0))
  c.lm = lm_arm.default_config()
  c.lm.enabled = False
  if arg.variant == "small":
    c.synthetic.update(levels=10, budgets=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096), repeats=64)
    c.lm.enabled = True
  elif arg.variant == "full":
    # the LM arm on a user's checkpoint and difficulty-labelled JSONL (e.g. OpenR1-Math scored by `score`, levels
    # in a field); set lm.model.hf_path, lm.data.path and lm.data.target_path
    c.synthetic.enabled = False
    c.lm.enabled = True
    c.lm.tokenizer = "hf"
    c.lm.data.update(source="jsonl", difficulty_key="difficulty_bucket", seq_len=4096)
    c.lm.difficulties = (0, 1, 2)
    c.lm.budgets = (1000, 5000, 20000, 94000)
    c.lm.sft.update(steps=3000, batch=64, lr=1e-5, warmup=100)
    c.lm.eval.update(n_id=500, n_target=500, batch=64, max_new_tokens=2048)
  return configs.finalize(c, validate)


def validate(c):
  """Experiment-specific checks (run once by `configs.finalize` and again by `configs.apply_overrides`)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  s, b = c.synthetic, c.bound
  if s.enabled:
    if s.levels < 2:
      raise ConfigError(f"config.synthetic.levels={s.levels}: need at least 2 difficulty levels")
    if not 0 <= s.pretrained_levels < s.levels:
      raise ConfigError(f"config.synthetic.pretrained_levels={s.pretrained_levels} must be in [0, levels - 1]")
    budgets = tuple(s.budgets)
    if len(budgets) < 2 or any(n < 1 for n in budgets) or list(budgets) != sorted(set(budgets)):
      raise ConfigError(f"config.synthetic.budgets={budgets}: need >= 2 distinct positive sizes in increasing order")
    if min(s.amplitude, s.input_scale, s.noise, s.ridge) <= 0 or s.decay < 0:
      raise ConfigError("config.synthetic: amplitude, input_scale, noise and ridge must be > 0 and decay >= 0")
    if s.repeats < 1 or s.target_inputs < 1:
      raise ConfigError("config.synthetic.repeats and config.synthetic.target_inputs must be >= 1")
  if c.lm.enabled:
    lm_arm.validate(c.lm)
  if not s.enabled and not c.lm.enabled:
    raise ConfigError("both arms are off: set config.synthetic.enabled or config.lm.enabled to True")
  if b.prior_var <= 0 or b.tau <= 0 or b.catoni_c <= 0 or not 0 < b.delta < 1:
    raise ConfigError("config.bound: prior_var, tau and catoni_c must be > 0 and delta in (0, 1)")


def sweep(arg=None):
  """tiny / small: the ridge strength (how strongly fine-tuning stays at the pretrained weights) x the spectrum's
  decay; full: one point (one cluster job) per SFT budget of the LM arm."""
  if configs.parse_arg(arg, variant="tiny", seed=0).variant == "full":
    return [{"lm.budgets": (n,)} for n in (1000, 5000, 20000, 94000)]
  return [{"synthetic.ridge": r, "synthetic.decay": a} for r in (0.1, 1.0, 4.0) for a in (1.5, 2.0, 3.0)]
