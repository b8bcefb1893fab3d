"""The model format: parsing, expansion to linear rows, one-line errors; solvers against brute force."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jaxlab.opt_modeling import ir, solvers

FURNITURE = {
    "sets": {"P": ["chair", "table"], "R": ["wood", "labor"]},
    "parameters": {"profit": {"chair": 30, "table": 50}, "use": {"wood": {"chair": 3, "table": 7},
                                                                 "labor": {"chair": 2, "table": 4}},
                   "avail": {"wood": 63, "labor": 40}},
    "variables": [{"name": "x", "over": ["P"], "type": "integer", "meaning": "number of units"}],
    "constraints": [{"name": "cap", "forall": "r in R", "expr": "sum(p in P, use[r, p] * x[p]) <= avail[r]"},
                    {"name": "chairs", "expr": "x['chair'] - 2 * x[table] >= -1"}],
    "objective": {"sense": "max", "expr": "sum(p in P, profit[p] * x[p]) + 5"}}


def test_parse_expands_to_rows():
  m = ir.parse(FURNITURE)
  assert m.var_names == ["x[chair]", "x[table]"] and m.sense == "maximize"
  rows = {c.name: (dict(c.lhs.coefs), c.op, c.rhs) for c in m.constraints}
  assert rows == {"cap[wood]": ({"x[chair]": 3.0, "x[table]": 7.0}, "<=", 63.0),
                  "cap[labor]": ({"x[chair]": 2.0, "x[table]": 4.0}, "<=", 40.0),
                  "chairs": ({"x[chair]": 1.0, "x[table]": -2.0}, ">=", -1.0)}
  assert dict(m.objective.coefs) == {"x[chair]": 30.0, "x[table]": 50.0} and m.objective.const == 5.0
  assert sorted(set(m.numbers)) == [1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 30.0, 40.0, 50.0, 63.0]   # read, not declared
  assert m.unused_parameters == []
  fenced = "Sure.\n```json\n" + json.dumps(FURNITURE) + "\n```\nDone."
  assert ir.parse(fenced).var_names == m.var_names


@pytest.mark.parametrize("change, message", [
    (("constraints", 1, "expr", "x[chair] * x[table] <= 3"), "product of two variables is not linear"),
    (("constraints", 1, "expr", "x[chair] < 3"), "use <=, >= or =="),
    (("constraints", 1, "expr", "1 <= x[chair] <= 3"), "exactly one comparison"),
    (("constraints", 1, "expr", "x[sofa] <= 3"), "'sofa' is not an element of set P"),
    (("constraints", 1, "expr", "x <= 3"), "indexed by 1 set"),
    (("constraints", 1, "expr", "y[chair] <= 3"), "unknown name 'y'"),
    (("constraints", 1, "expr", "profit[chair] <= 3"), "has no variables"),
    (("constraints", 0, "forall", "r in Q"), "unknown set 'Q'"),
    (("constraints", 1, "expr", "x[chair] / x[table] <= 3"), "division by a variable"),
    (("variables", 0, "type", "real-valued"), "type must be one of"),
    (("objective", None, "sense", "up"), "sense must be maximize or minimize"),
])
def test_errors_are_specific(change, message):
  bad = json.loads(json.dumps(FURNITURE))
  where, i, key, value = change
  (bad[where] if i is None else bad[where][i])[key] = value
  with pytest.raises(ir.ModelError, match=message):
    ir.parse(bad)


def test_several_problems_are_listed_and_json_errors_located():
  bad = {"variables": [{"name": "x"}, {"name": "x"}], "constraints": [{"expr": "z <= 1"}], "objective": {}}
  with pytest.raises(ir.ModelError) as e:
    ir.parse(bad)
  assert len(e.value.problems) == 3
  with pytest.raises(ir.ModelError, match=r"does not parse \(line 2"):
    ir.parse('```json\n{"a": 1,\n oops}\n```')
  with pytest.raises(ir.ModelError, match="holds no JSON model"):
    ir.parse("I cannot answer that.")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="xyab[]()+-*/<=>, 0123456789suminP", max_size=40))
def test_any_expression_text_is_parsed_or_refused_in_one_line(text):
  obj = {"sets": {"P": ["a", "b"]}, "variables": [{"name": "x", "over": ["P"]}, {"name": "y"}],
         "constraints": [{"expr": text}], "objective": {"sense": "min", "expr": "y"}}
  try:
    ir.parse(obj)
  except ir.ModelError as e:
    assert e.problems and all("\n" not in p for p in e.problems)


def _random_ip(rng):
  n, m = int(rng.integers(2, 4)), int(rng.integers(1, 4))
  a = rng.integers(1, 6, size=(m, n))
  b = rng.integers(5, 20, size=m)
  c = rng.integers(-3, 9, size=n)
  obj = {"variables": [{"name": f"v{j}", "type": "integer", "ub": 6} for j in range(n)],
         "constraints": [{"name": f"r{i}", "expr": " + ".join(f"{a[i, j]} * v{j}" for j in range(n)) + f" <= {b[i]}"}
                         for i in range(m)],
         "objective": {"sense": "maximize", "expr": " + ".join(f"({c[j]}) * v{j}" for j in range(n))}}
  best = max(float(c @ x) for x in itertools.product(range(7), repeat=n) if (a @ np.array(x) <= b).all())
  return obj, best


def test_every_backend_equals_brute_force_on_integer_programs():
  pytest.importorskip("highspy")
  pytest.importorskip("pyscipopt")
  rng = np.random.default_rng(0)
  for _ in range(15):
    obj, best = _random_ip(rng)
    m = ir.parse(obj)
    for backend in solvers.BACKENDS:
      r = solvers.solve(m, backend)
      assert r.status == "optimal" and r.objective == pytest.approx(best, abs=1e-6), (backend, obj)


def test_infeasible_subset_is_irreducible():
  pytest.importorskip("highspy")
  obj = {"variables": [{"name": "x"}, {"name": "y"}, {"name": "z"}],
         "constraints": [{"name": "a", "expr": "x + y <= 4"}, {"name": "b", "expr": "x >= 3"},
                         {"name": "c", "expr": "z <= 9"}, {"name": "d", "expr": "y >= 2"},
                         {"name": "e", "expr": "x + z >= 1"}],
         "objective": {"sense": "min", "expr": "x + y + z"}}
  m = ir.parse(obj)
  r = solvers.solve(m, "highs")
  assert r.status == "infeasible" and r.iis == ["a", "b", "d"]
  names = [c.name for c in m.constraints]
  for drop in r.iis:       # removing any one member makes it feasible
    keep = [i for i, n in enumerate(names) if n in r.iis and n != drop]
    assert solvers.solve(m, "highs", keep=keep).status == "optimal"
  unb = ir.parse({"variables": [{"name": "x", "lb": None}], "objective": {"sense": "min", "expr": "x"}})
  for backend in ("highs", "scipy"):
    assert solvers.solve(unb, backend).status == "unbounded"
