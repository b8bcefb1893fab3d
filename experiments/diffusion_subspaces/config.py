"""Diffusion sample complexity on unions of low-dim subspaces: W1 of a KDE-score sampler ~ n^{-1/max(k,2)}.

Paper: J. Wu, C. Cai, "Diffusion Models Are Statistically Optimal for Learning Low-Dimensional Multi-Modal
Distributions", ICML 2026 (arXiv 2605.30153; OpenReview title "Optimal Statistical Guarantees for Diffusion
Models on Low-Dimensional, Multi-Modal Data"). A theory paper: W1(generated, p_data) <= eps with
n = O~(eps^{-(k v 2)}) training samples for data on a union of M k-dim subspaces of R^D, independent of D. The
score estimator is the Gaussian-smoothed empirical (kernel-density) score; its truncation and the sampler's
details are reconstructed (see README).

Variants: tiny (three settings (D, k, M) = (32, 3, 3), (3, 3, 1), (8, 8, 1); n in {128, ..., 1024};
100 exponential-integrator steps from T = 6 to delta = 1e-3; exact W1 by POT), small (n up to 4096, plus the
DSM-trained score network), full (the paper-scale grid k in {1, 2, 3, 4, 6}, D in {16, 64, 256, 1024},
M in {1, 3, 10}, n up to 3 * 10^4 with entropic W1 beyond `eval.exact_max`; for an accelerator).

Launch: python -m jaxlab.main --config experiments/diffusion_subspaces/config.py:tiny --workdir /tmp/dsub
"""

import ml_collections
import numpy as np

from jaxlab import claims, configs

SEEDS = (0, 1, 2)
SCORES = ("kde", "dsm")
SAMPLERS = ("exponential", "euler_maruyama")


def setting_name(setting) -> str:
  """'D32_k3_M3' for the setting (D, k, M)."""
  d, k, m = (int(v) for v in setting)
  return f"D{d}_k{k}_M{m}"


UOS, FULLDIM, CURSE = "D32_k3_M3", "D3_k3_M1", "D8_k8_M1"


def _slope_gap(a, b):
  return lambda runs: abs(float(np.mean([r[f"slope/kde/{a}"] for r in runs]) -
                              np.mean([r[f"slope/kde/{b}"] for r in runs])))


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`diffusion_subspaces` (Wu & Cai, arXiv 2605.30153; KDE score estimator and sampler reconstructed)",
    claim=("diffusion sampler with the closed-form smoothed-empirical score on unions of subspaces: slope of log"
           " W1 vs log n at D=32, k=3, M=3 in [-0.40, -0.25]; full-rank D=8 slope in [-0.20, -0.08]; "
           "\\|slope(D=32) - slope(D=3)\\| <= 0.08 at k=3; W1(generated) <= 1.3x W1(training set) at every n; mean"
           " distance to the union <= 0.05; subspace shares within 0.1 of 1/M"),
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"data.settings": ((8, 2, 2),), "data.ns": (32, 64), "method.steps": 20, "method.chunk": 16,
          "eval.projections": 16}

CLAIMS = [
    claims.Claim("rate_union", "D=32, k=3, M=3: fitted slope of log W1(generated, fresh) vs log n in [-0.40, -0.25] "
                 "(theory -1/3; mean of 3 seeds)", claims.mean(f"slope/kde/{UOS}"), "in", (-0.40, -0.25)),
    claims.Claim("rate_fullrank", "full-rank D=8 (k=8, M=1): slope in [-0.20, -0.08] (theory -1/8, the curse of "
                 "dimensionality)", claims.mean(f"slope/kde/{CURSE}"), "in", (-0.20, -0.08)),
    claims.Claim("ambient_free", "|slope(D=32, k=3) - slope(D=3, k=3)| <= 0.08 (rate independent of D; seed means)",
                 _slope_gap(UOS, FULLDIM), "<=", 0.08),
    claims.Claim("near_baseline", "W1(generated) <= 1.3x W1(training set) at every n, setting and seed (worst ratio)",
                 claims.maximum("w1_ratio_max/kde"), "<=", 1.3),
    claims.Claim("near_union", "D=32, k=3, M=3 at the largest n: mean distance of generated points to the nearest "
                 "subspace <= 0.05 (worst seed)", claims.maximum(f"union_dist/kde/{UOS}"), "<=", 0.05),
    claims.Claim("modes", "D=32, k=3, M=3 at the largest n: every subspace's share of generated points within 0.1 "
                 "of 1/M (worst seed)", claims.maximum(f"freq_dev/kde/{UOS}"), "<=", 0.1),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  c.data = ml_collections.ConfigDict(dict(
      settings=((32, 3, 3), (3, 3, 1), (8, 8, 1)), ns=(128, 256, 512, 1024), coords="gaussian"))
  c.method = ml_collections.ConfigDict(dict(
      sampler="exponential", steps=100, t_max=6.0, t_min=1e-3, final_denoise=True, chunk=512, batch_chunk=0))
  c.learned = ml_collections.ConfigDict(dict(
      enabled=False, width=256, depth=3, steps=3000, batch=256, learning_rate=2e-3))
  c.eval = ml_collections.ConfigDict(dict(exact_max=8192, sinkhorn_epsilon=2e-3, projections=128))
  if arg.variant == "small":
    c.data.ns = (128, 256, 512, 1024, 2048, 4096)
    c.method.steps = 150
    c.learned.enabled = True
  elif arg.variant == "full":
    c.data.settings = tuple((d, k, m) for k in (1, 2, 3, 4, 6) for d in (16, 64, 256, 1024) for m in (1, 3, 10))
    c.data.ns = (1000, 3000, 10000, 30000)
    c.method.steps = 200
    c.method.chunk = 4096
    c.method.batch_chunk = 8192
    c.learned.enabled = True
    c.learned.steps = 20000
    c.learned.width = 512
  return configs.finalize(c, validate)


def stages(c) -> list[tuple[str, int, int]]:
  """The run's stages in order: (score, setting index, n index) for each score, setting and n."""
  scores = SCORES if c.learned.enabled else SCORES[:1]
  return [(s, i, j) for s in scores for i in range(len(c.data.settings)) for j in range(len(c.data.ns))]


def stage_name(c, stage: tuple[str, int, int]) -> str:
  """'kde/D32_k3_M3@128' for the stage (score, setting index, n index)."""
  score, i, j = stage
  return f"{score}/{setting_name(c.data.settings[i])}@{int(c.data.ns[j])}"


def validate(c):
  """Experiment-specific checks (run once by `configs.finalize` and again by `configs.apply_overrides`)."""
  from jaxlab.errors import ConfigError
  if not c.data.settings:
    raise ConfigError("config.data.settings is empty: give (D, k, M) triples, e.g. ((32, 3, 3),)")
  for s in c.data.settings:
    if len(s) != 3 or not all(isinstance(v, (int, np.integer)) for v in s):
      raise ConfigError(f"config.data.settings: each entry must be an integer triple (D, k, M), got {s!r}")
    d, k, m = s
    if not 1 <= k <= d or m < 1:
      raise ConfigError(f"config.data.settings: need 1 <= k <= D and M >= 1, got (D, k, M) = {tuple(s)}")
  names = [setting_name(s) for s in c.data.settings]
  if len(set(names)) != len(names):
    raise ConfigError(f"config.data.settings={tuple(map(tuple, c.data.settings))} repeats a setting; list each "
                      "(D, k, M) once")
  ns = list(c.data.ns)
  if len(ns) < 2 or any(int(n) < 2 for n in ns) or ns != sorted(set(ns)):
    raise ConfigError(f"config.data.ns={tuple(ns)}: need >= 2 strictly increasing sample sizes >= 2 for a slope")
  if c.data.coords not in ("gaussian", "uniform"):
    raise ConfigError(f"config.data.coords={c.data.coords!r}: use gaussian or uniform")
  if c.method.sampler not in SAMPLERS:
    raise ConfigError(f"config.method.sampler={c.method.sampler!r}: use one of {SAMPLERS}")
  if not 0.0 < c.method.t_min < c.method.t_max:
    raise ConfigError(f"need 0 < config.method.t_min < config.method.t_max, got {c.method.t_min}, {c.method.t_max}")
  if c.method.steps < 1 or c.method.chunk < 1 or c.method.batch_chunk < 0:
    raise ConfigError("config.method.steps and config.method.chunk must be >= 1, config.method.batch_chunk >= 0")
  if c.learned.enabled and (c.learned.steps < 1 or c.learned.batch < 1 or c.learned.width < 1):
    raise ConfigError("config.learned.steps, batch and width must be >= 1")
  if c.eval.projections < 1 or c.eval.sinkhorn_epsilon <= 0:
    raise ConfigError("config.eval.projections must be >= 1 and config.eval.sinkhorn_epsilon > 0")


def sweep(arg=None):
  """Ambient dimension x intrinsic dimension x number of subspaces, one setting per point (all ns each)."""
  del arg
  return [{"data.settings": ((d, k, m),)}
          for k in (1, 2, 3, 4, 6) for d in (16, 64, 256, 1024) for m in (1, 3, 10) if k <= d]
