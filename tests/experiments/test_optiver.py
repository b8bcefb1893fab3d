"""OptiVer experiment: end to end on a few template problems (reference problems, detection tables, the loop
arms), resume, the claim statistics against a direct count, the simulator's corruptions, config errors."""

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("highspy", reason="highspy is not installed: pip install 'jaxlab[milp]'")
pytest.importorskip("pyscipopt", reason="pyscipopt is not installed: pip install 'jaxlab[milp]'")

from experiment_checks import _run, _strip, check_end_to_end  # noqa: E402
from jaxlab import registry  # noqa: E402
from jaxlab.errors import ConfigError  # noqa: E402
from jaxlab.opt_modeling import ir, solvers  # noqa: E402

NAME = "optiver"
SHORT = {"data.num_problems": 12, "loop.rounds": 2}


def test_end_to_end_resume_and_claims(tmp_path):
  exp = registry.load(NAME)
  cfg = exp.config_module
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, SHORT)
  assert s["stages"] == ["reference", "verifiers", "loop/baseline", "loop/structure", "loop/solution", "loop/dual"]
  assert s["reference/all_ok"] == s["reference/n"] >= 12 and s["reference/failures"] == []
  assert s["n/correct"] == 12 and all(s.get(f"det/{c}/correct", 0) == 0 for c in cfg.CHECKS)
  for kind in cfg.ERROR_TYPES:
    assert 0 < s[f"n/{kind}"] <= 12
  # The loop: verification can only help against the simulated LLM, whose corrector is better than its formulator.
  assert s["acc/dual/tol0.05"] >= s["acc/baseline/tol0.05"] and s["corrections/baseline"] == 0
  traces = os.path.join(wd, "stages", "loop_dual", "traces.jsonl")
  assert sum(1 for _ in open(traces)) == 12
  # Claims read the pooled counts.
  for claim in exp.claims:
    assert claim.check([s])["measured"] is not None
  assert cfg.pooled_recall("integrality")([s]) == s.get("det/integrality/relax_integrality", 0) / s["n/relax_integrality"]
  # Resume: drop the last stage's record and its traces' tail; the rerun ends with the same summary.
  os.remove(os.path.join(wd, "summary.json"))
  ckpts = sorted(int(x) for x in os.listdir(os.path.join(wd, "checkpoints")) if x.isdigit())
  shutil.rmtree(os.path.join(wd, "checkpoints", str(ckpts[-1])))
  lines = open(traces).read().splitlines(True)
  open(traces, "w").write("".join(lines[:5]) + lines[5][:20])
  again = _run(NAME, wd, SHORT)
  assert _strip(again) == _strip(s)


def test_corruptions_change_what_they_say():
  from jaxlab.experiments.optiver import simulator, templates
  rng = np.random.default_rng(0)
  for inst in templates.generate_set(12, seed=5):
    good = ir.parse(inst.model)
    for kind in simulator.ERROR_TYPES:
      if not simulator.applicable(inst.model, kind):
        continue
      bad = ir.parse(simulator.corrupt(inst.model, kind, rng, inst.description))
      if kind == "drop_constraint":
        assert len({c.base for c in bad.constraints}) == len({c.base for c in good.constraints}) - 1
      elif kind == "flip_sense":
        assert bad.sense != good.sense
      elif kind == "relax_integrality":
        assert all(v.type == "continuous" for v in bad.variables) and inst.integer
      elif kind in ("perturb_coefficient", "swap_coefficients"):
        assert bad.source["parameters"] != good.source["parameters"]
      elif kind == "flip_inequality":
        assert [c.op for c in bad.constraints] != [c.op for c in good.constraints]


def test_simulated_llm_answers_by_role_and_round():
  from jaxlab.experiments.optiver import simulator, templates
  inst = templates.generate_set(1, seed=3)[0]
  llm = simulator.NoisyLLM({"p": inst}, seed=0, p_error=1.0, correct_factor=0.0)
  first = ir.parse(llm(None, "p/formulator/0", 0))
  fixed = ir.parse(llm(None, "p/corrector/1", 1))
  assert first.source != inst.model and fixed.source == inst.model
  assert llm(None, "p/structure_checker/0", 2) == "OK" and llm(None, "p/solution_interpreter/0", 3) == "VALID"
  assert solvers.solve(fixed).objective == pytest.approx(inst.optimum)


@pytest.mark.parametrize("overrides, match", [
    ({"loop.arms": ("dual", "triple")}, "config.loop.arms has"),
    ({"data.benchmark": "x.jsonl"}, "needs a real LLM"),
    ({"simulator.types": ("typo",)}, "config.simulator.types has"),
])
def test_config_errors_are_one_line(overrides, match):
  with pytest.raises(ConfigError, match=match):
    registry.load(NAME).get_config("tiny", overrides)


@pytest.mark.parametrize("overrides, match", [
    ({}, "needs problems: set --config.data.benchmark"),
    ({"data.benchmark": "x.jsonl"}, "needs --config.llm.base_url, --config.llm.model"),
])
def test_full_refuses_to_start_without_its_inputs(tmp_path, overrides, match):
  exp = registry.load(NAME)
  with pytest.raises(ConfigError, match=match):
    exp.train_module.train_and_evaluate(exp.get_config("full", overrides), str(tmp_path))
