"""Environment throughput: environment steps per second of each adapter under random actions.

    python -m jaxlab.rl.envs.bench [--names cartpole-swingup walker-walk CartPole-v1 ...] [--steps 200]
        [--envs_per_task 4] [--workers 0 2] [--separate]

Names of gymnax environments (registered in gymnax, or ending in "-v<digits>") go to `GymnaxTasks`, the rest
to `DMControlTasks` (once per value of --workers). Each row is one batch of all the adapter's names (and,
with --separate, one row per name alone); the rate counts every environment of the batch: steps *
num_envs / seconds, after a few warm-up steps (which also compile the gymnax step). An adapter whose
package is missing prints one `skipped` line.
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np

from jaxlab import cli
from jaxlab.errors import MissingDependencyError

DEFAULT_DMC = ["cartpole-swingup", "walker-walk", "cheetah-run", "reacher-easy", "point_mass-easy"]
DEFAULT_GYMNAX = ["CartPole-v1", "Pendulum-v1"]


def throughput(env, steps: int = 200, seed: int = 0, warmup: int = 5) -> float:
  """Environment steps per second (summed over the batch) of `env` under uniform random actions.

  Args:
    env: a `MultiTaskEnv`.
    steps: timed calls of `env.step`.
    seed: seed of the random actions.
    warmup: untimed calls first (compilation, caches).
  """
  rng = np.random.default_rng(seed)
  actions = [env.sample_actions(rng) for _ in range(min(steps, 64))]
  env.reset()
  for i in range(warmup):
    env.step(actions[i % len(actions)])
  start = time.perf_counter()
  for i in range(steps):
    env.step(actions[i % len(actions)])
  return steps * env.num_envs / (time.perf_counter() - start)


def is_gymnax_name(name: str) -> bool:
  """Whether `name` is a gymnax environment id (registered, or shaped like "CartPole-v1")."""
  try:
    from jaxlab.rl.envs.gymnax import import_gymnax
    if name in import_gymnax().registered_envs:
      return True
  except MissingDependencyError:
    pass
  return re.search(r"-v\d+$", name) is not None


def run(names=None, steps: int = 200, envs_per_task: int = 4, workers=(0, 2), separate: bool = False,
        seed: int = 0) -> list[dict]:
  """Measures every adapter; returns rows {adapter, names, workers, num_envs, steps_per_s, note}."""
  from jaxlab.rl.envs.dm_control import DMControlTasks
  from jaxlab.rl.envs.gymnax import GymnaxTasks
  names = list(names) if names else DEFAULT_DMC + DEFAULT_GYMNAX
  gym = [n for n in names if is_gymnax_name(n)]
  dmc = [n for n in names if n not in gym]
  jobs = []
  for w in workers:
    groups = ([[n] for n in dmc] if separate and len(dmc) > 1 else []) + ([dmc] if dmc else [])
    jobs += [("dm_control", g, w, lambda g=g, w=w: DMControlTasks(g, envs_per_task, seed, workers=w)) for g in groups]
  groups = ([[n] for n in gym] if separate and len(gym) > 1 else []) + ([gym] if gym else [])
  jobs += [("gymnax", g, None, lambda g=g: GymnaxTasks(g, envs_per_task, seed)) for g in groups]
  rows = []
  for adapter, group, w, make in jobs:
    row = {"adapter": adapter, "names": group, "workers": w, "num_envs": len(group) * envs_per_task,
           "steps_per_s": None, "note": ""}
    try:
      with make() as env:
        row["steps_per_s"] = throughput(env, steps, seed)
    except MissingDependencyError as e:
      row["note"] = f"skipped: {e}"
    rows.append(row)
  return rows


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m jaxlab.rl.envs.bench", description=__doc__.split("\n\n")[0])
  parser.add_argument("--names", nargs="+", default=None,
                      help=f"task names (default: {' '.join(DEFAULT_DMC + DEFAULT_GYMNAX)})")
  parser.add_argument("--steps", type=int, default=200, help="timed batched steps per row")
  parser.add_argument("--envs_per_task", type=int, default=4, help="copies of each task in the batch")
  parser.add_argument("--workers", type=int, nargs="+", default=[0, 2],
                      help="dm_control worker processes; one row per value (0: in-process)")
  parser.add_argument("--separate", action="store_true", help="also one row per task alone")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  rows = run(args.names, args.steps, args.envs_per_task, args.workers, args.separate, args.seed)
  print(f"{'adapter':11s} {'workers':>7s} {'envs':>5s} {'steps/s':>10s}  tasks")
  for r in rows:
    w = "-" if r["workers"] is None else str(r["workers"])
    rate = f"{r['steps_per_s']:10.0f}" if r["steps_per_s"] is not None else f"{'':10s}"
    print(f"{r['adapter']:11s} {w:>7s} {r['num_envs']:5d} {rate}  {' '.join(r['names'])}"
          + (f"  ({r['note']})" if r["note"] else ""))
  return 0


if __name__ == "__main__":
  cli.main_wrapper(main)
