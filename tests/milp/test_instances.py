"""MILP instances: generator distributions, LP/MPS files through HiGHS, SCIP conversion, bad input, and optimal
values cross-checked between three solvers (scipy's HiGHS on the arrays, SCIP via to_scip, HiGHS on the file)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from jaxlab.milp import generators as gen
from jaxlab.milp import instance as mi
from jaxlab.milp.instance import Instance


def _rng(seed: int = 0) -> np.random.Generator:
  return np.random.default_rng(seed)


def _same(a: Instance, b: Instance, names: bool = True) -> None:
  assert a.A.shape == b.A.shape
  np.testing.assert_array_equal(a.A.toarray(), b.A.toarray())
  for f in ("lhs", "rhs", "c", "lb", "ub", "integer"):
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
  assert a.offset == b.offset
  if names:
    assert a.var_names == b.var_names


def _scipy_optimum(inst: Instance) -> tuple[float, np.ndarray]:
  res = milp(inst.c, constraints=LinearConstraint(inst.A, inst.lhs, inst.rhs), integrality=inst.integer.astype(int),
             bounds=Bounds(inst.lb, inst.ub), options={"mip_rel_gap": 0.0})
  assert res.status == 0, res.message
  return float(res.fun) + inst.offset, res.x


def _mixed() -> Instance:
  """Every feature: ranged, equality, one-sided rows; free, general integer, binary, negative bounds; offset."""
  A = sp.csr_matrix(np.array([[1.0, 2.0, 0.0, -1.0], [0.0, 1.0, -1.5, 0.0], [3.0, 0.0, 1.0, 1.0]]))
  return Instance(A, lhs=np.array([-1.0, 1.0, -np.inf]), rhs=np.array([4.0, 1.0, 7.5]),
                  c=np.array([1.0, -2.0, 3.0, 0.5]), lb=np.array([0.0, -np.inf, -2.0, 0.0]),
                  ub=np.array([1.0, np.inf, 5.0, np.inf]), integer=np.array([True, False, True, False]),
                  offset=2.5, name="mixed", var_names=["a", "b", "z", "w"]).validate()


# ----------------------------------------------------------------------------------------------------------------
# Generators.

@pytest.mark.parametrize("rows,cols,density", [(500, 1000, 0.05), (30, 60, 0.1), (40, 20, 0.01)])
def test_set_cover_distribution(rows, cols, density):
  inst = gen.set_cover(_rng(1), n_rows=rows, n_cols=cols, density=density)
  A = inst.A.toarray()
  assert A.shape == (rows, cols) and (inst.A.data == 1).all()
  per_row, per_col = A.sum(1), A.sum(0)
  assert per_row.min() >= 2 and per_col.min() >= 1
  target = round(rows * cols * density)
  if target >= cols + 2 * rows:       # the first two steps (a row per column, 2 columns per row) fit the target
    assert inst.A.nnz == target
  else:
    assert inst.A.nnz > target
  if rows == 500:
    assert inst.A.nnz == 25000 and abs(inst.A.nnz / (rows * cols) - 0.05) < 1e-12
    assert per_col.mean() == pytest.approx(25.0) and per_col.std() < 8    # entries spread over columns
  assert np.all(inst.c == np.round(inst.c)) and inst.c.min() >= 1 and inst.c.max() <= 100
  if rows == 500:
    assert inst.c.min() == 1 and inst.c.max() == 100
  np.testing.assert_array_equal(inst.lhs, 1.0)
  assert np.isinf(inst.rhs).all() and inst.integer.all() and (inst.lb == 0).all() and (inst.ub == 1).all()


def test_generators_are_deterministic_given_the_seed():
  for kind, sizes in [("setcover", dict(n_rows=40, n_cols=80)), ("cauctions", dict(n_items=20, n_bids=60)),
                      ("facilities", dict(n_customers=7, n_facilities=5)), ("indset", dict(n_nodes=60))]:
    a, b, c = (gen.generate(kind, _rng(s), **sizes) for s in (3, 3, 4))
    _same(a, b)
    assert a.A.shape != c.A.shape or (a.A != c.A).nnz or not np.array_equal(a.c, c.c), kind


def test_combinatorial_auction_distribution():
  inst = gen.combinatorial_auction(_rng(2), n_items=100, n_bids=500)
  m, n = inst.A.shape
  assert n == 500 and inst.integer.all() and (inst.ub == 1).all() and (inst.lb == 0).all()
  assert (inst.c < 0).all()                                   # prices positive (min -price . x)
  assert np.isinf(inst.lhs).all() and (inst.rhs == 1).all() and set(np.unique(inst.A.data)) == {1.0}
  items, dummies = inst.A[:100].toarray(), inst.A[100:].toarray()   # every item is bid on at this size
  size = items.sum(0)
  assert size.min() >= 1 and 2.0 < size.mean() < 6.0          # E|bundle| ~ 1 / (1 - add_item_prob)
  assert dummies.sum(0).max() <= 1 and dummies.sum(1).min() >= 2 and m > 100
  for row in dummies:                                         # a bidder's XOR bids are consecutive
    cols = np.flatnonzero(row)
    assert np.array_equal(cols, np.arange(cols[0], cols[0] + len(cols))) and len(cols) <= 6
  small = gen.combinatorial_auction(_rng(5), n_items=10, n_bids=25)
  assert small.num_cols == 25 and (np.diff(small.A.tocsc().indptr) >= 1).all() and (small.c < 0).all()


@pytest.mark.parametrize("nc,nf", [(6, 4), (100, 100)])
def test_facility_location_distribution(nc, nf):
  inst = gen.capacitated_facility_location(_rng(3), n_customers=nc, n_facilities=nf, ratio=5.0)
  nx = nc * nf
  assert inst.num_cols == nx + nf and inst.num_rows == nc + nf + 1 + nx
  np.testing.assert_array_equal(inst.integer, np.arange(nx + nf) >= nx)
  assert (inst.lb == 0).all() and (inst.ub == 1).all()
  total = inst.A[nc + nf].toarray()[0]                        # sum_i s_i y_i >= sum_j d_j
  capacity, demand_total = total[nx:], inst.lhs[nc + nf]
  assert capacity.sum() == pytest.approx(5.0 * demand_total, rel=1e-12)
  cap_rows = inst.A[nc:nc + nf].toarray()
  demand = cap_rows[0, :nc]
  assert demand.min() >= 5 and demand.max() <= 35 and np.all(demand == np.round(demand))
  np.testing.assert_array_equal(-cap_rows[np.arange(nf), nx + np.arange(nf)], capacity)
  fixed = inst.c[nx:]
  assert np.all(fixed == np.round(fixed)) and fixed.min() >= np.floor(100 * np.sqrt(10))
  assert fixed.max() <= 110 * np.sqrt(160) + 90
  trans = inst.c[:nx].reshape(nf, nc)
  assert (trans >= 0).all() and (trans <= 10 * np.sqrt(2) * demand[None, :] + 1e-9).all()
  tight = inst.A[nc + nf + 1:]
  assert tight.shape[0] == nx and (tight.sum(1) == 0).all() and (inst.rhs[nc + nf + 1:] == 0).all()


@pytest.mark.parametrize("n,a", [(60, 3), (500, 4)])
def test_independent_set_graph_and_cliques(n, a):
  edges = gen.barabasi_albert(_rng(4), n, a)
  inst = gen.independent_set(_rng(4), n_nodes=n, affinity=a)
  assert len(edges) == a * (n - a) and (edges[:, 0] < edges[:, 1]).all()
  assert len({tuple(e) for e in edges.tolist()}) == len(edges)
  degree = np.bincount(edges.ravel(), minlength=n)
  assert degree.min() >= 1 and degree[a + 1:].min() >= a and degree.max() > 3 * a   # hubs: preferential
  adj = set(map(tuple, edges.tolist()))
  covered = set()
  for row in range(inst.num_rows):
    k = inst.A.indices[inst.A.indptr[row]:inst.A.indptr[row + 1]]
    assert len(k) >= 2
    pairs = {(int(u), int(v)) for u in k for v in k if u < v}
    assert pairs <= adj, "a row is not a clique"
    covered |= pairs
  assert covered == adj                                       # every edge is covered by some clique row
  assert inst.num_cols == n and (inst.c == -1).all() and (inst.rhs == 1).all() and inst.integer.all()
  part = gen.greedy_clique_partition(n, edges)
  assert sorted(v for k in part for v in k) == list(range(n))


def test_sizes_and_generate():
  s, levels = gen.SIZES, ("easy", "medium", "hard")
  assert set(gen.GENERATORS) == set(s) == {"setcover", "cauctions", "facilities", "indset"}
  assert [s["setcover"][d]["n_rows"] for d in levels] == [500, 1000, 2000]
  assert all(s["setcover"][d]["n_cols"] == 1000 and s["setcover"][d]["density"] == 0.05 for d in levels)
  assert [(s["cauctions"][d]["n_items"], s["cauctions"][d]["n_bids"]) for d in levels] == [(100, 500), (200, 1000),
                                                                                        (300, 1500)]
  assert [(s["facilities"][d]["n_customers"], s["facilities"][d]["n_facilities"]) for d in levels] == [
      (100, 100), (200, 100), (400, 100)]
  assert [(s["indset"][d]["n_nodes"], s["indset"][d]["affinity"]) for d in levels] == [(500, 4), (1000, 4), (1500, 4)]
  inst = gen.generate("setcover", _rng(0), "easy", n_rows=50)
  assert inst.A.shape == (50, 1000)
  with pytest.raises(ValueError, match="unknown MILP benchmark 'knapsack'; choose one of setcover"):
    gen.generate("knapsack", _rng(0))
  with pytest.raises(ValueError, match="unknown difficulty 'huge'"):
    gen.generate("indset", _rng(0), "huge")


def test_import_is_numpy_only():
  code = "import sys, jaxlab.milp; print(sorted(m for m in ('jax', 'pyscipopt', 'highspy') if m in sys.modules))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------------------------------------------
# Helpers and validation.

def test_objective_and_feasibility():
  inst = _mixed()
  x = np.array([1.0, 0.5, 0.0, 0.0])      # rows: 2 in [-1,4]; 0.5 != 1 -> infeasible
  assert not mi.is_feasible(inst, x)
  x = np.array([1.0, 1.0, 0.0, 0.0])      # rows 3, 1, 3
  assert mi.is_feasible(inst, x) and mi.objective(inst, x) == pytest.approx(1 - 2 + 2.5)
  assert not mi.is_feasible(inst, x + np.array([0, 0, 0.5, 0]))   # z fractional (and row 1 broken)
  assert not mi.is_feasible(inst, np.array([1.0, 1.0, 0.0]))       # wrong length
  cp = inst.copy()
  cp.c[0] = 99
  assert inst.c[0] == 1.0 and cp.var_names == inst.var_names and cp.var_names is not inst.var_names


def test_validate_messages():
  good = _mixed()
  bad = good.copy()
  bad.lhs = np.zeros(2)
  with pytest.raises(ValueError, match=r"lhs has shape \(2,\) but A is 3x4; give lhs one entry per row"):
    bad.validate()
  bad = good.copy()
  bad.c = np.array([1.0, np.nan, 0, 0])
  with pytest.raises(ValueError, match="c contains NaN at index 1"):
    bad.validate()
  bad = good.copy()
  bad.lb[2] = 6.0
  with pytest.raises(ValueError, match="column 2 has lb=6.0 > ub=5.0"):
    bad.validate()
  bad = good.copy()
  bad.lhs[1] = 2.0
  with pytest.raises(ValueError, match="row 1 has lhs=2.0 > rhs=1.0"):
    bad.validate()
  bad = good.copy()
  bad.var_names = ["a"]
  with pytest.raises(ValueError, match="var_names has 1 names for 4 columns"):
    bad.validate()


# ----------------------------------------------------------------------------------------------------------------
# Files.

@pytest.fixture(scope="module")
def highspy():
  return pytest.importorskip("highspy", reason="file IO needs highspy: pip install 'jaxlab[milp]'")


@pytest.mark.parametrize("suffix", [".mps", ".mps.gz"])
def test_mps_round_trip_is_exact(tmp_path, highspy, suffix):
  for inst in (_mixed(), gen.capacitated_facility_location(_rng(0), 5, 3), gen.set_cover(_rng(0), 20, 30, 0.1)):
    path = str(tmp_path / f"{inst.name}{suffix}")
    mi.write(inst, path)
    if suffix.endswith(".gz"):
      assert open(path, "rb").read(2) == b"\x1f\x8b"
    back = mi.read(path)
    _same(inst, back)
    assert back.name == inst.name


@pytest.mark.parametrize("suffix", [".lp", ".lp.gz"])
def test_lp_round_trip_up_to_column_order(tmp_path, highspy, suffix):
  """HiGHS's LP reader numbers columns by first appearance: compare after matching names (no ranged rows)."""
  base = _mixed()
  base.lhs[0] = -np.inf
  for inst in (base, gen.independent_set(_rng(0), 25, 2), gen.combinatorial_auction(_rng(0), 8, 15)):
    path = str(tmp_path / f"m{suffix}")
    mi.write(inst, path)
    back = mi.read(path)
    order = [back.var_names.index(v) for v in inst.var_names]
    back.A, back.c, back.lb, back.ub = back.A[:, order], back.c[order], back.lb[order], back.ub[order]
    back.integer, back.var_names = back.integer[order], [back.var_names[j] for j in order]
    _same(inst, back)


def test_read_hand_written_mps_maximisation(tmp_path, highspy):
  text = textwrap.dedent("""\
      NAME          TINY
      OBJSENSE
          MAX
      ROWS
       N  COST
       L  LIM1
       G  LIM2
       E  MYEQN
      COLUMNS
          MARKER                 'MARKER'                 'INTORG'
          X1        COST         1.0   LIM1         1.0
          X1        LIM2         1.0
          MARKER                 'MARKER'                 'INTEND'
          X2        COST         2.0   LIM1         1.0
          X2        MYEQN       -1.0
          X3        COST        -1.0   MYEQN        1.0
      RHS
          RHS       COST        -3.0
          RHS       LIM1         4.0   LIM2         1.0
          RHS       MYEQN        7.0
      RANGES
          RNG       LIM1         2.5
      BOUNDS
       UP BND       X1           4.0
       LO BND       X2          -1.0
       UP BND       X2           1.0
       MI BND       X3
      ENDATA
      """)
  path = tmp_path / "tiny.mps"
  path.write_text(text)
  inst = mi.read(str(path))
  np.testing.assert_array_equal(inst.A.toarray(), [[1, 1, 0], [1, 0, 0], [0, -1, 1]])
  np.testing.assert_array_equal(inst.lhs, [1.5, 1.0, 7.0])     # L row with range R: [rhs - |R|, rhs]
  np.testing.assert_array_equal(inst.rhs, [4.0, np.inf, 7.0])
  np.testing.assert_array_equal(inst.c, [-1.0, -2.0, 1.0])     # max -> min of the negation
  assert inst.offset == -3.0                                   # RHS on the objective row = -constant; negated
  np.testing.assert_array_equal(inst.lb, [0.0, -1.0, -np.inf])
  np.testing.assert_array_equal(inst.ub, [4.0, 1.0, np.inf])
  np.testing.assert_array_equal(inst.integer, [True, False, False])
  assert inst.var_names == ["X1", "X2", "X3"]


def test_read_and_write_errors(tmp_path, highspy):
  with pytest.raises(FileNotFoundError, match=r"nope\.mps: no such model file; check the path"):
    mi.read(str(tmp_path / "nope.mps"))
  (tmp_path / "model.txt").write_text("x")
  with pytest.raises(ValueError, match=r"model\.txt: unknown model file suffix; use one of \.lp, \.mps"):
    mi.read(str(tmp_path / "model.txt"))
  with pytest.raises(ValueError, match="unknown model file suffix"):
    mi.write(_mixed(), str(tmp_path / "model.json"))
  with pytest.raises(FileNotFoundError, match="does not exist; create it first"):
    mi.write(_mixed(), str(tmp_path / "missing" / "m.mps"))
  (tmp_path / "junk.mps").write_text("this is not a model\n")
  with pytest.raises(ValueError, match=r"junk\.mps: HiGHS could not parse this \.mps file"):
    mi.read(str(tmp_path / "junk.mps"))
  (tmp_path / "junk.lp").write_text("minimize\n obj: 3 x +\nsubject to\n c1: x >=\nend\n")
  with pytest.raises(ValueError, match="HiGHS could not parse this .lp file"):
    mi.read(str(tmp_path / "junk.lp"))


# ----------------------------------------------------------------------------------------------------------------
# SCIP.

@pytest.fixture(scope="module")
def pyscipopt():
  return pytest.importorskip("pyscipopt", reason="SCIP conversion needs pyscipopt: pip install 'jaxlab[milp]'")


def test_scip_round_trip(pyscipopt):
  for inst in (_mixed(), gen.capacitated_facility_location(_rng(1), 4, 3), gen.independent_set(_rng(1), 20, 2)):
    model, xs = mi.to_scip(inst)
    assert [x.name for x in xs] == inst.var_names
    want = ["BINARY" if i and lo == 0 and hi == 1 else "INTEGER" if i else "CONTINUOUS"
            for i, lo, hi in zip(inst.integer, inst.lb, inst.ub)]
    assert [x.vtype() for x in xs] == want
    _same(inst, mi.from_scip(model))


def test_scip_reads_our_mps_files_exactly(tmp_path, highspy, pyscipopt):
  for inst in (_mixed(), gen.capacitated_facility_location(_rng(2), 4, 3), gen.combinatorial_auction(_rng(2), 8, 20)):
    path = str(tmp_path / "m.mps")
    mi.write(inst, path)
    model = pyscipopt.Model()
    model.hideOutput()
    model.readProblem(path)
    _same(inst, mi.from_scip(model))


def test_from_scip_maximisation_and_nonlinear(pyscipopt):
  m = pyscipopt.Model("maxi")
  x, y = m.addVar("x", vtype="I", lb=-3, ub=4, obj=2.0), m.addVar("y", lb=None, ub=None, obj=-1.0)
  m.addCons(x + 2 * y <= 5)
  m.addCons(pyscipopt.ExprCons(x - y, lhs=-1.0, rhs=1.0))
  m.addObjoffset(1.5)
  m.setMaximize()
  inst = mi.from_scip(m)
  np.testing.assert_array_equal(inst.A.toarray(), [[1, 2], [1, -1]])
  np.testing.assert_array_equal(inst.lhs, [-np.inf, -1.0])
  np.testing.assert_array_equal(inst.rhs, [5.0, 1.0])
  np.testing.assert_array_equal(inst.c, [-2.0, 1.0])
  assert inst.offset == -1.5 and list(inst.integer) == [True, False]
  np.testing.assert_array_equal(inst.lb, [-3.0, -np.inf])
  np.testing.assert_array_equal(inst.ub, [4.0, np.inf])
  m.addCons(x * y <= 3)
  with pytest.raises(ValueError, match="is not linear"):
    mi.from_scip(m)


# ----------------------------------------------------------------------------------------------------------------
# Independent reference: three solvers agree on the optimum.

@pytest.mark.parametrize("kind,sizes", [("setcover", dict(n_rows=100, n_cols=200, density=0.05)),
                                        ("indset", dict(n_nodes=80, affinity=4)),
                                        ("facilities", dict(n_customers=15, n_facilities=8)),
                                        ("cauctions", dict(n_items=25, n_bids=80))])
def test_optimum_agrees_across_solvers(tmp_path, highspy, pyscipopt, kind, sizes):
  """Sizes where the LP bound is strictly below the integer optimum, so the solvers have to branch or cut."""
  inst = gen.generate(kind, _rng(7), **sizes)
  ref, x = _scipy_optimum(inst)
  relaxed = milp(inst.c, constraints=LinearConstraint(inst.A, inst.lhs, inst.rhs), bounds=Bounds(inst.lb, inst.ub))
  assert relaxed.fun + inst.offset < ref - 1e-3
  assert mi.is_feasible(inst, x) and mi.objective(inst, x) == pytest.approx(ref, rel=1e-6)

  model, _ = mi.to_scip(inst)
  model.hideOutput()
  model.setParam("limits/gap", 0.0)
  model.optimize()
  assert model.getStatus() == "optimal"
  assert model.getObjVal() == pytest.approx(ref, rel=1e-6, abs=1e-6)

  path = str(tmp_path / "m.mps")
  mi.write(inst, path)
  h = highspy.Highs()
  h.setOptionValue("output_flag", False)
  h.setOptionValue("mip_rel_gap", 0.0)
  assert h.readModel(path) == highspy.HighsStatus.kOk
  h.run()
  assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
  assert h.getInfo().objective_function_value == pytest.approx(ref, rel=1e-6, abs=1e-6)
  assert _scipy_optimum(mi.read(path))[0] == pytest.approx(ref, rel=1e-6, abs=1e-6)
  assert os.path.getsize(path) > 0
