"""OptiVer experiment: verifier detection tables, reference problems, and the correction loop's arms.

Launch: python -m jaxlab.main --config experiments/optiver/config.py:tiny --workdir /tmp/optiver

Stages (`jaxlab.train.run_stages`, resumable):
* "reference": the hand-solved problems (experiments/optiver/reference_problems.json): each solver backend's
  status and optimum against the known ones, and every check on the correct model.
* "verifiers" (template problems only): for each problem, the correct model and one corruption of each error
  type (`simulator.corrupt`), every deterministic check run on each; counts `det/<check>/<type>` of
  detections, `n/<type>` of corruptions, `changed/<type>` of corruptions that change the answer, and
  `det/<check>/correct` (false alarms) over `n/correct`.
* "loop/<arm>": the formulate / verify / correct loop (`jaxlab.opt_modeling.pipeline`) over the problems with
  the arm's rounds and sides; its traces go to the stage's folder (`stages/loop_<arm>/traces.jsonl`, resumable
  by problem); accuracy at each tolerance of loop.tols against the known optima, corrections made, LLM calls.

summary.json holds those keys plus `acc/<arm>/tol<tol>` (accuracy at that relative tolerance).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import numpy as np

from jaxlab import progress
from jaxlab.errors import ConfigError
from jaxlab.opt_modeling import ir as ir_lib
from jaxlab.opt_modeling import pipeline, scoring, solvers, verify
from jaxlab.opt_modeling.prompts import Prompts
from jaxlab.train import run_stages

from . import config as config_lib
from . import simulator, templates

HERE = os.path.dirname(os.path.abspath(__file__))


def train_and_evaluate(config, workdir: str) -> dict:
  config_lib.check_inputs(config)
  stages = {"reference": reference_stage}
  if config.verifiers.enabled and not config.data.benchmark:
    stages["verifiers"] = verifiers_stage
  for arm in config.loop.arms:
    stages[f"loop/{arm}"] = functools.partial(loop_stage, arm=arm)
  return run_stages(config, workdir, stages)


# ------------------------------------------------------------------------------------------------ problems

def problems(config) -> list[Any]:
  """The run's problems: template instances (`id`, `description`, `model`, `optimum`) or benchmark records."""
  d = config.data
  if d.benchmark:
    from jaxlab.opt_modeling import benchmarks  # pylint: disable=g-import-not-at-top
    return benchmarks.load_benchmark(d.benchmark, fmt=d.benchmark_format, errata=d.errata or None,
                                     limit=d.limit or None)
  insts = templates.generate_set(d.num_problems, seed=config.seed)
  if d.families:
    insts = [x for x in insts if x.family in d.families]
  return [_Problem(f"s{config.seed}-{i:04d}-{x.family}", x) for i, x in enumerate(insts)]


class _Problem:

  def __init__(self, pid: str, inst):
    self.id, self.inst = pid, inst
    self.description, self.model, self.answer = inst.description, inst.model, inst.optimum


def make_backend(config, probs):
  """The LLM of config.llm (the simulated one is keyed by the problems)."""
  from jaxlab import llm  # pylint: disable=g-import-not-at-top
  c = config.llm
  if c.backend == "simulated":
    s = config.simulator
    backend = llm.ScriptedBackend(simulator.NoisyLLM({p.id: p.inst for p in probs}, config.seed, s.p_error,
                                                     s.correct_factor, s.types), model_id="simulated")
  elif c.backend == "openai":
    backend = llm.OpenAICompatBackend(c.base_url, c.model, api_key_env=c.api_key_env or None,
                                      max_concurrency=c.max_concurrency)
  elif c.backend == "local":
    backend = llm.LocalBackend(c.model_dir)
  else:
    backend = llm.ReplayBackend(c.replay_file)
  return llm.CachingBackend(backend, c.cache_dir) if c.cache_dir else backend


# ------------------------------------------------------------------------------------------------ stages

def _all_findings(desc: str, model, solver: str) -> tuple[set[str], Any]:
  """(names of the deterministic checks that flag `model`, its solve result)."""
  result = solvers.solve(model, solver)
  found = {f.check for f in verify.verify_structure(desc, model) + verify.verify_solution(desc, model, result,
                                                                                          solver=solver)}
  return found, result


def reference_stage(ctx) -> dict:
  path = ctx.config.data.reference or os.path.join(HERE, "reference_problems.json")
  with open(path, encoding="utf-8") as f:
    refs = json.load(f)
  ok, failures = 0, []
  for ref in refs:
    model = ir_lib.parse(ref["model"])
    good = True
    for backend in ctx.config.verifiers.solvers:
      r = solvers.solve(model, backend)
      if r.status != ref["status"] or (ref["optimum"] is not None and not np.isclose(r.objective, ref["optimum"],
                                                                                     rtol=1e-6, atol=1e-6)):
        good = False
        failures.append(f"{ref['id']}/{backend}: {r.status} {r.objective} vs {ref['status']} {ref['optimum']}")
    if ref["status"] == "optimal":
      found, _ = _all_findings(ref["description"], model, "highs")
      if found:
        good = False
        failures.append(f"{ref['id']}: flagged by {sorted(found)}")
    ok += good
  return {"reference/n": len(refs), "reference/all_ok": ok, "reference/failures": failures}


def verifiers_stage(ctx) -> dict:
  config = ctx.config
  probs = problems(config)
  solver = config.loop.solver
  counts: dict[str, int] = {}

  def add(key, k=1):
    counts[key] = counts.get(key, 0) + k

  bar = progress.bar(len(probs), desc="verifiers")
  for p in probs:
    found, _ = _all_findings(p.description, ir_lib.parse(p.model), solver)
    add("n/correct")
    for check in found:
      add(f"det/{check}/correct")
    for kind in config.simulator.types:
      if not simulator.applicable(p.model, kind):
        continue
      rng = simulator._rng(config.seed, p.id, "verifiers", kind)   # pylint: disable=protected-access
      bad = ir_lib.parse(simulator.corrupt(p.model, kind, rng, p.description))
      found, result = _all_findings(p.description, bad, solver)
      changed = result.status != "optimal" or not np.isclose(result.objective, p.answer, rtol=1e-6, atol=1e-6)
      add(f"n/{kind}")
      add(f"changed/{kind}", int(changed))
      for check in found:
        add(f"det/{check}/{kind}")
        add(f"det_changed/{check}/{kind}", int(changed))
      structure = found & set(verify.STRUCTURE_CHECKS)
      add(f"det/any_structure/{kind}", int(bool(structure)))
      add(f"det/any_solution/{kind}", int(bool(found - structure)))
      add(f"det/any/{kind}", int(bool(found)))
      if result.status != "optimal":
        add("n/nonoptimal")
        add("det/status/nonoptimal", int("status" in found))
    bar.update(1)
  bar.close()
  return counts


def loop_stage(ctx, arm: str) -> dict:
  config = ctx.config
  rounds, structure, solution = config_lib.ARMS.get(arm, (0, False, False))
  rounds = config.loop.rounds if rounds == "K" else rounds
  settings = pipeline.LoopSettings(rounds=rounds, structure=structure, solution=solution,
                                   llm_checks=config.loop.llm_checks, solver=config.loop.solver,
                                   temperature=config.llm.temperature, max_tokens=config.llm.max_tokens,
                                   seed=config.seed, time_limit=config.loop.time_limit)
  probs = problems(config)
  if not probs:
    raise ConfigError("no problems to run: check config.data (families / benchmark / limit)")
  backend = make_backend(config, probs)
  prompts = (Prompts.from_folder(config.loop.prompts, config.llm.max_tokens) if config.loop.prompts
             else Prompts(max_tokens=config.llm.max_tokens))
  traces = pipeline.run_benchmark(probs, backend, settings, out=os.path.join(ctx.subdir(), "traces.jsonl"),
                                  prompts=prompts, progress=progress.enabled())
  preds = [t["answer"] for t in traces]
  gts = [p.answer for p in probs]
  out = {f"acc/{arm}/tol{tol:g}": scoring.accuracy(preds, gts, tol) for tol in config.loop.tols}
  out[f"corrections/{arm}"] = float(np.mean([t["corrections"] for t in traces]))
  out[f"flagged_final/{arm}"] = float(np.mean([bool(t["rounds"][-1]["findings"]) for t in traces]))
  return out


# ------------------------------------------------------------------------------------------------ report

def detection_table(runs) -> str:
  """Markdown: rows = checks, columns = error types (+ correct = false alarms), pooled detection rates."""
  types = list(config_lib.ERROR_TYPES) + ["nonoptimal", "correct"]
  checks = list(config_lib.CHECKS) + ["any_structure", "any_solution", "any"]
  n = {t: sum(r.get(f"n/{t}", 0) for r in runs) for t in types}
  head = "| check | " + " | ".join(f"{t} (n={n[t]})" for t in types) + " |"
  lines = [head, "|" + "---|" * (len(types) + 1)]
  for c in checks:
    cells = []
    for t in types:
      if n[t] == 0 or (c.startswith("any") and t in ("correct", "nonoptimal")):
        cells.append("")
        continue
      rate = sum(r.get(f"det/{c}/{t}", 0) for r in runs) / n[t]
      cells.append(f"{rate:.3f}")
    lines.append(f"| {c} | " + " | ".join(cells) + " |")
  changed = [f"{sum(r.get(f'changed/{t}', 0) for r in runs) / n[t]:.3f}" if n[t] else ""
             for t in types[:-2]]
  lines.append("| (answer changed) | " + " | ".join(changed) + " | | |")
  return "\n".join(lines)


def accuracy_table(runs) -> str:
  """Markdown: each arm's accuracy at each tolerance and its corrections per problem (mean over seeds)."""
  arms = [k.split("/")[1] for k in runs[0] if k.startswith("acc/") and k.endswith("/tol0.05")]
  tols = sorted({k.split("/tol")[1] for k in runs[0] if k.startswith("acc/")}, key=float)
  lines = ["| arm | " + " | ".join(f"accuracy (tol {t})" for t in tols) + " | corrections / problem |",
           "|" + "---|" * (len(tols) + 2)]
  for arm in arms:
    acc = [f"{np.mean([r[f'acc/{arm}/tol{t}'] for r in runs]):.3f}" for t in tols]
    lines.append(f"| {arm} | " + " | ".join(acc) + f" | {np.mean([r[f'corrections/{arm}'] for r in runs]):.2f} |")
  return "\n".join(lines)


def plot(runs, workdirs, out_dir):
  """accuracy.png: accuracy (5% tolerance) per arm, mean over seeds with the seeds as dots; detection.md and
  accuracy.md (the tables of the README)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  del workdirs
  if any("n/correct" in r for r in runs):
    with open(os.path.join(out_dir, "detection.md"), "w") as f:
      f.write(detection_table(runs) + "\n")
  arms = [k.split("/")[1] for k in runs[0] if k.startswith("acc/") and k.endswith("/tol0.05")]
  if not arms:
    return
  with open(os.path.join(out_dir, "accuracy.md"), "w") as f:
    f.write(accuracy_table(runs) + "\n")
  fig, ax = plt.subplots(figsize=(1.4 * len(arms) + 2, 3.2))
  for i, arm in enumerate(arms):
    vals = [r[f"acc/{arm}/tol0.05"] for r in runs]
    ax.bar(i, np.mean(vals), color="#4477aa", alpha=0.8)
    ax.scatter([i] * len(vals), vals, color="k", s=10, zorder=3)
  ax.set_xticks(range(len(arms)), arms)
  ax.set_ylabel("accuracy (rel. tol. 5%)")
  ax.set_ylim(0, 1)
  ax.set_title("correction loop arms")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "accuracy.png"), dpi=120)
  plt.close(fig)
