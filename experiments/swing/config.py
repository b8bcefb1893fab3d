"""SWING: graph random features on implicit graphs by space walks with a Gumbel-max random-feature proposal.

Paper: Manenti, Dubey, Sehanobish, Alippi, Choromanski, "SWING: Unlocking Implicit Graph Representations
for Graph Random Features", ICML 2026 (arXiv 2602.12703). The estimator is reconstructed (see README).

Variants: tiny (N = 400 Gaussian points in R^3, RBF i-graph with spectral radius 0.5, K = (I - W)^-2,
dense evaluation; downstream label propagation on sklearn digits as 64-d points), small (N = 2000),
full (N = 10^5 points from a user-given .npy point cloud, e.g. Thingi10K/ShapeNet vertices; probe-based
Frobenius error; no materialised baselines).
"""

import ml_collections

from jaxlab import claims, configs

SEEDS = (0, 1, 2)


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`swing` (SWING, arXiv 2602.12703; estimator reconstructed)",
    claim=("on N=400 RBF points, K=(I-W)^-2, 32 walks/node: SWING error <= 0.5x uniform GRF, <= 3x oracle; mean "
           "of 20 estimates within 10% of K, error ~ 1/sqrt(seeds)"),
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"data.n": 96, "method.walks": (4, 8), "method.m": 32, "method.t_max": 6, "eval.unbiased_seeds": 2,
          "eval.unbiased_walks": 4}

CLAIMS = [
    claims.Claim("vs_uniform", "SWING rel. Frobenius error <= 0.5x uniform GRF's at 32 walks/node (mean of 3 seeds)",
                 claims.ratio_of_means("err/swing@32", "err/uniform@32"), "<=", 0.5),
    claims.Claim("vs_oracle", "SWING error <= 3x the oracle proposal's (q ~ W(v, .)) at 32 walks/node",
                 claims.ratio_of_means("err/swing@32", "err/oracle@32"), "<=", 3.0),
    claims.Claim("unbiased", "mean of K_hat over 20 seeds within 10% of K (rel. Frobenius)",
                 claims.mean("unbiased/mean_err"), "<=", 0.10),
    claims.Claim("rate", "error of the mean shrinks about as 1/sqrt(seeds): log-log slope in [-0.75, -0.35]",
                 claims.mean("unbiased/slope"), "in", (-0.75, -0.35)),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  c.data = ml_collections.ConfigDict(dict(
      points="gaussian", path="", n=400, dim=3, graph="rbf", bandwidth=0.6, eps=0.6, sharpness=0.1, rho=0.5))
  c.method = ml_collections.ConfigDict(dict(
      kernel="inverse_squared", p_halt=0.5, t_max=12, walks=(4, 8, 16, 32), m=256, sigma2=4.0, lam=0.8,
      orthogonal=True, proposal_bandwidth=0.0, impl="auto", baselines=True))
  c.eval = ml_collections.ConfigDict(dict(dense_max=4000, probes=16, unbiased_seeds=20, unbiased_walks=32))
  c.downstream = ml_collections.ConfigDict(dict(
      task="digits", labeled_per_class=10, walks=16, bandwidth=1.0, rho=0.5, m=512, sigma2=2.0))
  if arg.variant == "small":
    c.data.n = 2000
    c.method.walks = (4, 8, 16, 32, 64)
  elif arg.variant == "full":
    c.data.points = "npy"
    c.data.n = 100000
    c.method.walks = (16, 32, 64)
    c.method.m = 1024
    c.method.baselines = False
    c.eval.unbiased_seeds = 0
    c.downstream.task = "none"
  return configs.finalize(c, validate)


def validate(c):
  """Experiment-specific checks (run once by configs.finalize, again by configs.apply_overrides)."""
  from jaxlab.errors import ConfigError
  if c.data.graph not in ("rbf", "eps", "smooth_step"):
    raise ConfigError(f"config.data.graph={c.data.graph!r}: use rbf, eps or smooth_step")
  if not 0.0 < c.method.p_halt < 1.0 or not 0.0 < c.method.lam <= 1.0:
    raise ConfigError("config.method.p_halt must be in (0, 1) and config.method.lam in (0, 1]")
  if c.data.points not in ("gaussian", "uniform", "npy"):
    raise ConfigError(f"config.data.points={c.data.points!r}: use gaussian, uniform or npy (with data.path)")
  walks = list(c.method.walks)
  if not walks or min(walks) < 1 or len(set(walks)) != len(walks):
    raise ConfigError(f"config.method.walks={tuple(walks)} must be distinct positive walk counts (one stage each)")
  if c.eval.unbiased_seeds < 0:
    raise ConfigError(f"config.eval.unbiased_seeds={c.eval.unbiased_seeds} must be >= 0 (0 skips the check)")


def sweep(arg=None):
  """Proposal temperature x defensive mixing (the knobs the paper says must be set well)."""
  return [{"method.sigma2": s2, "method.lam": lam} for s2 in (0.5, 1.0, 2.0, 4.0) for lam in (0.6, 0.8, 0.95)]
