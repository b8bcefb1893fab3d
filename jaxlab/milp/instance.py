"""Mixed-integer linear programs as plain numpy/scipy arrays, with file and SCIP conversion.

An `Instance` is `min c.x + offset  s.t.  lhs <= A x <= rhs,  lb <= x <= ub,  x_j integer where integer[j]`,
with `A` a float64 CSR matrix and infinite sides/bounds as +-inf. Every other module of `jaxlab.milp` speaks
this one format: the generators build it, the augmentations transform it, the SCIP environment loads it into
a solver and the GCNN featurises it. It is numpy-only on purpose: SCIP worker processes import this module
and must never import JAX.

File IO (`.lp`, `.mps`, and their `.gz` versions) goes through HiGHS (`highspy`), solver conversion through
PySCIPOpt (`to_scip` / `from_scip`); both are imported lazily, so the arrays work without either installed.
Maximisation problems read from files or SCIP models are turned into minimisation by negating c and offset.

HiGHS's LP-format reader numbers columns by first appearance in the file and its LP writer splits ranged rows
(finite lhs < rhs) into two rows and omits columns that appear nowhere; `.mps` round-trips exactly.
Semi-continuous columns are rejected; implied-integer columns (HiGHS/SCIP) are read as continuous.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil
import tempfile

import numpy as np
import scipy.sparse as sp

from jaxlab.errors import DataError, MissingDependencyError

SUFFIXES = (".lp", ".mps", ".lp.gz", ".mps.gz")


@dataclasses.dataclass
class Instance:
  """`min c.x + offset s.t. lhs <= A x <= rhs, lb <= x <= ub, x_j integer where integer[j]` (see module doc)."""
  A: sp.csr_matrix
  lhs: np.ndarray
  rhs: np.ndarray
  c: np.ndarray
  lb: np.ndarray
  ub: np.ndarray
  integer: np.ndarray
  offset: float = 0.0
  name: str = "instance"
  var_names: list[str] | None = None

  def __post_init__(self):
    self.A = sp.csr_matrix(self.A, dtype=np.float64)
    for f in ("lhs", "rhs", "c", "lb", "ub"):
      setattr(self, f, np.asarray(getattr(self, f), dtype=np.float64))
    self.integer = np.asarray(self.integer, dtype=bool)
    self.offset = float(self.offset)
    if self.var_names is not None:
      self.var_names = [str(v) for v in self.var_names]

  @property
  def num_rows(self) -> int:
    return self.A.shape[0]

  @property
  def num_cols(self) -> int:
    return self.A.shape[1]

  def validate(self) -> Instance:
    """Checks shapes, NaNs and bound order; raises DataError (a ValueError) with one line. Returns self."""
    m, n = self.A.shape
    where = f"Instance '{self.name}'"
    for f, size, what in (("lhs", m, "rows"), ("rhs", m, "rows"), ("c", n, "columns"), ("lb", n, "columns"),
                          ("ub", n, "columns"), ("integer", n, "columns")):
      shape = getattr(self, f).shape
      if shape != (size,):
        raise DataError(f"{where}: {f} has shape {shape} but A is {m}x{n}; give {f} one entry per {what[:-1]} "
                        f"(shape ({size},))")
    if self.var_names is not None and len(self.var_names) != n:
      raise DataError(f"{where}: var_names has {len(self.var_names)} names for {n} columns; give one per column "
                      f"or None")
    for f in ("lhs", "rhs", "c", "lb", "ub"):
      if np.isnan(getattr(self, f)).any():
        raise DataError(f"{where}: {f} contains NaN at index {int(np.flatnonzero(np.isnan(getattr(self, f)))[0])}; "
                        f"use +-inf for a missing side or bound")
    if not np.isfinite(self.A.data).all():
      raise DataError(f"{where}: A has a NaN or infinite coefficient; all coefficients must be finite")
    if not np.isfinite(self.c).all() or not np.isfinite(self.offset):
      raise DataError(f"{where}: the objective (c or offset) has an infinite entry; costs must be finite")
    for lo, hi, what in (("lhs", "rhs", "row"), ("lb", "ub", "column")):
      a, b = getattr(self, lo), getattr(self, hi)
      bad = np.flatnonzero((a > b) | (a == np.inf) | (b == -np.inf))
      if bad.size:
        k = int(bad[0])
        raise DataError(f"{where}: {what} {k} has {lo}={a[k]} > {hi}={b[k]} (or an infinite side on the wrong "
                        f"end); need {lo} <= {hi}, {lo} < +inf and {hi} > -inf")
    return self

  def copy(self) -> Instance:
    return Instance(self.A.copy(), self.lhs.copy(), self.rhs.copy(), self.c.copy(), self.lb.copy(), self.ub.copy(),
                    self.integer.copy(), self.offset, self.name,
                    None if self.var_names is None else list(self.var_names))


def objective(inst: Instance, x: np.ndarray) -> float:
  """c.x + offset."""
  return float(inst.c @ np.asarray(x, dtype=np.float64) + inst.offset)


def is_feasible(inst: Instance, x: np.ndarray, tol: float = 1e-6) -> bool:
  """Whether x satisfies rows, bounds and integrality up to an absolute tolerance `tol`."""
  x = np.asarray(x, dtype=np.float64)
  if x.shape != (inst.num_cols,) or not np.isfinite(x).all():
    return False
  ax = inst.A @ x
  return bool((ax >= inst.lhs - tol).all() and (ax <= inst.rhs + tol).all()
              and (x >= inst.lb - tol).all() and (x <= inst.ub + tol).all()
              and (np.abs(x - np.round(x))[inst.integer] <= tol).all())


# ----------------------------------------------------------------------------------------------------------------
# Optional solver packages.

def _highspy():
  try:
    import highspy  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise MissingDependencyError("highspy is not installed: pip install 'jaxlab[milp]'") from e
  return highspy


def _pyscipopt():
  try:
    import pyscipopt  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise MissingDependencyError("pyscipopt is not installed: pip install 'jaxlab[milp]'") from e
  return pyscipopt


def _suffix(path: str) -> str:
  low = path.lower()
  for s in sorted(SUFFIXES, key=len, reverse=True):
    if low.endswith(s):
      return s
  raise DataError(f"{path}: unknown model file suffix; use one of {', '.join(SUFFIXES)}")


def _quiet_highs(highspy):
  h = highspy.Highs()
  h.setOptionValue("output_flag", False)
  return h


# ----------------------------------------------------------------------------------------------------------------
# Files (HiGHS).

def write(inst: Instance, path: str) -> None:
  """Writes `inst` as a `.lp` / `.mps` file (gzip-compressed for `.lp.gz` / `.mps.gz`) through HiGHS."""
  inst.validate()
  path = os.fspath(path)
  suffix = _suffix(path)
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise FileNotFoundError(f"{path}: folder {folder} does not exist; create it first")
  highspy = _highspy()
  lp = highspy.HighsLp()
  m, n = inst.A.shape
  lp.num_col_, lp.num_row_ = n, m
  lp.col_cost_, lp.col_lower_, lp.col_upper_ = inst.c, inst.lb, inst.ub
  lp.row_lower_, lp.row_upper_ = inst.lhs, inst.rhs
  lp.offset_ = inst.offset
  csc = inst.A.tocsc()
  csc.sort_indices()
  lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
  lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n, m
  lp.a_matrix_.start_ = csc.indptr.astype(np.int32)
  lp.a_matrix_.index_ = csc.indices.astype(np.int32)
  lp.a_matrix_.value_ = csc.data
  kinds = highspy.HighsVarType
  lp.integrality_ = [kinds.kInteger if i else kinds.kContinuous for i in inst.integer]
  lp.col_names_ = list(inst.var_names) if inst.var_names is not None else [f"x{j}" for j in range(n)]
  lp.row_names_ = [f"r{i}" for i in range(m)]
  lp.model_name_ = inst.name
  h = _quiet_highs(highspy)
  if h.passModel(lp) == highspy.HighsStatus.kError:
    raise DataError(f"{path}: HiGHS rejected instance '{inst.name}'; check it with Instance.validate()")
  if not suffix.endswith(".gz"):
    if h.writeModel(path) == highspy.HighsStatus.kError:
      raise OSError(f"{path}: HiGHS could not write the model; check the path is writable")
    return
  with tempfile.TemporaryDirectory() as tmp:   # HiGHS writes plain text whatever the name: gzip it here
    plain = os.path.join(tmp, "model" + suffix[:-3])
    if h.writeModel(plain) == highspy.HighsStatus.kError:
      raise OSError(f"{path}: HiGHS could not write the model; check the path is writable")
    with open(plain, "rb") as src, gzip.open(path, "wb") as dst:
      shutil.copyfileobj(src, dst)


def read(path: str) -> Instance:
  """Reads a `.lp` / `.mps` (optionally `.gz`) file through HiGHS; maximisation becomes minimisation."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such model file; check the path (expected one of {', '.join(SUFFIXES)})")
  suffix = _suffix(path)
  highspy = _highspy()
  h = _quiet_highs(highspy)
  if h.readModel(path) == highspy.HighsStatus.kError:
    raise DataError(f"{path}: HiGHS could not parse this {suffix} file; check its syntax (e.g. open it with "
                    f"`highs {os.path.basename(path)}`)")
  lp = h.getLp()
  m, n = int(lp.num_row_), int(lp.num_col_)
  mat = lp.a_matrix_
  start, index, value = (np.asarray(mat.start_, dtype=np.int64), np.asarray(mat.index_, dtype=np.int64),
                         np.asarray(mat.value_, dtype=np.float64))
  if mat.format_ == highspy.MatrixFormat.kColwise:
    A = sp.csc_matrix((value, index, start), shape=(m, n)).tocsr()
  else:
    A = sp.csr_matrix((value, index, start[:m + 1]), shape=(m, n))
  A.sum_duplicates()
  A.sort_indices()
  kinds = highspy.HighsVarType
  integrality = list(lp.integrality_)
  if any(k in (kinds.kSemiContinuous, kinds.kSemiInteger) for k in integrality):
    raise DataError(f"{path}: semi-continuous/semi-integer columns are not supported by jaxlab.milp.Instance")
  integer = np.array([k == kinds.kInteger for k in integrality], dtype=bool) if integrality else np.zeros(n, bool)
  c, offset = np.asarray(lp.col_cost_, dtype=np.float64), float(lp.offset_)
  if lp.sense_ == highspy.ObjSense.kMaximize:
    c, offset = -c, -offset
  names = list(lp.col_names_)
  base = os.path.basename(path)[:-len(suffix)]
  inst = Instance(A, np.asarray(lp.row_lower_), np.asarray(lp.row_upper_), c + 0.0, np.asarray(lp.col_lower_),
                  np.asarray(lp.col_upper_), integer, offset + 0.0, name=str(lp.model_name_ or base),
                  var_names=names if len(names) == n else None)
  return inst.validate()


# ----------------------------------------------------------------------------------------------------------------
# SCIP.

def to_scip(inst: Instance, model=None):
  """Adds `inst` to a PySCIPOpt model (a new one by default); returns (model, variables in column order).

  Integer columns with bounds [0, 1] become binary ("B"), other integer columns "I", the rest "C"; one linear
  constraint per row (named r<i>), minimisation with the offset as SCIP's objective offset.
  """
  inst.validate()
  scip = _pyscipopt()
  model = scip.Model(inst.name) if model is None else model
  names = inst.var_names if inst.var_names is not None else [f"x{j}" for j in range(inst.num_cols)]
  xs = []
  for j in range(inst.num_cols):
    lb, ub = float(inst.lb[j]), float(inst.ub[j])
    vtype = "C"
    if inst.integer[j]:
      vtype = "B" if (lb, ub) == (0.0, 1.0) else "I"
    xs.append(model.addVar(name=names[j], vtype=vtype, lb=None if np.isinf(lb) else lb,
                           ub=None if np.isinf(ub) else ub, obj=float(inst.c[j])))
  A = inst.A
  for i in range(inst.num_rows):
    lo, hi = A.indptr[i], A.indptr[i + 1]
    expr = scip.quicksum(float(v) * xs[k] for k, v in zip(A.indices[lo:hi].tolist(), A.data[lo:hi].tolist()))
    lhs, rhs = float(inst.lhs[i]), float(inst.rhs[i])
    model.addCons(scip.ExprCons(expr, lhs=None if np.isinf(lhs) else lhs, rhs=None if np.isinf(rhs) else rhs),
                  name=f"r{i}")
  model.setMinimize()
  if inst.offset:
    if hasattr(model, "addObjoffset"):
      model.addObjoffset(inst.offset)
    else:   # very old PySCIPOpt
      model.setObjective(scip.quicksum(float(inst.c[j]) * x for j, x in enumerate(xs)) + inst.offset, "minimize")
  return model, xs


def from_scip(model) -> Instance:
  """Reads the original problem of a PySCIPOpt model (linear-type constraints only) as a minimisation Instance.

  Columns follow the variables' creation order (SCIP's variable index), rows the constraint order.
  """
  xs = sorted(model.getVars(), key=lambda x: x.getIndex())   # SCIP groups variables by type; restore creation order
  col = {x.ptr(): j for j, x in enumerate(xs)}
  inf = model.infinity()

  def finite(v: float) -> float:
    return float(np.copysign(np.inf, v)) if abs(v) >= inf else float(v)

  rows, cols, vals, lhs, rhs = [], [], [], [], []
  for i, cons in enumerate(model.getConss()):
    if not cons.isLinearType():
      raise DataError(f"from_scip: constraint '{cons.name}' ({cons.getConshdlrName()}) is not linear; only "
                      f"linear-type constraints can become an Instance")
    cvars, cvals = model.getConsVars(cons), model.getConsVals(cons)
    rows += [i] * len(cvars)
    cols += [col[v.ptr()] for v in cvars]
    vals += [float(v) for v in cvals]
    lhs.append(finite(model.getLhs(cons)))
    rhs.append(finite(model.getRhs(cons)))
  m, n = len(lhs), len(xs)
  A = sp.csr_matrix((np.asarray(vals, dtype=np.float64), (np.asarray(rows, dtype=np.int64),
                                                           np.asarray(cols, dtype=np.int64))), shape=(m, n))
  A.sum_duplicates()
  A.sort_indices()
  c = np.array([x.getObj() for x in xs], dtype=np.float64)
  offset = float(model.getObjoffset(original=True))
  if model.getObjectiveSense() == "maximize":
    c, offset = -c, -offset
  integer = np.array([x.vtype() in ("BINARY", "INTEGER") for x in xs], dtype=bool)
  lb = np.array([finite(x.getLbOriginal()) for x in xs], dtype=np.float64)
  ub = np.array([finite(x.getUbOriginal()) for x in xs], dtype=np.float64)
  return Instance(A, np.asarray(lhs, dtype=np.float64), np.asarray(rhs, dtype=np.float64), c + 0.0, lb, ub,
                  integer, offset + 0.0, name=str(model.getProbName()), var_names=[x.name for x in xs]).validate()
