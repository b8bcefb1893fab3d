"""OptiVer's template problems (experiments/optiver/templates.py) and hand-solved reference problems
(experiments/optiver/reference_problems.json): models parse, every solver backend agrees with the stated optimum,
and the descriptions follow the text rules the deterministic verifiers rely on (numbers, integrality wording,
objective wording, a cue before every right-hand side), checked mechanically."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

pytest.importorskip("highspy", reason="highspy is not installed: pip install 'jaxlab[milp]'")

from jaxlab.experiments.optiver import templates  # noqa: E402
from jaxlab.opt_modeling import ir, solvers  # noqa: E402

REFERENCE = os.path.join(os.path.dirname(templates.__file__), "reference_problems.json")
N, SEED, REL = 60, 0, 1e-6

_NUMBER = re.compile(r"(?<![A-Za-z_\d.])\d+(?:\.\d+)?")
_INTEGER_PHRASES = re.compile(r"\bwhole numbers?\b|\bintegers?\b|\bnumber of\b|\beither\b.*?\bor not\b", re.I | re.S)
_CONTINUOUS_FORBIDDEN = re.compile(r"\bwhole\b|\bintegers?\b|\bintegral\b|\bnumber of\b|\bhow many\b|\bunits?\b|"
                                   r"\beither\b|\bindivisible\b", re.I)
_CUES = {"at most": "<=", "no more than": "<=", "up to": "<=", "at least": ">=", "no fewer than": ">=",
         "exactly": "=="}
_CUE = re.compile(r"\b(" + "|".join(_CUES) + r")\b(\s+\d+(?:\.\d+)?(?!\d|\.\d))?", re.I)
_OTHER_CUES = re.compile(r"\bnot (?:to )?exceed|\bmaximum of\b|\bat the most\b|\bno less than\b|\bminimum of\b|"
                         r"\bnot below\b", re.I)


@pytest.fixture(scope="module")
def instances():
  return templates.generate_set(N, seed=SEED)


def _references():
  with open(REFERENCE, encoding="utf-8") as f:
    return json.load(f)


def _k(v: float) -> float:
  return round(float(v), 6)


def _close(a: float, b: float) -> bool:
  return abs(a - b) <= REL * max(1.0, abs(a), abs(b))


def _integer(model: ir.Model) -> bool:
  return any(v.type != "continuous" for v in model.variables)


# ------------------------------------------------------------------------------------------------ text rules

def check_numbers(desc: str, model: ir.Model, distinct: bool = True):
  """Rule a: the description's numbers are the model's (0 aside), distinct, none a set size; no digits in names."""
  assert not re.search(r"\d,\d{3}|%", desc), desc
  nums = [_k(x) for x in _NUMBER.findall(desc)]
  if distinct:
    assert len(nums) == len(set(nums)), f"repeated numbers {sorted(nums)} in: {desc}"
  model_nums = {_k(v) for v in model.numbers if v != 0}
  assert set(nums) == model_nums, (f"only in the description: {set(nums) - model_nums}, only in the model: "
                                   f"{model_nums - set(nums)}; {desc}")
  sizes = {len(elems) for elems in model.sets.values()}
  assert not set(nums) & sizes, f"a number equals a set size {sizes}: {desc}"
  for elems in model.sets.values():
    assert not any(re.search(r"\d", str(e)) for e in elems), elems


def check_integrality_wording(desc: str, model: ir.Model):
  """Rule b."""
  if _integer(model):
    assert _INTEGER_PHRASES.search(desc), desc
  else:
    found = _CONTINUOUS_FORBIDDEN.search(desc)
    assert not found, f"{found.group(0)!r} in a continuous problem: {desc}"


def check_objective_wording(desc: str, model: ir.Model):
  """Rule c: the sense's word, its usual noun, nothing of the opposite sense; most / least only as cues."""
  low = desc.lower()
  if model.sense == "maximize":
    assert re.search(r"\bmaximi[sz]e\b", low) and re.search(r"\bprofit|\bvalue\b|\breturn\b", low), desc
    assert not re.search(r"\bminimi[sz]|\bcheapest\b|as (?:little|few|small) as possible", low), desc
  else:
    assert re.search(r"\bminimi[sz]e\b", low) and re.search(r"\bcost\b", low), desc
    assert not re.search(r"\bmaximi[sz]|as (?:much|many|large) as possible", low), desc
  assert not re.search(r"\bmaximum\b|\bminimum\b", low), desc
  assert len(re.findall(r"\bmost\b", low)) == len(re.findall(r"\bat most\b", low)), desc
  assert len(re.findall(r"\bleast\b", low)) == len(re.findall(r"\bat least\b", low)), desc


def _canonical(c: ir.Constraint) -> tuple[str, float]:
  if c.rhs < 0:
    return {"<=": ">=", ">=": "<=", "==": "=="}[c.op], _k(-c.rhs)
  return c.op, _k(c.rhs)


def check_cues(desc: str, model: ir.Model):
  """Rule d: every nonzero right-hand side follows a cue of its direction, and each cue precedes such a number."""
  rhs = {_canonical(c) for c in model.constraints if c.rhs != 0}
  cued = set()
  for m in _CUE.finditer(desc):
    assert m.group(2), f"cue {m.group(1)!r} not followed by a number: ...{desc[m.start():m.start() + 40]}..."
    pair = (_CUES[m.group(1).lower()], _k(m.group(2)))
    assert pair in rhs, f"cue {m.group(0)!r} is not a right-hand side {sorted(rhs)}: {desc}"
    cued.add(pair)
  assert rhs <= cued, f"right-hand sides without their cue: {rhs - cued}; {desc}"
  assert not _OTHER_CUES.search(desc), desc


def check_text(desc: str, model: ir.Model, distinct: bool = True):
  check_numbers(desc, model, distinct)
  check_integrality_wording(desc, model)
  check_objective_wording(desc, model)
  check_cues(desc, model)


# ------------------------------------------------------------------------------------------------ templates

def test_families_cycle_and_fields(instances):
  assert [x.family for x in instances] == [templates.FAMILIES[i % 6] for i in range(N)]
  for x in instances:
    m = ir.parse(x.model)
    assert x.integer == _integer(m) == templates.INTEGER[x.family]
    assert x.optimum > 0 and m.unused_parameters == []
    assert all(v.meaning for v in m.variables)
    assert all(c.get("name") and c.get("meaning") for c in x.model["constraints"])
    assert all(v.lb == 0 for v in m.variables)


def test_backends_agree_with_the_optimum(instances):
  pytest.importorskip("pyscipopt", reason="pyscipopt is not installed: pip install 'jaxlab[milp]'")
  for x in instances:
    m = ir.parse(x.model)
    for backend in solvers.BACKENDS:
      r = solvers.solve(m, backend)
      assert r.status == "optimal" and _close(r.objective, x.optimum), (x.family, backend, r.status, r.objective,
                                                                         x.optimum)


def test_descriptions_follow_the_text_rules(instances):
  for x in instances:
    check_text(x.description, ir.parse(x.model))


def test_each_constraint_entry_has_a_number_of_its_own(instances):
  """Rule e: dropping any one constraint entry removes a number from the model."""
  for x in instances:
    full = {_k(v) for v in ir.parse(x.model).numbers}
    for i in range(len(x.model["constraints"])):
      assert full - {_k(v) for v in ir.parse(templates.dropped(x.model, i)).numbers}, (x.family, i)


def test_relaxing_integrality_and_dropping_constraints_change_the_answer(instances):
  """Rule g, measured: per integer family the LP relaxation differs, per constraint entry a drop changes the optimum,
  each in >= 80% of the instances."""
  lp, drops = {}, {}
  for x in instances:
    p = templates.properties(x.model, x.optimum, x.integer)
    if x.integer:
      lp.setdefault(x.family, []).append(p["lp_differs"])
    for c, changed in zip(x.model["constraints"], p["drop_changes"]):
      drops.setdefault((x.family, c["name"].split("_")[0]), []).append(changed)
  assert set(lp) == {f for f in templates.FAMILIES if templates.INTEGER[f]}
  assert all(np.mean(v) >= 0.8 for v in lp.values()), {k: np.mean(v) for k, v in lp.items()}
  assert all(np.mean(v) >= 0.8 for v in drops.values()), {k: np.mean(v) for k, v in drops.items()}


def test_generation_is_deterministic():
  a, b = templates.generate_set(12, seed=3), templates.generate_set(12, seed=3)
  assert a == b
  assert [x.description for x in templates.generate_set(12, seed=4)] != [x.description for x in a]
  rng1, rng2 = np.random.default_rng(7), np.random.default_rng(7)
  assert templates.generate("staffing", rng1) == templates.generate("staffing", rng2)
  with pytest.raises(ValueError, match="unknown problem family"):
    templates.generate("poetry", rng1)


def test_a_broken_description_fails_the_checks(instances):
  """The mechanical checks above do catch what they are meant to."""
  x = next(i for i in instances if i.family == "transportation")
  m = ir.parse(x.model)
  with pytest.raises(AssertionError):
    check_cues(x.description.replace("at least", "no more than", 1), m)
  with pytest.raises(AssertionError):
    check_integrality_wording(x.description + " Ship whole tons.", m)
  with pytest.raises(AssertionError):
    check_numbers(x.description + " Trucks leave at 77.", m)
  with pytest.raises(AssertionError):
    check_objective_wording(x.description.replace("minimize", "maximize"), m)


# ------------------------------------------------------------------------------------------------ references

def test_reference_file_covers_the_kinds():
  refs = _references()
  assert len(refs) >= 12 and len({r["id"] for r in refs}) == len(refs)
  statuses = [r["status"] for r in refs]
  assert {"optimal", "infeasible", "unbounded"} <= set(statuses)
  models = [ir.parse(r["model"]) for r in refs]
  kinds = {v.type for m in models for v in m.variables}
  assert kinds == {"continuous", "integer", "binary"}
  assert any(c.op == "==" for m in models for c in m.constraints)
  assert any(m.sense == "minimize" and any(c.op == ">=" for c in m.constraints) for m in models)
  for r in refs:
    assert set(r) == {"id", "description", "model", "optimum", "status", "source"}, r["id"]
    assert (r["optimum"] is None) == (r["status"] != "optimal") and r["source"], r["id"]
    assert 2 <= len(ir.parse(r["model"]).variables) <= 4, r["id"]


@pytest.mark.parametrize("ref", _references(), ids=lambda r: r["id"])
def test_reference_problem(ref):
  m = ir.parse(ref["model"])
  for backend in solvers.BACKENDS:
    if backend == "scip":
      pytest.importorskip("pyscipopt", reason="pyscipopt is not installed: pip install 'jaxlab[milp]'")
    r = solvers.solve(m, backend, find_iis=False)
    assert r.status == ref["status"], (backend, r.status, r.message)
    if ref["status"] == "optimal":
      assert _close(r.objective, ref["optimum"]), (backend, r.objective, ref["optimum"])
  check_text(ref["description"], m)
