"""Robust Q: corruption-tolerant asynchronous Q-learning (trimmed-mean rewards) vs vanilla under corrupted rewards.

Paper: S. Maity, A. Mitra, "Corruption-Tolerant Asynchronous Q-Learning with Near-Optimal Rates", ICML 2026
(arXiv 2509.08933); robust estimator from their "Robust Q-Learning under Corrupted Rewards" (arXiv 2409.03237).
The algorithm details are reconstructed (see README).

Variants: tiny (a CPU-sized experiment: S = 10, A = 2, gamma = 0.9, T = 30k steps of one trajectory under a
uniform behaviour policy, rewards r(s, a) + N(0, 0.5^2), epsilon = 0.1 per-pair budget, burn-in 20, six
corruption settings vmapped in one program), small (S = 20, T = 3e5, 4 seeds), full (S = 100, A = 5,
gamma = 0.99, T = 10^7, 20 seeds x 8 corruption settings vmapped, for an accelerator).

Launch: python -m jaxlab.main --config experiments/robust_q/config.py:tiny --workdir /tmp/robust_q
"""

import ml_collections
import numpy as np

from jaxlab import claims, configs

SEEDS = (0, 1, 2)
VANILLA, ROBUST = "vanilla", "trimmed"


def eps_key(metric, estimator, eps):
  """Summary key of `metric` for an estimator at corruption level eps (main magnitude)."""
  return f"{metric}/{estimator}/eps_{float(eps):g}"


def mag_key(metric, estimator, magnitude):
  """Summary key of `metric` for an estimator at corruption magnitude M (main epsilon)."""
  return f"{metric}/{estimator}/M_{float(magnitude):g}"


def _max_gap(a, b):
  return lambda runs: float(np.max([abs(r[a] - r[b]) for r in runs]))


_Q = "q_error"
RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`robust_q` (Robust Async-Q, Maity & Mitra, arXiv 2509.08933; estimator reconstructed)",
    claim=("S=10, gamma=0.9, T=30k, eps=0.1 per-pair budget: vanilla error > 50 at corruption 100 and > 5000 at "
           "10^4; trimmed-mean error < 1.5 at both and independent of the size (< 0.1); greedy suboptimality < "
           "0.1; at eps=0 robust <= 2x vanilla; err(0.1)/err(0.05) in [1.3, 3]"),
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"mdp.num_states": 4, "method.horizon": 600, "method.stage_steps": 200, "train.checkpoint_every": 1,
          "method.capacity": 64, "method.burn_in": 5}

CLAIMS = [
    claims.Claim("vanilla_M100", "vanilla Q-learning error ||Q_T - Q*||_inf > 50 at eps = 0.1, M = 100 (mean of seeds)",
                 claims.mean(mag_key(_Q, VANILLA, 100)), ">", 50.0),
    claims.Claim("vanilla_M1e4", "vanilla Q-learning error > 5000 at eps = 0.1, M = 10^4 (unbounded in M)",
                 claims.mean(mag_key(_Q, VANILLA, 1e4)), ">", 5000.0),
    claims.Claim("robust_M100", "robust (trimmed-mean) Q-learning error < 1.5 at eps = 0.1, M = 100",
                 claims.mean(mag_key(_Q, ROBUST, 100)), "<", 1.5),
    claims.Claim("robust_M1e4", "robust Q-learning error < 1.5 at eps = 0.1, M = 10^4",
                 claims.mean(mag_key(_Q, ROBUST, 1e4)), "<", 1.5),
    claims.Claim("robust_M_invariant", "robust error independent of M: |err(M=10^4) - err(M=100)| < 0.1 (worst seed)",
                 _max_gap(mag_key(_Q, ROBUST, 1e4), mag_key(_Q, ROBUST, 100)), "<", 0.1),
    claims.Claim("robust_policy", "robust greedy policy suboptimality max_s V* - V^pi < 0.1 at eps = 0.1, M = 100",
                 claims.mean(mag_key("suboptimality", ROBUST, 100)), "<", 0.1),
    claims.Claim("clean_cost", "at eps = 0 the robust error is <= 2x vanilla's (ratio of seed means)",
                 claims.ratio_of_means(eps_key(_Q, ROBUST, 0), eps_key(_Q, VANILLA, 0)), "<=", 2.0),
    claims.Claim("linear_in_eps", "robust error grows about linearly in eps: err(0.1) / err(0.05) in [1.3, 3]",
                 claims.ratio_of_means(eps_key(_Q, ROBUST, 0.1), eps_key(_Q, ROBUST, 0.05)), "in", (1.3, 3.0)),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  c.mdp = ml_collections.ConfigDict(dict(
      num_states=10, num_actions=2, gamma=0.9, dirichlet=0.5, reward_low=0.0, reward_high=1.0,
      noise="gaussian", noise_scale=0.5, noise_df=3.0))
  c.corruption = ml_collections.ConfigDict(dict(epsilon=0.1, magnitude=100.0, model="big", budget="per_pair"))
  c.method = ml_collections.ConfigDict(dict(
      estimators=("vanilla", "mean", "median", "mom", "trimmed", "trimmed_known"),
      horizon=30_000, stage_steps=1000, burn_in=20, step_size="rescaled_linear", step_constant=0.1,
      step_power=0.8, delta=0.01, eps_factor=8.0, log_factor=24.0, mom_max_block=16, known_range=(0.0, 1.0),
      capacity=4096, behaviour="uniform", behaviour_eps=0.2))
  # Corruption grid run alongside the main setting (eps at the main M; M at the main eps), in one program.
  c.grid = ml_collections.ConfigDict(dict(
      epsilons=(0.0, 0.025, 0.05, 0.1, 0.2), magnitudes=(100.0, 10_000.0), seeds=1, fit_from=0.1))
  # run_loop's logging / checkpoint cadence only: one loop step is a stage of method.stage_steps Q-learning steps
  # (method.horizon / method.stage_steps of them); the batch is grid.seeds x corruption settings.
  c.train = configs.train_config(optimizer=None, batch_size=None, eval_batch_size=None, num_steps=None,
                                 eval_every=None, init_from=None, log_every=1, checkpoint_every=10)
  if arg.variant == "small":
    c.mdp.num_states = 20
    c.method.horizon = 300_000
    c.method.stage_steps = 10_000
    c.method.capacity = 16_384
    c.grid.seeds = 4
  elif arg.variant == "full":
    c.mdp.num_states = 100
    c.mdp.num_actions = 5
    c.mdp.gamma = 0.99
    c.method.horizon = 10_000_000
    c.method.stage_steps = 100_000
    c.method.capacity = 32_768
    c.method.estimators = ("vanilla", "mean", "median", "trimmed")
    c.grid.epsilons = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)
    c.grid.magnitudes = (10.0, 100.0, 10_000.0)
    c.grid.seeds = 20
  return configs.finalize(c, validate)


def validate(c):
  """Experiment-specific checks (run once by configs.finalize, again by configs.apply_overrides)."""
  from jaxlab.errors import ConfigError
  from jaxlab.rl.tabular import adversary, estimators, q_learning
  m, cor, g, d = c.method, c.corruption, c.grid, c.mdp
  if m.horizon <= 0 or m.stage_steps <= 0 or m.horizon % m.stage_steps:
    raise ConfigError(f"config.method.horizon={m.horizon} must be a positive multiple of "
                      f"config.method.stage_steps={m.stage_steps}")
  if cor.model not in adversary.MODELS:
    raise ConfigError(f"config.corruption.model={cor.model!r}: use one of {adversary.MODELS}")
  if cor.budget not in adversary.BUDGETS:
    raise ConfigError(f"config.corruption.budget={cor.budget!r}: use one of {adversary.BUDGETS}")
  for name, eps in [("corruption.epsilon", cor.epsilon)] + [("grid.epsilons", e) for e in g.epsilons]:
    if not 0.0 <= eps < 0.5:
      raise ConfigError(f"config.{name} has epsilon={eps}: corruption fractions must be in [0, 0.5)")
  for name, mag in [("corruption.magnitude", cor.magnitude)] + [("grid.magnitudes", v) for v in g.magnitudes]:
    if not np.isfinite(mag):
      raise ConfigError(f"config.{name} has magnitude={mag}: use a finite reward value")
  bad = [e for e in m.estimators if e not in estimators.ESTIMATORS]
  if bad or not m.estimators:
    raise ConfigError(f"config.method.estimators={tuple(m.estimators)}: use a non-empty subset of "
                      f"{estimators.ESTIMATORS}")
  if m.step_size not in q_learning.STEP_SIZES:
    raise ConfigError(f"config.method.step_size={m.step_size!r}: use one of {q_learning.STEP_SIZES}")
  if m.behaviour not in q_learning.BEHAVIOURS:
    raise ConfigError(f"config.method.behaviour={m.behaviour!r}: use one of {q_learning.BEHAVIOURS}")
  if d.noise not in q_learning.NOISES:
    raise ConfigError(f"config.mdp.noise={d.noise!r}: use one of {q_learning.NOISES}")
  if d.noise == "student_t" and d.noise_df <= 2:
    raise ConfigError(f"config.mdp.noise_df={d.noise_df} must be > 2 (the reward noise needs a finite variance)")
  if not 0.0 <= d.gamma < 1.0:
    raise ConfigError(f"config.mdp.gamma={d.gamma} must be in [0, 1)")
  if d.num_states < 1 or d.num_actions < 1 or d.dirichlet <= 0 or d.noise_scale < 0:
    raise ConfigError("config.mdp needs num_states >= 1, num_actions >= 1, dirichlet > 0 and noise_scale >= 0")
  if m.capacity < 2 or m.burn_in < 0 or not 0.0 < m.delta < 1.0 or m.mom_max_block < 1:
    raise ConfigError("config.method needs capacity >= 2, burn_in >= 0, 0 < delta < 1 and mom_max_block >= 1 "
                      f"(got {m.capacity}, {m.burn_in}, {m.delta}, {m.mom_max_block})")
  if m.step_size == "constant" and not 0.0 < m.step_constant <= 1.0:
    raise ConfigError(f"config.method.step_constant={m.step_constant} must be in (0, 1]")
  if not 0.0 <= m.behaviour_eps <= 1.0:
    raise ConfigError(f"config.method.behaviour_eps={m.behaviour_eps} must be in [0, 1]")
  if len(m.known_range) != 2 or m.known_range[0] > m.known_range[1]:
    raise ConfigError(f"config.method.known_range={tuple(m.known_range)} must be (low, high) with low <= high")
  if g.seeds < 1 or not 0.0 <= g.fit_from < 1.0:
    raise ConfigError(f"config.grid.seeds={g.seeds} must be >= 1 and grid.fit_from={g.fit_from} in [0, 1)")


def sweep(arg=None):
  """tiny/small: corruption model x budget x burn-in (+ Markovian behaviour); full: S x A x gamma."""
  variant = configs.parse_arg(arg, variant="tiny", seed=0).variant
  if variant == "full":
    return [{"mdp.num_states": s, "mdp.num_actions": a, "mdp.gamma": g}
            for s in (20, 50, 100) for a in (2, 5) for g in (0.9, 0.99)]
  pts = [{"corruption.model": m, "corruption.budget": b, "method.burn_in": n0}
         for m in ("big", "targeted") for b in ("per_pair", "global") for n0 in (0, 20)]
  return pts + [{"method.behaviour": "eps_greedy"}]
