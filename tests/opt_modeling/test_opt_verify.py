"""Each deterministic verifier flags the error it is meant to catch on a hand-written problem, and passes the
correct model; the LLM checks go through a scripted backend."""

import copy

import pytest

from jaxlab.llm import ScriptedBackend
from jaxlab.opt_modeling import ir, solvers, verify
from jaxlab.opt_modeling.prompts import Prompts

DESC = ("A workshop makes chairs and tables. Each chair earns a profit of 30 dollars and each table 50 dollars. A "
        "chair takes 2 hours of labor and a table takes 4 hours; at most 40 hours of labor are available. A chair "
        "uses 3 board feet of wood and a table 7; at most 63 board feet are in stock. At least 5 chairs must be "
        "made for a standing order. Choose the whole number of chairs and tables to maximize profit.")
GOOD = {
    "sets": {"P": ["chair", "table"]},
    "parameters": {"profit": {"chair": 30, "table": 50}, "hours": {"chair": 2, "table": 4}, "labor": 40,
                   "wood": {"chair": 3, "table": 7}, "stock": 63, "order": 5},
    "units": {"profit": "usd/unit", "hours": "h/unit", "labor": "h", "wood": "ft/unit", "stock": "ft"},
    "variables": [{"name": "x", "over": ["P"], "type": "integer", "unit": "unit", "meaning": "number of each product"}],
    "constraints": [{"name": "labor", "expr": "sum(p in P, hours[p] * x[p]) <= labor"},
                    {"name": "wood", "expr": "sum(p in P, wood[p] * x[p]) <= stock"},
                    {"name": "order", "expr": "x[chair] >= order"}],
    "objective": {"sense": "maximize", "expr": "sum(p in P, profit[p] * x[p])"}}


def _findings(obj):
  m = ir.parse(obj)
  r = solvers.solve(m, "highs")
  return {f.check for f in verify.verify_structure(DESC, m) + verify.verify_solution(DESC, m, r)}, r


def _edit(fn):
  bad = copy.deepcopy(GOOD)
  fn(bad)
  return bad


def test_the_correct_model_passes_every_check():
  pytest.importorskip("highspy")
  found, r = _findings(GOOD)
  assert found == set() and r.objective == pytest.approx(600.0)       # 20 chairs: labor 40, wood 60


@pytest.mark.parametrize("name, edit, expected", [
    ("dropped constraint", lambda m: (m["constraints"].pop(1), m["parameters"].pop("stock"),
                                      m["parameters"].pop("wood")), {"number_coverage"}),
    ("dropped constraint, parameter left", lambda m: m["constraints"].pop(1), {"number_coverage", "unused_variables"}),
    ("flipped inequality", lambda m: m["constraints"][0].update(expr="sum(p in P, hours[p] * x[p]) >= labor"),
     {"constraint_direction"}),
    ("relaxed integrality", lambda m: m["variables"][0].update(type="continuous"), {"integrality"}),
    ("wrong sense", lambda m: m["objective"].update(sense="minimize"), {"objective_sense"}),
    ("wrong coefficient", lambda m: m["parameters"]["hours"].update(table=5), {"number_coverage"}),
    ("unused variable", lambda m: m["variables"].append({"name": "y", "type": "integer"}), {"unused_variables"}),
    ("unit clash", lambda m: m["constraints"][1].update(expr="sum(p in P, wood[p] * x[p]) <= labor"),
     {"units", "number_coverage", "unused_variables"}),
    ("infeasible", lambda m: m["constraints"][2].update(expr="x[chair] >= order * 5"), {"status"}),
])
def test_each_error_is_flagged(name, edit, expected):
  pytest.importorskip("highspy")
  found, _ = _findings(_edit(edit))
  assert expected <= found, (name, found)


def test_infeasible_names_the_conflict_and_perturbation_catches_a_binding_flip():
  pytest.importorskip("highspy")
  bad = _edit(lambda m: m["constraints"][2].update(expr="x[chair] >= order * 5"))
  m = ir.parse(bad)
  r = solvers.solve(m, "highs")
  [f] = verify.status(DESC, m, r)
  assert "['wood', 'order']" in f.message               # 3 * 25 board feet > 63: the irreducible pair
  # "at least 5 chairs" written as <= 5 still solves and binds; tightening the stated requirement (5 -> 6
  # whole chairs) would have to cost profit, yet with <= it frees the optimum: the perturbation check sees it.
  flipped = ir.parse(_edit(lambda m: m["constraints"][2].update(expr="x[chair] <= order")))
  r = solvers.solve(flipped, "highs")
  assert r.status == "optimal"
  assert {f.check for f in verify.verify_solution(DESC, flipped, r)} >= {"perturbation"}


def test_numbers_are_read_from_text():
  got = verify.description_numbers("Costs 1,200 dollars, 2.5 kg, 15% off, product Q3 and .75 of it.")
  assert [(v, pct) for v, _, pct in got] == [(1200.0, False), (2.5, False), (15.0, True), (0.75, False)]
  cues = verify.number_cues("at most 40 hours, at least 5 chairs, exactly 3 trucks, costs 7")
  assert cues == {40.0: {"<="}, 5.0: {">="}, 3.0: {"=="}}


def test_llm_checks_through_a_backend():
  pytest.importorskip("highspy")
  m = ir.parse(GOOD)
  r = solvers.solve(m, "highs")
  prompts = Prompts()
  ok = ScriptedBackend([("Restate", "OK"), ("Plan:", "VALID")])
  assert verify.verify_structure(DESC, m, backend=ok, prompts=prompts) == []
  assert verify.verify_solution(DESC, m, r, backend=ok, prompts=prompts) == []
  picky = ScriptedBackend([("Restate", "- the standing order is missing"), ("Plan:", "INVALID: no tables")])
  [s] = verify.verify_structure(DESC, m, backend=picky, prompts=prompts, checks=())
  [p] = verify.verify_solution(DESC, m, r, backend=picky, prompts=prompts, checks=())
  assert s.check == "llm_backtranslation" and "standing order" in s.message and p.check == "llm_readback"
  assert verify.plan_text(m, r) == "x[chair] = 20  (number of each product)\nobjective (maximize) = 600"
