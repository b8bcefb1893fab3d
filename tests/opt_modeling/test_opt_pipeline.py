"""The formulate / verify / correct loop with a scripted LLM: feedback reaches the corrector, the stopping
rule and the round budget hold, and a benchmark run resumes from its traces file."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from jaxlab.errors import ConfigError
from jaxlab.llm import ScriptedBackend
from jaxlab.opt_modeling import pipeline
from jaxlab.opt_modeling.pipeline import LoopSettings

from test_opt_verify import DESC, GOOD

pytest.importorskip("highspy")


def _answer(model):
  return "```json\n" + json.dumps(model) + "\n```"


def _wrong_sense():
  bad = json.loads(json.dumps(GOOD))
  bad["objective"]["sense"] = "minimize"
  return bad


def scripted(first, fixes):
  """Formulator answers `first`; corrector round r answers fixes[r - 1]."""
  def answer(prompt, rid, i):
    pid, role, rnd = rid.rsplit("/", 2)
    if role == "formulator":
      return first
    if role == "corrector":
      return fixes[int(rnd) - 1]
    return "OK" if role == "structure_checker" else "VALID"
  return ScriptedBackend(answer)


def test_feedback_reaches_the_corrector_and_fixes_the_answer():
  b = scripted(_answer(_wrong_sense()), [_answer(GOOD)])
  t = pipeline.run_problem("p1", DESC, b, LoopSettings(rounds=3, llm_checks=True))
  assert t["answer"] == pytest.approx(600.0) and t["corrections"] == 1 and len(t["rounds"]) == 2
  assert [f["check"] for f in t["rounds"][0]["findings"]] == ["objective_sense"]
  assert t["rounds"][1]["findings"] == []
  corrector_prompt = [p for p, rid in b.calls if rid == "p1/corrector/1"][0][-1]["content"]
  assert "[structure/objective_sense] the description asks to maximize" in corrector_prompt
  roles = [rid.split("/")[1] for _, rid in b.calls]
  assert roles == ["formulator", "structure_checker", "solution_interpreter", "corrector", "structure_checker",
                   "solution_interpreter"]


def test_round_budget_baseline_and_unparseable_answers():
  stubborn = scripted(_answer(_wrong_sense()), [_answer(_wrong_sense())] * 5)
  t = pipeline.run_problem("p", DESC, stubborn, LoopSettings(rounds=2))
  assert t["corrections"] == 2 and t["rounds"][-1]["findings"] and t["answer"] == 150.0   # the 5 ordered chairs
  t0 = pipeline.run_problem("p", DESC, scripted(_answer(_wrong_sense()), []), LoopSettings(rounds=0))
  assert t0["corrections"] == 0 and t0["rounds"][0]["findings"] == []        # no verification at K = 0
  garbled = scripted("I think the answer is 42.", [_answer(GOOD)])
  t = pipeline.run_problem("p", DESC, garbled, LoopSettings(rounds=1))
  assert t["rounds"][0]["status"] == "unparsed" and "holds no JSON model" in t["rounds"][0]["findings"][0]["message"]
  assert t["answer"] == pytest.approx(600.0)
  only_solution = pipeline.run_problem("p", DESC, scripted(_answer(_wrong_sense()), [_answer(GOOD)]),
                                       LoopSettings(rounds=3, structure=False))
  assert only_solution["rounds"][0]["findings"] == [] and only_solution["answer"] == 150.0   # blind to the sense
  with pytest.raises(ConfigError, match="unknown structure check"):
    LoopSettings(structure_checks=("spelling",)).checked()


def test_benchmark_run_resumes_from_its_traces(tmp_path):
  problems = [SimpleNamespace(id=f"q{i}", description=DESC) for i in range(4)]
  out = str(tmp_path / "traces.jsonl")
  first = scripted(_answer(_wrong_sense()), [_answer(GOOD)])
  pipeline.run_benchmark(problems[:2], first, LoopSettings(rounds=1), out=out, progress=False)
  with open(out, "a") as f:
    f.write('{"id": "q2", "answ')              # a line torn by an interrupt
  again = scripted(_answer(_wrong_sense()), [_answer(GOOD)])
  traces = pipeline.run_benchmark(problems, again, LoopSettings(rounds=1), out=out, progress=False)
  assert [t["id"] for t in traces] == ["q0", "q1", "q2", "q3"]
  assert {rid.split("/")[0] for _, rid in again.calls} == {"q2", "q3"}       # q0, q1 came from the file
  assert [json.loads(x)["id"] for x in open(out)] == ["q0", "q1", "q2", "q3"]
  with pytest.raises(ConfigError, match="other settings"):
    pipeline.run_benchmark(problems, again, LoopSettings(rounds=2), out=out, progress=False)


def test_importable_without_jax():
  code = ("import sys, jaxlab.opt_modeling.pipeline, jaxlab.opt_modeling.scoring, jaxlab.opt_modeling.benchmarks, "
          "jaxlab.llm; print('jax' in sys.modules)")
  assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
