"""The OptiVer loop: formulate -> verify structure -> solve -> verify solution -> correct, up to K rounds.

    settings = LoopSettings(rounds=3, structure=True, solution=True, llm_checks=True, solver="highs")
    trace = run_problem(problem_id, description, backend, settings)      # a JSON-ready dict
    traces = run_benchmark(problems, backend, settings, out="traces.jsonl")  # resumable, with a progress bar

Round r parses the current answer (a parse error is itself a finding), runs the enabled sides, and stops when
nothing was found or r == rounds; otherwise the corrector gets the numbered findings and the current model
and answers a new one. With rounds = 0, or both sides off, the formulator's model is final (the
no-verification baseline). The answer is the final model's optimum, or None ("No Best Solution") when it does
not parse or has no optimum.

Requests are named `<id>/<role>/<round>` (`request_id`), so recorded or scripted backends can answer by
problem and role. A trace records every round: the model text, the findings, the solve status and objective.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

from jaxlab.errors import ConfigError, DataError
from jaxlab.opt_modeling import ir as ir_lib
from jaxlab.opt_modeling import solvers, verify
from jaxlab.opt_modeling.prompts import Prompts


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """What the loop runs.

  Attributes:
    rounds: correction rounds K (0 = no verification).
    structure / solution: run that side's deterministic checks.
    llm_checks: also ask the backend's structure checker / solution interpreter (on the enabled sides).
    structure_checks / solution_checks: which deterministic checks run.
    solver: "highs", "scipy" or "scip".
    temperature / max_tokens / seed: sampling of every LLM call.
    time_limit: solver seconds per solve.
  """
  rounds: int = 3
  structure: bool = True
  solution: bool = True
  llm_checks: bool = False
  structure_checks: tuple[str, ...] = verify.STRUCTURE_CHECKS
  solution_checks: tuple[str, ...] = verify.SOLUTION_CHECKS
  solver: str = "highs"
  temperature: float = 0.0
  max_tokens: int = 2048
  seed: int | None = 0
  time_limit: float = 60.0

  def checked(self) -> "LoopSettings":
    if self.rounds < 0:
      raise ConfigError(f"rounds must be >= 0, got {self.rounds}")
    if self.solver not in solvers.BACKENDS:
      raise ConfigError(f"solver must be one of {list(solvers.BACKENDS)}, got {self.solver!r}")
    verify.check_names(self.structure_checks, "structure")
    verify.check_names(self.solution_checks, "solution")
    return self


def _ask(backend, messages, settings: LoopSettings, rid: str) -> str:
  return backend.complete(messages, temperature=settings.temperature, max_tokens=settings.max_tokens,
                          seed=settings.seed, request_id=rid)[0].text


def evaluate(description: str, text: str, settings: LoopSettings, *, backend=None, prompts: Prompts | None = None,
             problem_id: str = "", round_index: int = 0) -> dict[str, Any]:
  """One round's verification of an answer: {"model", "parse_error", "findings", "status", "objective"}."""
  out: dict[str, Any] = {"model": text, "parse_error": None, "findings": [], "status": None, "objective": None}
  try:
    model = ir_lib.parse(text)
  except ir_lib.ModelError as e:
    out["parse_error"] = e.problems
    out["findings"] = [verify.Finding("parse", "structure", p).to_json() for p in e.problems]
    out["status"] = "unparsed"
    return out
  findings: list[verify.Finding] = []
  if settings.structure:
    findings += verify.verify_structure(description, model, checks=settings.structure_checks,
                                        backend=backend if settings.llm_checks else None, prompts=prompts,
                                        request_id=f"{problem_id}/structure_checker/{round_index}")
  result = solvers.solve(model, settings.solver, time_limit=settings.time_limit, find_iis=settings.solution)
  out["status"], out["objective"] = result.status, result.objective
  if settings.solution:
    findings += verify.verify_solution(description, model, result, checks=settings.solution_checks,
                                       solver=settings.solver, backend=backend if settings.llm_checks else None,
                                       prompts=prompts, request_id=f"{problem_id}/solution_interpreter/{round_index}")
  out["findings"] = [f.to_json() for f in findings]
  return out


def run_problem(problem_id: str, description: str, backend, settings: LoopSettings = LoopSettings(), *,
                prompts: Prompts | None = None) -> dict[str, Any]:
  """The loop on one problem (module docstring); returns its trace."""
  prompts = prompts or Prompts(max_tokens=settings.max_tokens)
  verifying = settings.rounds > 0 and (settings.structure or settings.solution)
  text = _ask(backend, prompts.formulator(description), settings, f"{problem_id}/formulator/0")
  rounds = []
  for r in range(settings.rounds + 1):
    step = evaluate(description, text, settings if verifying else dataclasses.replace(
        settings, structure=False, solution=False), backend=backend, prompts=prompts, problem_id=problem_id,
        round_index=r)
    step["round"] = r
    rounds.append(step)
    if not verifying or not step["findings"] or r == settings.rounds:
      break
    feedback = verify.summarize(step["findings"])
    model_text = text if step["parse_error"] else json.dumps(ir_lib.extract_json(text), indent=1, ensure_ascii=False)
    text = _ask(backend, prompts.corrector(description, model_text, feedback), settings,
                f"{problem_id}/corrector/{r + 1}")
  final = rounds[-1]
  answer = final["objective"] if final["status"] == "optimal" else None
  return {"id": problem_id, "answer": answer, "status": final["status"], "rounds": rounds,
          "corrections": len(rounds) - 1, "settings": dataclasses.asdict(settings)}


def read_traces(path: str) -> dict[str, dict]:
  """{id: trace} of a traces JSONL (a torn last line, from an interrupted run, is ignored)."""
  out: dict[str, dict] = {}
  if not os.path.isfile(path):
    return out
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  for no, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError:
      if no >= len(lines) - 1:      # the last line may be torn by an interrupt
        break
      raise DataError(f"{path}:{no}: not valid JSON; the traces file is damaged (move it away to start over)") \
          from None
    out[str(obj["id"])] = obj
  return out


def run_benchmark(problems: Sequence[Any], backend, settings: LoopSettings = LoopSettings(), *,
                  out: str | None = None, prompts: Prompts | None = None, progress: bool = True) -> list[dict]:
  """The loop over problems (objects with `id` and `description`), appending each trace to `out` as it ends.

  A rerun with the same `out` skips the problems already there (resume), after checking that they were run
  with the same settings.
  """
  settings = settings.checked()
  done = read_traces(out) if out else {}
  want = dataclasses.asdict(settings)
  for pid, trace in done.items():
    if json.loads(json.dumps(trace.get("settings"))) != json.loads(json.dumps(want)):
      raise ConfigError(f"{out} holds traces run with other settings (problem {pid}); pass another --out or "
                        "the same settings")
  if out:
    _drop_torn_tail(out)
  traces = []
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  bar_on = progress and os.environ.get("JAXLAB_PROGRESS", "1") not in ("0", "false", "")
  for p in tqdm(problems, desc="problems", disable=not bar_on, leave=False):
    pid = str(p.id)
    if pid in done:
      traces.append(done[pid])
      continue
    trace = run_problem(pid, p.description, backend, settings, prompts=prompts)
    traces.append(trace)
    if out:
      with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps(trace, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
  return traces


def _drop_torn_tail(path: str) -> None:
  if not os.path.isfile(path):
    return
  with open(path, "rb") as f:
    data = f.read()
  if data and not data.endswith(b"\n"):
    cut = data.rfind(b"\n") + 1
    with open(path, "r+b") as f:
      f.truncate(cut)
