"""Solving a parsed model with HiGHS (highspy), `scipy.optimize.milp` or SCIP (pyscipopt).

    result = solve(model, backend="highs")      # SolveResult(status, objective, x, iis, backend, message)

`status` is one of "optimal", "infeasible", "unbounded" (also for infeasible-or-unbounded models whose LP
relaxation is unbounded), "time_limit", "error". For an infeasible model, `iis` names an irreducible
infeasible subset of the constraints, found by the deletion filter (Chinneck & Dravnieks, ORSA J. Computing
1991): drop each constraint in turn and keep it dropped while the rest stays infeasible (one solve per
constraint; the variable bounds are kept). highspy and pyscipopt come with the `milp` extra; scipy is always
there.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxlab.errors import ConfigError, require
from jaxlab.opt_modeling.ir import Model

BACKENDS = ("highs", "scipy", "scip")


@dataclasses.dataclass
class SolveResult:
  status: str
  objective: float | None = None
  x: dict[str, float] | None = None
  iis: list[str] | None = None
  backend: str = ""
  message: str = ""


@dataclasses.dataclass
class Arrays:
  """The model as arrays: min/max c.x + c0 s.t. lo <= A x <= hi, lb <= x <= ub, integrality (1 = integer)."""
  c: np.ndarray
  c0: float
  a: np.ndarray
  lo: np.ndarray
  hi: np.ndarray
  lb: np.ndarray
  ub: np.ndarray
  integer: np.ndarray
  maximize: bool
  names: list[str]
  rows: list[str]


def to_arrays(model: Model, keep: list[int] | None = None) -> Arrays:
  """Dense arrays of `model` (only constraints `keep` when given)."""
  names = model.var_names
  col = {n: j for j, n in enumerate(names)}
  cons = model.constraints if keep is None else [model.constraints[i] for i in keep]
  a = np.zeros((len(cons), len(names)))
  lo, hi = np.full(len(cons), -np.inf), np.full(len(cons), np.inf)
  for i, c in enumerate(cons):
    for v, k in c.lhs.coefs.items():
      a[i, col[v]] = k
    if c.op in ("<=", "=="):
      hi[i] = c.rhs
    if c.op in (">=", "=="):
      lo[i] = c.rhs
  c = np.zeros(len(names))
  for v, k in model.objective.coefs.items():
    c[col[v]] = k
  return Arrays(c=c, c0=model.objective.const, a=a, lo=lo, hi=hi,
                lb=np.array([v.lb for v in model.variables]), ub=np.array([v.ub for v in model.variables]),
                integer=np.array([v.type != "continuous" for v in model.variables], dtype=np.int8),
                maximize=model.sense == "maximize", names=names, rows=[c.name for c in cons])


def _highs(arr: Arrays, time_limit: float) -> SolveResult:
  highspy = require("highspy", "milp")
  h = highspy.Highs()
  h.setOptionValue("output_flag", False)
  h.setOptionValue("time_limit", float(time_limit))
  inf = highspy.kHighsInf
  n = len(arr.names)
  fix = lambda v: np.clip(np.asarray(v, float), -inf, inf)   # noqa: E731  (HiGHS' infinity)
  h.addVars(n, fix(arr.lb), fix(arr.ub))
  idx = np.arange(n, dtype=np.int32)
  h.changeColsCost(n, idx, arr.c)
  if arr.integer.any():
    h.changeColsIntegrality(n, idx, np.array([highspy.HighsVarType.kInteger if k else highspy.HighsVarType.kContinuous
                                              for k in arr.integer]))
  for i in range(arr.a.shape[0]):
    nz = np.flatnonzero(arr.a[i]).astype(np.int32)
    h.addRow(float(fix(arr.lo[i:i + 1])[0]), float(fix(arr.hi[i:i + 1])[0]), len(nz), nz, arr.a[i, nz])
  h.changeObjectiveSense(highspy.ObjSense.kMaximize if arr.maximize else highspy.ObjSense.kMinimize)
  h.run()
  st = h.getModelStatus()
  S = highspy.HighsModelStatus
  if st == S.kOptimal:
    x = np.array(h.getSolution().col_value)
    return SolveResult("optimal", float(arr.c @ x + arr.c0), dict(zip(arr.names, x.tolist())), backend="highs")
  status = {S.kInfeasible: "infeasible", S.kUnbounded: "unbounded", S.kUnboundedOrInfeasible: "unbounded",
            S.kTimeLimit: "time_limit"}.get(st, "error")
  return SolveResult(status, backend="highs", message=h.modelStatusToString(st))


def _scipy(arr: Arrays, time_limit: float) -> SolveResult:
  from scipy import optimize  # pylint: disable=g-import-not-at-top
  sign = -1.0 if arr.maximize else 1.0
  cons = [optimize.LinearConstraint(arr.a, arr.lo, arr.hi)] if arr.a.shape[0] else []
  res = optimize.milp(sign * arr.c, constraints=cons, integrality=arr.integer, bounds=optimize.Bounds(arr.lb, arr.ub),
                      options={"time_limit": float(time_limit)})
  if res.status == 0:
    return SolveResult("optimal", float(arr.c @ res.x + arr.c0), dict(zip(arr.names, res.x.tolist())),
                       backend="scipy")
  status = {1: "time_limit", 2: "infeasible", 3: "unbounded"}.get(res.status, "error")
  return SolveResult(status, backend="scipy", message=str(res.message))


def _scip(arr: Arrays, time_limit: float) -> SolveResult:
  pyscipopt = require("pyscipopt", "milp")
  m = pyscipopt.Model()
  m.hideOutput()
  m.setParam("limits/time", float(time_limit))
  xs = []
  for j, name in enumerate(arr.names):
    lb = None if math.isinf(arr.lb[j]) else float(arr.lb[j])
    ub = None if math.isinf(arr.ub[j]) else float(arr.ub[j])
    xs.append(m.addVar(name=f"v{j}", vtype="I" if arr.integer[j] else "C", lb=lb, ub=ub))
  for i in range(arr.a.shape[0]):
    expr = pyscipopt.quicksum(float(arr.a[i, j]) * xs[j] for j in np.flatnonzero(arr.a[i]))
    lo, hi = arr.lo[i], arr.hi[i]
    if lo == hi:
      m.addCons(expr == float(lo))
    else:
      if not math.isinf(hi):
        m.addCons(expr <= float(hi))
      if not math.isinf(lo):
        m.addCons(expr >= float(lo))
  m.setObjective(pyscipopt.quicksum(float(arr.c[j]) * xs[j] for j in range(len(xs))),
                 "maximize" if arr.maximize else "minimize")
  m.optimize()
  st = m.getStatus()
  if st == "optimal":
    x = np.array([m.getVal(v) for v in xs])
    return SolveResult("optimal", float(arr.c @ x + arr.c0), dict(zip(arr.names, x.tolist())), backend="scip")
  status = {"infeasible": "infeasible", "unbounded": "unbounded", "inforunbd": "unbounded",
            "timelimit": "time_limit"}.get(st, "error")
  return SolveResult(status, backend="scip", message=st)


_SOLVE = {"highs": _highs, "scipy": _scipy, "scip": _scip}


def solve(model: Model, backend: str = "highs", *, time_limit: float = 60.0, find_iis: bool = True,
          keep: list[int] | None = None) -> SolveResult:
  """Solves `model` (module docstring); `keep` restricts it to those constraint indices."""
  if backend not in _SOLVE:
    raise ConfigError(f"solver backend must be one of {list(BACKENDS)}, got {backend!r}")
  result = _SOLVE[backend](to_arrays(model, keep), time_limit)
  if result.status == "infeasible" and find_iis and keep is None:
    result.iis = infeasible_subset(model, backend, time_limit)
  return result


def infeasible_subset(model: Model, backend: str = "highs", time_limit: float = 60.0) -> list[str]:
  """Names of an irreducible infeasible subset of the constraints (deletion filter; [] when the bounds alone
  are infeasible)."""
  keep = list(range(len(model.constraints)))
  for i in list(keep):
    trial = [k for k in keep if k != i]
    if _SOLVE[backend](to_arrays(model, trial), time_limit).status == "infeasible":
      keep = trial
  return [model.constraints[i].name for i in keep]
