"""TaskLoom (ICML 2026, poster 64665: "Weaving Knowledge Across Tasks in World Models"), the agent: online
multi-task RL with a DreamerV3-style RSSM, imagination actor-critic and grouped two-stage world-model sharing.

The agent (`jaxlab.rl.dreamer`) follows DreamerV3 (Hafner et al., arXiv 2301.04104); the grouping by gradient
cosine, the within-group sharing and the exchange across groups are our reconstruction of the abstract (README).

Variants: tiny (the cartpole family: balance, balance_sparse, swingup; 10k environment steps per task, small
networks, CPU), small (the same tasks at 50k steps), full (DMC Proprio, the 18 tasks of DreamerV3 at 500k
steps; "variant=full,visual=True": DMC Visual, 20 tasks, 64x64 pixels, 1M steps, MUJOCO_GL=egl).

Launch: python -m jaxlab.main --config experiments/taskloom_agent/config.py:tiny --workdir /tmp/taskloom_agent
"""

import ml_collections
import numpy as np
from scipy import stats

from jaxlab import claims, configs

SEEDS = (0, 1, 2)              # claim seeds; calibration on validation seeds 100-102 (README)
ARMS = ("single", "shared", "grouped")
CARTPOLE = ("cartpole-balance", "cartpole-balance_sparse", "cartpole-swingup")
PROPRIO = ("acrobot-swingup", "cartpole-balance", "cartpole-balance_sparse", "cartpole-swingup",
           "cartpole-swingup_sparse", "cheetah-run", "ball_in_cup-catch", "finger-spin", "finger-turn_easy",
           "finger-turn_hard", "hopper-hop", "hopper-stand", "pendulum-swingup", "reacher-easy", "reacher-hard",
           "walker-run", "walker-stand", "walker-walk")
VISUAL = PROPRIO + ("quadruped-run", "quadruped-walk")
# issue 73's candidate multi-family suite: two dynamics families, the tasks of a family differing only in reward
SUITE_V2 = ("cartpole-balance", "cartpole-balance_sparse", "reacher-easy", "reacher-hard")


def families(names) -> list[int]:
  """Family label of each "domain-task" name: the index of its domain among the sorted domains (as the offline
  taskloom experiment labels its tasks)."""
  domains = sorted({n.split("-")[0] for n in names})
  return [domains.index(n.split("-")[0]) for n in names]
FINAL_EPISODES = 2             # the "return after the budget": mean of the last training episodes


def final_return(run, arm="single", task=0):
  eps = [e for e in run[f"{arm}/episodes"] if e[0] == task]
  return float(np.mean([e[2] for e in eps[-FINAL_EPISODES:]]))


def vs_random(runs):
  """Smallest ratio over seeds of the single-task agent's final return on the first task to a random policy's."""
  return float(min(final_return(r) / r["baseline/random"][0] for r in runs))


def vs_scripted(runs):
  """Smallest ratio over seeds of the single-task agent's final return to the scripted PD controller's."""
  return float(min(final_return(r) / r["baseline/scripted"][0] for r in runs))


def auc(run, arm):
  """Mean over tasks of the mean training-episode return over the budget (the area under the return curve
  divided by the budget; episodes are equally spaced)."""
  eps = np.asarray(run[f"{arm}/episodes"], np.float64)
  return float(np.mean([eps[eps[:, 0] == t, 2].mean() for t in range(int(eps[:, 0].max()) + 1)]))


def auc_gain(runs):
  return float(np.mean([auc(r, "grouped") - auc(r, "single") for r in runs]))


def auc_gain_low(runs):
  """Lower end of the two-sided 95% t interval, over seeds, of AUC(grouped) - AUC(single) (paired by seed)."""
  d = np.array([auc(r, "grouped") - auc(r, "single") for r in runs])
  if len(d) < 2:
    return float("nan")
  return float(d.mean() - stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`taskloom_agent` (TaskLoom, ICML 2026: the online multi-task Dreamer agent)",
    claim=("cartpole, 10k env steps per task, 3 seeds: the single-task agent's final return on balance >= 2x a "
           "random policy's and >= 0.5x a PD controller's on every seed; on the 3-task cartpole family, grouped "
           "sharing has the larger area under the return curve than single-task agents (95% t interval over "
           "seeds above 0)"),
    note="README: a zero-action policy already scores 0.75x the PD controller on balance",
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"env.env_steps": 1200, "agent.prefill": 100, "agent.train_every": 6.0, "agent.batch_size": 2,
          "agent.seq_len": 16, "agent.imag_starts": 16, "model.deter": 16, "model.hidden": 16, "behavior.hidden": 16,
          "behavior.horizon": 5, "grouping.group_at": 400, "grouping.num_groups": 2, "grouping.grad_batches": 1,
          "method.baseline_episodes": 1, "agent.checkpoint_every": 400}

CLAIMS = [
    claims.Claim("vs_random", "smallest over seeds: final return on cartpole-balance / a random policy's",
                 vs_random, ">=", 2.0),
    claims.Claim("vs_scripted", "smallest over seeds: final return on cartpole-balance / the PD controller's",
                 vs_scripted, ">=", 0.5),
    claims.Claim("auc_gain_low", "lower end of the 95% t interval over seeds of AUC(grouped) - AUC(single), "
                 "mean over the 3 cartpole tasks", auc_gain_low, ">", 0.0),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny", "variant=small,seed=1" or "variant=full,visual=True")."""
  c, arg = configs.variant_config(arg, visual=False)
  c.env = ml_collections.ConfigDict(dict(names=CARTPOLE, envs_per_task=1, action_repeat=4, pixels=False,
                                         image_size=64, workers=0, env_steps=10_000))
  c.model = ml_collections.ConfigDict(dict(deter=64, stoch=8, classes=8, hidden=64, layers=2, emb=4, num_bins=63,
                                           cnn_depth=32, free_nats=1.0))
  c.behavior = ml_collections.ConfigDict(dict(hidden=64, layers=2, horizon=15, gamma=0.99, lam=0.95, entropy=3e-4,
                                              actor_grad="dynamics"))
  # agent: batch_size windows per task per update, one update every train_every agent steps after the prefill.
  c.agent = ml_collections.ConfigDict(dict(batch_size=8, seq_len=32, model_lr=1e-3, actor_lr=3e-4, critic_lr=3e-4,
                                           clip=100.0, train_every=1.0, prefill=250, imag_starts=64,
                                           capacity=1_000_000, checkpoint_every=2000))
  # grouping (arm "grouped"): one shared model until group_at env steps per task, then per-task world-model
  # gradients, clustering (num_groups, 0: by threshold), stage 2 soft-averages `exchange` every exchange_every
  # updates with weight tau; regroup every regroup_every env steps (0: never). The tiny tasks are one family
  # (the same cartpole dynamics), so they form one group; the gradient cosines are still measured and reported.
  c.grouping = ml_collections.ConfigDict(dict(group_at=2000, num_groups=1, threshold=0.5, grad_batches=4,
                                              exclude=("emb", "rew"), exchange=r"^gru/", tau=0.1,
                                              exchange_every=50, regroup_every=0))
  c.method = ml_collections.ConfigDict(dict(arms=("single", "grouped"), baseline_episodes=5, eval_episodes=1))
  if arg.variant == "small":
    c.env.env_steps = 50_000
  elif arg.variant == "full":
    visual = arg.visual
    c.env.update(names=VISUAL if visual else PROPRIO, action_repeat=2, pixels=visual,
                 env_steps=1_000_000 if visual else 500_000, workers=8 if visual else 0)
    # DreamerV3 size S-like world model, its default learning rates, horizon 333 (gamma 0.997), 255 bins.
    c.model.update(deter=512, stoch=32, classes=32, hidden=512, layers=2, emb=16, num_bins=255)
    c.behavior.update(hidden=512, gamma=0.997, actor_grad="reinforce")
    c.agent.update(batch_size=16, seq_len=64, model_lr=1e-4, actor_lr=3e-5, critic_lr=3e-5, clip=1000.0,
                   train_every=2.0, prefill=2500, imag_starts=0, checkpoint_every=50_000)
    c.grouping.update(group_at=50_000, regroup_every=100_000, num_groups=0, threshold=0.5)
    if visual:   # the replay lives on the device: 20 tasks x 25k steps of 64x64x3 uint8 frames is 6.1 GB
      c.agent.capacity = 25_000
    c.method.update(arms=ARMS, eval_episodes=10)
  return configs.finalize(c, validate)


def validate(c):
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  bad = [a for a in c.method.arms if a not in ARMS]
  if bad or not c.method.arms:
    raise ConfigError(f"config.method.arms has {bad or 'nothing'}: use some of {', '.join(ARMS)}")
  if c.behavior.actor_grad not in ("dynamics", "reinforce"):
    raise ConfigError(f"config.behavior.actor_grad={c.behavior.actor_grad!r}: use dynamics or reinforce")
  if c.agent.train_every <= 0:
    raise ConfigError(f"config.agent.train_every={c.agent.train_every} must be > 0 (agent steps per update)")
  if not 0.0 <= c.grouping.tau <= 1.0:
    raise ConfigError(f"config.grouping.tau={c.grouping.tau} must be in [0, 1]")
  if 1000 % c.env.action_repeat:
    raise ConfigError(f"config.env.action_repeat={c.env.action_repeat} must divide the 1000-step dm_control episode")
  per_task = c.env.env_steps // (c.env.action_repeat * c.env.envs_per_task)
  if per_task <= c.agent.prefill:
    raise ConfigError(f"config.env.env_steps={c.env.env_steps} gives {per_task} agent steps, not more than "
                      f"agent.prefill={c.agent.prefill}: raise env_steps or lower the prefill")


def sweep(arg=None):
  del arg
  return [{"grouping.tau": t, "grouping.exchange": e} for t in (0.1, 1.0) for e in (r"^gru/", r"^enc/")]
