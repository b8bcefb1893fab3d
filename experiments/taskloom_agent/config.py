"""TaskLoom (ICML 2026, poster 64665: "Weaving Knowledge Across Tasks in World Models"), the agent: online
multi-task RL with a DreamerV3-style RSSM, imagination actor-critic and grouped two-stage world-model sharing.

The agent (`jaxlab.rl.dreamer`) follows DreamerV3 (Hafner et al., arXiv 2301.04104); the grouping by gradient
cosine, the within-group sharing and the exchange across groups are our reconstruction of the abstract (README).

Variants: tiny (claims v2: two dynamics families, cartpole balance / balance_sparse and reacher easy / hard, 10k
environment steps per task, small networks, CPU; plus cartpole-balance alone for 30k steps), tiny_v1 (the v1
claim setting: the cartpole family balance, balance_sparse, swingup and the v1 agent), small (the v2 suite at 50k
steps), full (DMC Proprio, the 18 tasks of DreamerV3 at 500k steps; "variant=full,visual=True": DMC Visual, 20
tasks, 64x64 pixels, 1M steps, MUJOCO_GL=egl).

Launch: python -m jaxlab.main --config experiments/taskloom_agent/config.py:tiny --workdir /tmp/taskloom_agent
"""

import ml_collections
import numpy as np
from scipy import stats

from jaxlab import claims, configs

SEEDS = tuple(range(10, 20))   # v2 claim seeds, never run before (v1's were 0-2; validation seeds 100+, README)
SEEDS_V1 = (0, 1, 2)           # the v1 claim seeds (variant tiny_v1; README)
VARIANTS = ("tiny", "tiny_v1", "small", "full")   # tiny_v1: the v1 claim setting (README)
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


FINAL_EPISODES = 2             # v1's "return after the budget": mean of the last training episodes
BALANCE = "cartpole-balance"   # claim v2 1's task
NEGATIVE_TRANSFER_FAMILY = "cartpole"   # claim v2 2b's family (pre-registered from the calibration, README)


def final_return(run, arm="single", task=0):
  eps = [e for e in run[f"{arm}/episodes"] if e[0] == task]
  return float(np.mean([e[2] for e in eps[-FINAL_EPISODES:]]))


def _task(run, name):
  return list(run["task_names"]).index(name)


def balance_eval(run) -> float:
  """The single-task agent's mean-action return on cartpole-balance: the "balance" stage's when it ran, else the
  suite's single arm's."""
  return float(run["balance/eval"][0] if "balance/eval" in run else run["single/eval"][_task(run, BALANCE)])


def eval_vs_pd(runs):
  """Smallest ratio over seeds of the single-task agent's mean-action return on cartpole-balance
  (`method.eval_episodes` episodes) to the PD controller's."""
  return float(min(balance_eval(r) / r["baseline/scripted"][_task(r, BALANCE)] for r in runs))


def eval_vs_zero(runs):
  """Smallest ratio over seeds of the same return to the zero action's (reported)."""
  return float(min(balance_eval(r) / r["baseline/zero"][_task(r, BALANCE)] for r in runs))


def auc(run, arm, tasks=None):
  """Mean over tasks (all, or the indices `tasks`) of the mean training-episode return over the budget (the
  area under the return curve divided by the budget; episodes are equally spaced)."""
  eps = np.asarray(run[f"{arm}/episodes"], np.float64)
  tasks = range(int(eps[:, 0].max()) + 1) if tasks is None else tasks
  return float(np.mean([eps[eps[:, 0] == t, 2].mean() for t in tasks]))


def family_tasks(run, family: str) -> list[int]:
  return [i for i, n in enumerate(run["task_names"]) if n.split("-")[0] == family]


def _t_low(d) -> float:
  """Lower end of the two-sided 95% t interval of the mean of d."""
  d = np.asarray(d, np.float64)
  if len(d) < 2:
    return float("nan")
  return float(d.mean() - stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))


def auc_gain(runs):
  return float(np.mean([auc(r, "grouped") - auc(r, "single") for r in runs]))


def auc_gain_low(runs):
  """Lower end of the two-sided 95% t interval, over seeds, of AUC(grouped) - AUC(single) (paired by seed)."""
  return _t_low([auc(r, "grouped") - auc(r, "single") for r in runs])


def shared_penalty_low(runs):
  """Lower end of the 95% t interval of AUC(single) - AUC(shared) on the negative-transfer family: all-shared
  suffers negative transfer there (the precondition of claim 2b)."""
  f = NEGATIVE_TRANSFER_FAMILY
  return _t_low([auc(r, "single", family_tasks(r, f)) - auc(r, "shared", family_tasks(r, f)) for r in runs])


def grouped_vs_shared_family(runs):
  """Mean over seeds of AUC(grouped) - AUC(shared) on the negative-transfer family (claim 2b: no worse)."""
  f = NEGATIVE_TRANSFER_FAMILY
  return float(np.mean([auc(r, "grouped", family_tasks(r, f)) - auc(r, "shared", family_tasks(r, f))
                        for r in runs]))


def ari_exact(runs):
  """Share of seeds on which the grouped arm's first grouping equals the dynamics families (ARI = 1)."""
  return float(np.mean([r["grouped/ari"] == 1.0 for r in runs]))


def mean_ari(runs):
  return float(np.mean([r["grouped/ari"] for r in runs]))


# v1's statistics (variant tiny_v1; README "v1"), kept so that its ledger numbers can be recomputed.
def vs_random(runs):
  """Smallest ratio over seeds of the single-task agent's final return on the first task to a random policy's."""
  return float(min(final_return(r) / r["baseline/random"][0] for r in runs))


def vs_scripted(runs):
  """Smallest ratio over seeds of the single-task agent's final return to the scripted PD controller's."""
  return float(min(final_return(r) / r["baseline/scripted"][0] for r in runs))


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`taskloom_agent` (TaskLoom, ICML 2026: the online multi-task Dreamer agent)",
    claim=("v2, 10 seeds: the single-task agent's mean-action return on cartpole-balance after 30k env steps >= 0.8x "
           "a PD controller's on every seed; on a 2-family suite (cartpole balance / balance_sparse, reacher easy / "
           "hard; 10k steps per task) grouped sharing has a larger area under the return curve than independent "
           "agents (95% t interval above 0) and no smaller than all-shared on cartpole; the grouping equals the "
           "families on most seeds"),
    note="README: v1 (3 seeds, one family) failed 2 of 3; its audit and numbers stay there",
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"env.env_steps": 1200, "agent.prefill": 100, "agent.train_every": 6.0, "agent.batch_size": 2,
          "agent.seq_len": 16, "model.deter": 16, "model.hidden": 16, "behavior.hidden": 16, "behavior.horizon": 5,
          "grouping.group_at": 800, "grouping.measure_every": 200, "grouping.grad_batches": 1,
          "method.baseline_episodes": 1, "method.eval_episodes": 1, "method.balance_steps": 1200,
          "agent.checkpoint_every": 400}

CLAIMS = [
    claims.Claim("eval_vs_pd", "smallest over seeds: the single-task agent's mean-action return on "
                 "cartpole-balance (10 episodes, after method.balance_steps) / the PD controller's", eval_vs_pd,
                 ">=", 0.8),
    claims.Claim("auc_gain_low", "lower end of the 95% t interval over seeds of AUC(grouped) - AUC(single), mean "
                 "over the suite's 4 tasks", auc_gain_low, ">", 0.0),
    claims.Claim("shared_penalty_low", "precondition of grouped_vs_shared: lower end of the 95% t interval of "
                 "AUC(single) - AUC(shared) on the cartpole family", shared_penalty_low, ">", 0.0),
    claims.Claim("grouped_vs_shared", "mean over seeds of AUC(grouped) - AUC(shared) on the cartpole family",
                 grouped_vs_shared_family, ">=", 0.0),
    claims.Claim("ari_exact", "share of seeds whose grouping equals the dynamics families (ARI = 1)",
                 ari_exact, ">", 0.5),
]


def get_config(arg=None):
  """Variant tiny | tiny_v1 | small | full (e.g. "tiny", "variant=small,seed=1" or "variant=full,visual=True")."""
  c, arg = configs.variant_config(arg, visual=False)
  c.env = ml_collections.ConfigDict(dict(names=SUITE_V2, envs_per_task=1, action_repeat=4, pixels=False,
                                         image_size=64, workers=0, env_steps=10_000))
  c.model = ml_collections.ConfigDict(dict(deter=64, stoch=8, classes=8, hidden=64, layers=2, emb=4, num_bins=63,
                                           cnn_depth=32, free_nats=1.0))
  # behavior: actor_grad dynamics | reinforce (DreamerV3); slowtar: returns bootstrapped by the slow critic (False:
  # by the critic, DreamerV3), slowreg: weight of the critic's regulariser towards the slow critic (DreamerV3: 1).
  # The tiny setting keeps v1's (README "Claims v2": the learning ladder).
  c.behavior = ml_collections.ConfigDict(dict(hidden=64, layers=2, horizon=15, gamma=0.99, lam=0.95, entropy=3e-4,
                                              actor_grad="dynamics", slowtar=True, slowreg=0.0))
  # agent: batch_size windows per task per update, one update every train_every agent steps after the prefill;
  # replay_context: windows start from the latent stored when acting (DreamerV3's replay_context 1);
  # imag_starts: imagination starts per task per update (0: every replayed posterior, DreamerV3); optimizer adam |
  # laprop (DreamerV3's: LaProp with per-tensor adaptive gradient clipping `agc` and `warmup` updates of warm-up).
  c.agent = ml_collections.ConfigDict(dict(batch_size=8, seq_len=32, model_lr=1e-3, actor_lr=3e-4, critic_lr=3e-4,
                                           clip=100.0, train_every=1.0, prefill=250, imag_starts=64,
                                           capacity=1_000_000, checkpoint_every=2000, replay_context=True,
                                           optimizer="laprop", agc=0.3, warmup=100))
  # grouping (arm "grouped"): one shared model until group_at env steps per task, then per-task world-model
  # gradients (top-level modules in `exclude` left out), clustering into num_groups (0: by threshold), stage 2
  # soft-averages `exchange` every exchange_every updates with weight tau; regroup every regroup_every env steps
  # (0: never); before_updates: group on the step's data before its updates (at the end of the prefill: the
  # shared model as initialised).
  c.grouping = ml_collections.ConfigDict(dict(group_at=2000, num_groups=2, threshold=0.5, grad_batches=8,
                                              exclude=("emb", "rew"), exchange=r"^gru/", tau=0.1,
                                              exchange_every=50, regroup_every=0, before_updates=False,
                                              loss="obs", measure_every=125))
  # balance_steps: environment steps of claim v2 1's single-task agent on cartpole-balance alone (stage
  # "balance"; 0: no such stage, claim 1 then reads the suite's single arm)
  c.method = ml_collections.ConfigDict(dict(arms=ARMS, baseline_episodes=5, eval_episodes=10, balance_steps=30_000))
  if arg.variant == "tiny_v1":   # the v1 claim setting (README "v1"): one dynamics family, the v1 agent
    c.env.names = CARTPOLE
    c.agent.update(replay_context=False, optimizer="adam", warmup=0)
    c.grouping.update(group_at=2000, num_groups=1, grad_batches=4, measure_every=0)
    c.method.update(arms=("single", "grouped"), eval_episodes=1, balance_steps=0)
  elif arg.variant == "small":
    c.env.env_steps = 50_000
  elif arg.variant == "full":
    visual = arg.visual
    c.env.update(names=VISUAL if visual else PROPRIO, action_repeat=2, pixels=visual,
                 env_steps=1_000_000 if visual else 500_000, workers=8 if visual else 0)
    # DreamerV3 size S-like world model, its default learning rates, horizon 333 (gamma 0.997), 255 bins.
    c.model.update(deter=512, stoch=32, classes=32, hidden=512, layers=2, emb=16, num_bins=255)
    c.behavior.update(hidden=512, gamma=0.997, actor_grad="reinforce", slowtar=False, slowreg=1.0)
    c.agent.update(batch_size=16, seq_len=64, model_lr=4e-5, actor_lr=4e-5, critic_lr=4e-5, warmup=1000,
                   train_every=2.0, prefill=2500, imag_starts=0, checkpoint_every=50_000)
    c.grouping.update(group_at=50_000, regroup_every=100_000, num_groups=0, threshold=0.5, measure_every=5_000)
    c.method.balance_steps = 0
    if visual:   # the replay lives on the device: 20 tasks x 25k steps of 64x64x3 uint8 frames is 6.1 GB
      c.agent.capacity = 25_000
  return configs.finalize(c, validate)


def validate(c):
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  bad = [a for a in c.method.arms if a not in ARMS]
  if bad or not c.method.arms:
    raise ConfigError(f"config.method.arms has {bad or 'nothing'}: use some of {', '.join(ARMS)}")
  if c.behavior.actor_grad not in ("dynamics", "reinforce"):
    raise ConfigError(f"config.behavior.actor_grad={c.behavior.actor_grad!r}: use dynamics or reinforce")
  if c.agent.optimizer not in ("adam", "laprop"):
    raise ConfigError(f"config.agent.optimizer={c.agent.optimizer!r}: use adam or laprop")
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
