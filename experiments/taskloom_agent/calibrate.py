"""Issue 73's learning ladder: which of DreamerV3's defaults the single-task agent keeps at the tiny budget.

    python -m jaxlab.experiments.taskloom_agent.calibrate --seeds 100,101,102 --rungs v1,context,critic,reinforce
    python -m jaxlab.experiments.taskloom_agent.calibrate --timing --rungs v1,context,reinforce

Each rung is the tiny config restricted to cartpole-balance and the single-task arm. `LADDER` adds DreamerV3's
pieces in turn to the v1 agent (each rung on top of the one before); `ON_CONTEXT` tries one change each on top
of the `context` rung (the optimiser, the replay ratio, the budget, every replayed state as an imagination
start). A row per seed and rung: the policy's mean-action return over `method.eval_episodes` episodes after the
budget and its ratio to the PD controller's (claim v2 1), the area under the training-return curve, the
zero-action and random returns, the last training episodes, the seconds the seed took. Validation seeds only
(100+); the claim seeds are `config.SEEDS`. `--timing` times one update of the 4-task suite per rung instead.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import registry
from jaxlab.rl import replay
from jaxlab.rl.dreamer import agent as agent_lib

from . import config as config_lib
from . import probe
from . import train as train_lib

V1 = {"behavior.actor_grad": "dynamics", "behavior.slowtar": True, "behavior.slowreg": 0.0,
      "agent.imag_starts": 64, "agent.replay_context": False, "agent.optimizer": "adam", "agent.warmup": 0}
LADDER = {   # name: overrides, each rung on top of the one before (the first ladder: DreamerV3's pieces in turn)
    "v1": V1,
    "context": {"agent.replay_context": True},
    "critic": {"behavior.slowtar": False, "behavior.slowreg": 1.0},
    "reinforce": {"behavior.actor_grad": "reinforce"},
}
ON_CONTEXT = {   # name: overrides on top of "context" (the second ladder: optimiser, replay ratio, budget)
    "laprop": {"agent.optimizer": "laprop", "agent.warmup": 100},
    "laprop_v3": {"agent.optimizer": "laprop", "agent.warmup": 1000, "agent.model_lr": 4e-5, "agent.actor_lr": 4e-5,
                  "agent.critic_lr": 4e-5},
    "ratio2": {"agent.train_every": 0.5},
    "steps20k": {"env.env_steps": 20_000},
    "laprop_30k": {"agent.optimizer": "laprop", "agent.warmup": 100, "env.env_steps": 30_000},
    "all_starts": {"agent.imag_starts": 0},
}
RUNGS = (*LADDER, *ON_CONTEXT)


def rung_overrides(name: str) -> dict:
  if name not in RUNGS:
    raise SystemExit(f"--rungs: unknown rung {name!r}; use some of {', '.join(RUNGS)}")
  base = list(LADDER)
  chain = base[:base.index(name) + 1] if name in LADDER else base[:2]
  out = {}
  for r in chain:
    out.update(LADDER[r])
  out.update(ON_CONTEXT.get(name, {}))
  return out


def run(seed: int, rung: str, env_steps: int = 0) -> dict:
  exp = registry.load("taskloom_agent")
  over = {"env.names": ("cartpole-balance",), "method.arms": ("single",), "agent.checkpoint_every": 0,
          "env.env_steps": 10_000, **rung_overrides(rung)}
  if env_steps:
    over["env.env_steps"] = env_steps
  c = exp.get_config(f"tiny,seed={seed}", over)
  t0 = time.time()
  with tempfile.TemporaryDirectory() as tmp:
    s = train_lib.train_and_evaluate(c, tmp)
  return {"seed": seed, "rung": rung, "eval": s["single/eval"][0], "pd": s["baseline/scripted"][0],
          "zero": s["baseline/zero"][0], "random": s["baseline/random"][0],
          "auc": config_lib.auc(s, "single"), "seconds": time.time() - t0,
          "last": [round(e[2]) for e in s["single/episodes"]][-6:]}


def timing(rung: str, updates: int = 30) -> dict:
  """Seconds per update of the tiny config on its suite (rung's settings), per grouping, after the compile; the
  replay holds one episode of random steps per task."""
  exp = registry.load("taskloom_agent")
  c = exp.get_config("tiny", rung_overrides(rung))
  out = {}
  with train_lib.make_env(c, 0) as env:
    agent = train_lib.build_agent(c, env)
    t_n, n = env.num_tasks, 250
    rng = np.random.default_rng(0)
    buf = replay.init(t_n, 2501, env.obs_dim, env.act_dim, extras=agent.replay_extras())
    for t in range(t_n):
      extra = {k: jnp.zeros((n,) + v) for k, v in agent.replay_extras().items()}
      buf = replay.add(buf, np.full(n, t, np.int32), rng.normal(size=(n, env.obs_dim)),
                       rng.uniform(-1, 1, (n, env.act_dim)), rng.uniform(size=n), np.ones(n), np.arange(n) == 0,
                       extra or None)
    for mode in ("single", "shared"):
      assign = agent_lib.initial_assign(mode, t_n)
      st = agent.init(jax.random.key(0), assign)
      members = agent_lib.member_rows(assign, agent.cfg.batch_size)
      st, buf, met = agent.update(st, buf, members, jax.random.key(0))
      jax.block_until_ready(met)
      t0 = time.time()
      for u in range(updates):
        st, buf, met = agent.update(st, buf, members, jax.random.key(u + 1))
      jax.block_until_ready(met)
      out[mode] = (time.time() - t0) / updates
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--seeds", default="100,101,102")
  p.add_argument("--rungs", default=",".join(LADDER))
  p.add_argument("--env_steps", type=int, default=0, help="environment steps (0: the tiny config's)")
  p.add_argument("--timing", action="store_true", help="only time the suite's updates per rung")
  a = p.parse_args(argv)
  if a.timing:
    for rung in a.rungs.split(","):
      t = timing(rung)
      print(f"{rung}: {1000 * t['single']:.0f} ms an update (single: 4 models), {1000 * t['shared']:.0f} ms "
            f"(shared: 1 model)", flush=True)
    return
  for rung in a.rungs.split(","):
    rows = []
    for seed in probe._seeds(a.seeds):  # pylint: disable=protected-access
      r = run(seed, rung, a.env_steps)
      rows.append(r)
      print(f"  {rung} seed {seed}: eval {r['eval']:.1f} ({r['eval'] / r['pd']:.3f} x PD {r['pd']:.1f}; zero "
            f"{r['zero']:.1f}, random {r['random']:.1f}), AUC {r['auc']:.1f}, last training episodes {r['last']}, "
            f"{r['seconds']:.0f} s", flush=True)
    ratio = np.array([r["eval"] / r["pd"] for r in rows])
    print(f"{rung}: eval / PD min {ratio.min():.3f} mean {ratio.mean():.3f}; AUC mean "
          f"{np.mean([r['auc'] for r in rows]):.1f}; {np.mean([r['seconds'] for r in rows]):.0f} s a seed", flush=True)


if __name__ == "__main__":
  main()
