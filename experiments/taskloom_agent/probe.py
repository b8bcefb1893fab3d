"""Issue 73's grouping probe: does the online agent's grouping recover the dynamics families at its start?

    python -m jaxlab.experiments.taskloom_agent.probe --seeds 200-219 --grad_batches 4,8,16
    python -m jaxlab.experiments.taskloom_agent.probe --seeds 200-209 --group_at 2000 --measure_every 125

For each seed and setting: the tiny agent on a multi-family suite (`config.SUITE_V2` by default) collects its
prefill (random actions), then groups the tasks once: by default before any update (`grouping.before_updates`:
the shared world model at its initialisation; with `--group_at` after the shared model's updates up to then,
optionally averaging the affinities measured every `--measure_every` steps), the per-task gradients of the
observation loss (`--loss full`: of the world-model loss; `--exclude`: top-level modules left out), their
cosines clustered into `num_groups` groups. The adjusted Rand index (ARI) of those groups against the domain
labels (`config.families`) is what claim v2 3 asks for; the offline taskloom experiment measures it the same
way. Prints one row per setting: ARI = 1 on how many seeds, the mean ARI and the seconds a seed took.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import jax
import numpy as np

from jaxlab import registry
from jaxlab.multitask import grouping as grouping_lib
from jaxlab.rl.dreamer import online

from . import config as config_lib
from . import train as train_lib


def _seeds(text: str) -> list[int]:
  if "-" in text:
    lo, hi = (int(x) for x in text.split("-"))
    return list(range(lo, hi + 1))
  return [int(x) for x in text.split(",")]


def probe(seed: int, names, grad_batches: int, num_groups: int = 2, prefill: int = 0,
          group_at: int = 0, extra: dict | None = None) -> tuple[float, list[int]]:
  """(ARI of the first grouping against the families, its labels) for one seed; prefill: agent steps of random
  actions before it (0: the tiny config's); group_at: environment steps per task before the grouping (0: at the
  end of the prefill, before any update; later: after the shared model's updates of those steps)."""
  exp = registry.load("taskloom_agent")
  c = exp.get_config(f"tiny,seed={seed}", {"agent.prefill": prefill} if prefill else {})
  prefill_env = int(c.agent.prefill) * int(c.env.action_repeat)
  c = exp.get_config(f"tiny,seed={seed}", {
      "agent.prefill": int(c.agent.prefill), "env.names": tuple(names), "grouping.num_groups": num_groups,
      "grouping.grad_batches": grad_batches, "grouping.group_at": group_at or prefill_env,
      "agent.checkpoint_every": 0, "env.env_steps": max(group_at, prefill_env) + int(c.env.action_repeat),
      **(extra or {})})
  with train_lib.make_env(c, seed) as env, tempfile.TemporaryDirectory() as tmp:
    agent = train_lib.build_agent(c, env)
    out = online.run(agent, env, tmp, env_steps=int(c.env.env_steps), key=jax.random.key(seed),
                     grouping=dataclasses.replace(train_lib.grouping_config(c, "grouped"),
                                                 before_updates=not group_at),
                     seed=seed, desc=None)
  labels = out["groupings"][0][1]
  return grouping_lib.adjusted_rand_index(labels, config_lib.families(names)), labels


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--seeds", default="200-219")
  p.add_argument("--grad_batches", default="8")
  p.add_argument("--names", default=",".join(config_lib.SUITE_V2))
  p.add_argument("--prefill", type=int, default=0, help="agent steps of random actions before grouping (0: tiny's)")
  p.add_argument("--measure_every", type=int, default=0, help="grouping.measure_every (0: one measurement)")
  p.add_argument("--exclude", default="", help="grouping.exclude, comma-separated (default: the config's)")
  p.add_argument("--loss", default="obs", help="grouping.loss: obs | full")
  p.add_argument("--group_at", type=int, default=0,
                 help="env steps per task before grouping (0: the prefill's end, before any update)")
  a = p.parse_args(argv)
  names = tuple(a.names.split(","))
  print(f"suite {names}, families {config_lib.families(names)}")
  for gb in (int(x) for x in a.grad_batches.split(",")):
    aris, t0 = [], time.time()
    seeds = _seeds(a.seeds)
    for s in seeds:
      extra = {"grouping.measure_every": a.measure_every, "grouping.loss": a.loss}
      if a.exclude:
        extra["grouping.exclude"] = tuple(a.exclude.split(","))
      ari, labels = probe(s, names, gb, prefill=a.prefill, group_at=a.group_at, extra=extra)
      aris.append(ari)
      print(f"  grad_batches {gb} seed {s}: ARI {ari:.3f} labels {labels}", flush=True)
    aris = np.asarray(aris)
    print(f"grad_batches {gb}: ARI = 1 on {int(np.sum(aris == 1.0))}/{len(aris)} seeds, mean {aris.mean():.3f}, "
          f"{(time.time() - t0) / len(aris):.1f} s a seed", flush=True)


if __name__ == "__main__":
  main()
