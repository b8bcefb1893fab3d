"""OptiVer (Liu, Wang, ..., Yuan, Hao, ICML 2026, arXiv 2605.29556): LLM optimisation modelling with dual-side
verification: structure-side checks of the model against the description, solution-side checks of the solved
plan, and a correction loop driven by their findings.

Only the abstract is public and no code was found; the model format, the checks and the loop are our
reconstruction (`jaxlab.opt_modeling`; README "What comes from where").

Variants: tiny (a SIMULATION: template problems from ground-truth models, a simulated LLM that corrupts the
true model with a set probability; what is claimed is a property of our verifiers, not of the paper's
method), small (the same, 1000 problems), full (a benchmark file, e.g. MAMO / NL4Opt / IndustryOR JSONL from a
path, and a served model through `jaxlab.llm.OpenAICompatBackend`: `--config.data.benchmark=FILE
--config.llm.base_url=http://127.0.0.1:8000 --config.llm.model=NAME`).

Launch: python -m jaxlab.main --config experiments/optiver/config.py:tiny --workdir /tmp/optiver
"""

import ml_collections
import numpy as np

from jaxlab import claims, configs

SEEDS = (0, 1, 2)              # claim seeds: each generates its own 200 problems; calibration used 100, 101, 102
ERROR_TYPES = ("drop_constraint", "flip_inequality", "relax_integrality", "perturb_coefficient", "flip_sense",
               "swap_coefficients")
# Each gated deterministic check and the error types it is meant to catch (pre-registered in the README;
# "nonoptimal": any corrupted model that is infeasible or unbounded).
TARGETS = {
    "number_coverage": ("drop_constraint", "perturb_coefficient"),
    "integrality": ("relax_integrality",),
    "objective_sense": ("flip_sense",),
    "constraint_direction": ("flip_inequality",),
    "status": ("nonoptimal",),
}
CHECKS = ("number_coverage", "integrality", "objective_sense", "unused_variables", "constraint_direction", "units",
          "status", "objective_recompute", "residuals", "sanity", "perturbation")
ARMS = {  # name: (rounds: "K" = loop.rounds, structure side, solution side)
    "baseline": (0, False, False), "structure": ("K", True, False), "solution": ("K", False, True),
    "dual": ("K", True, True), "K1": (1, True, True), "K2": (2, True, True), "K3": (3, True, True)}
MIN_RECALL, MAX_FALSE_ALARM = 0.8, 0.05


def pooled_recall(check: str, types=None):
  """Detections / corruptions of `check`'s target types, pooled over the seeds."""
  def stat(runs):
    kinds = TARGETS[check] if types is None else types
    hit = sum(r.get(f"det/{check}/{t}", 0) for r in runs for t in kinds)
    n = sum(r.get(f"n/{t}", 0) for r in runs for t in kinds)
    if n == 0:
      raise ValueError(f"no corrupted models of types {kinds} to measure {check}'s recall on")
    return hit / n
  return stat


def worst_false_alarm(runs) -> float:
  """The largest false-alarm rate over the deterministic checks on the correct models (pooled over seeds)."""
  n = sum(r["n/correct"] for r in runs)
  return max(sum(r.get(f"det/{c}/correct", 0) for r in runs) / n for c in CHECKS)


def reference_ok(runs) -> float:
  """Fraction of (seed, reference problem) pairs where every solver backend returns the known status and optimum
  and no check flags the correct model."""
  return float(np.mean([r["reference/all_ok"] / r["reference/n"] for r in runs]))


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`optiver` (OptiVer, arXiv 2605.29556; a SIMULATION of the LLM)",
    claim=("600 template problems (3 seeds x 200) with one injected error of each type: each deterministic "
           "verifier's recall on its error types >= 0.8, false alarms on correct models <= 0.05; 13 hand-solved "
           "reference problems: every solver backend returns the known optimum and no check flags them"),
    note="the loop's accuracy gains follow from the simulator's error rates, so they are reported, not claimed",
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"data.num_problems": 12, "loop.rounds": 2}

CLAIMS = [
    *[claims.Claim(f"recall_{c}", f"recall of `{c}` on {' + '.join(TARGETS[c])} corruptions (pooled over seeds)",
                   pooled_recall(c), ">=", MIN_RECALL) for c in TARGETS],
    claims.Claim("false_alarm_max", "largest false-alarm rate of any deterministic check on the correct models",
                 worst_false_alarm, "<=", MAX_FALSE_ALARM),
    claims.Claim("reference_all_backends", "reference problems solved to the known status / optimum by HiGHS, "
                 "scipy and SCIP, and passed by every check", reference_ok, ">=", 1.0),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  # data: simulated template problems (benchmark = ""), or a benchmark file (jaxlab.opt_modeling.benchmarks:
  # MAMO / ORLM / NL4Opt / OptiBench fields) with an optional answer-key errata file; reference: the hand-solved
  # problems with known optima ("" = experiments/optiver/reference_problems.json).
  c.data = ml_collections.ConfigDict(dict(num_problems=200, families=(), benchmark="", benchmark_format="auto",
                                          errata="", limit=0, reference=""))
  # simulator (tiny / small): the formulator errs with p_error (one of `types`), the corrector, asked only with
  # findings, with p_error * correct_factor.
  c.simulator = ml_collections.ConfigDict(dict(p_error=0.6, correct_factor=0.3, types=ERROR_TYPES))
  # llm: "simulated" | "openai" (base_url, model, key from the api_key_env variable) | "local" (model_dir: a
  # jaxlab run or HF checkpoint) | "replay" (replay_file); cache_dir keeps every answer (resumable, replayable).
  c.llm = ml_collections.ConfigDict(dict(backend="simulated", base_url="", model="", api_key_env="OPENAI_API_KEY",
                                         model_dir="", replay_file="", cache_dir="", temperature=0.0,
                                         max_tokens=2048, max_concurrency=8))
  # loop: correction rounds K, the arms to run (`ARMS`), the solver, whether the LLM checks run too, the
  # scoring tolerances (relative; ORLM's 5% and a strict 1e-4).
  c.loop = ml_collections.ConfigDict(dict(rounds=3, arms=("baseline", "structure", "solution", "dual"),
                                          solver="highs", llm_checks=False, tols=(1e-4, 0.05), time_limit=60.0,
                                          prompts=""))
  c.verifiers = ml_collections.ConfigDict(dict(enabled=True, solvers=("highs", "scipy", "scip")))
  if arg.variant == "small":
    c.data.num_problems = 1000
  elif arg.variant == "full":
    c.llm.backend = "openai"
    c.loop.arms = ("K0", "K1", "K2", "K3", "structure", "solution")
    c.loop.llm_checks = True
    c.verifiers.enabled = False       # no ground-truth models to corrupt in a benchmark file
  return configs.finalize(c, validate)


def validate(c):
  """Experiment-specific checks (run by configs.finalize and again by configs.apply_overrides)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  d, s, l, lp = c.data, c.simulator, c.llm, c.loop
  arms = [a for a in lp.arms if a not in ARMS and a != "K0"]
  if arms or not lp.arms:
    raise ConfigError(f"config.loop.arms has {arms or 'nothing'}: use some of {', '.join(['K0', *ARMS])}")
  if lp.rounds < 0:
    raise ConfigError(f"config.loop.rounds={lp.rounds} must be >= 0")
  if lp.solver not in ("highs", "scipy", "scip"):
    raise ConfigError(f"config.loop.solver={lp.solver!r}: use highs, scipy or scip")
  if not lp.tols or min(lp.tols) < 0:
    raise ConfigError(f"config.loop.tols={tuple(lp.tols)} must be non-negative relative tolerances")
  if l.backend not in ("simulated", "openai", "local", "replay"):
    raise ConfigError(f"config.llm.backend={l.backend!r}: use simulated, openai, local or replay")
  if l.backend == "simulated" and d.benchmark:
    raise ConfigError("config.data.benchmark needs a real LLM: set config.llm.backend to openai, local or replay "
                      "(the simulated LLM only knows the template problems)")
  if not 0 <= s.p_error <= 1 or not 0 <= s.correct_factor <= 1:
    raise ConfigError("config.simulator.p_error and correct_factor must be in [0, 1]")
  bad = [t for t in s.types if t not in ERROR_TYPES]
  if bad or not s.types:
    raise ConfigError(f"config.simulator.types has {bad or 'nothing'}: use some of {', '.join(ERROR_TYPES)}")
  if d.num_problems < 1:
    raise ConfigError(f"config.data.num_problems={d.num_problems} must be >= 1")


def check_inputs(c):
  """The user's inputs a run needs (checked when it starts, so `full` builds without them): a benchmark file for a
  real LLM, and that LLM's address, checkpoint or recording."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  d, l = c.data, c.llm
  if l.backend != "simulated" and not d.benchmark:
    raise ConfigError(f"config.llm.backend={l.backend} needs problems: set --config.data.benchmark=FILE.jsonl "
                      "(MAMO, NL4Opt, IndustryOR or OptiBench fields)")
  need = {"openai": ("base_url", "model"), "local": ("model_dir",), "replay": ("replay_file",)}.get(l.backend, ())
  missing = [k for k in need if not l[k]]
  if missing:
    raise ConfigError(f"config.llm.backend={l.backend} needs " + ", ".join(f"--config.llm.{k}" for k in missing))


def sweep(arg=None):
  """The simulated formulator's error rate x the correction rounds."""
  del arg
  return [{"simulator.p_error": p, "loop.rounds": k} for p in (0.3, 0.6, 0.9) for k in (1, 2, 3)]
