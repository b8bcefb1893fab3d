"""Equivalent MILP transforms keep the LP relaxation and MILP optima (scipy's HiGHS as the judge), map feasible
points to feasible points with the same objective, and their column maps round-trip; perturb stays close."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from jaxlab.milp import augment as aug
from jaxlab.milp import generators as gen
from jaxlab.milp.instance import Instance, is_feasible, objective


def _rng(seed: int = 0) -> np.random.Generator:
  return np.random.default_rng(seed)


def _general() -> Instance:
  """General integers with negative bounds, an equality and a ranged row, a free continuous column, an offset."""
  A = sp.csr_matrix(np.array([[2.0, 1.0, 0.0, 1.0], [1.0, -1.0, 3.0, 0.0], [0.0, 1.0, 1.0, 1.0]]))
  return Instance(A, lhs=np.array([-np.inf, 2.0, 1.0]), rhs=np.array([7.5, 2.0, 9.0]),
                  c=np.array([-3.0, 2.0, -1.0, 0.5]),
                  lb=np.array([-2.0, 0.0, -3.0, -np.inf]), ub=np.array([4.0, 5.0, 3.0, 10.0]),
                  integer=np.array([True, True, True, False]), offset=1.25, name="general").validate()


CASES = {
    "general": _general,
    "setcover": lambda: gen.set_cover(_rng(1), 25, 40, 0.1),
    "indset": lambda: gen.independent_set(_rng(1), 30, 3),
    "facilities": lambda: gen.capacitated_facility_location(_rng(1), 6, 4),
    "cauctions": lambda: gen.combinatorial_auction(_rng(1), 10, 25),
}


def _lp(inst: Instance) -> float:
  fin_lo, fin_hi = np.isfinite(inst.lhs), np.isfinite(inst.rhs)
  A_ub = sp.vstack([inst.A[fin_hi], -inst.A[fin_lo]])
  b_ub = np.concatenate([inst.rhs[fin_hi], -inst.lhs[fin_lo]])
  res = linprog(inst.c, A_ub=A_ub, b_ub=b_ub, bounds=np.stack([inst.lb, inst.ub], 1), method="highs")
  assert res.status == 0, res.message
  return float(res.fun) + inst.offset


def _ip(inst: Instance) -> tuple[float, np.ndarray]:
  res = milp(inst.c, constraints=LinearConstraint(inst.A, inst.lhs, inst.rhs), integrality=inst.integer.astype(int),
             bounds=Bounds(inst.lb, inst.ub), options={"mip_rel_gap": 0.0})
  assert res.status == 0, res.message
  return float(res.fun) + inst.offset, res.x


def _transforms(inst: Instance, rng: np.random.Generator):
  """(name, new instance, col_perm, EquivMap) for each equivalent transform."""
  out = []
  new, cp, rp, emap = aug.permute(inst, rng, return_map=True)
  assert np.array_equal(rp, emap.row_perm) and sorted(rp) == list(range(inst.num_rows))
  out.append(("permute", new, cp, emap))
  out.append(("scale_rows", *aug.scale_rows(inst, rng, return_map=True)))
  out.append(("shift", *aug.shift_variables(inst, rng, return_map=True)))
  out.append(("scale_objective", *aug.scale_objective(inst, 2.5, return_map=True)))
  out.append(("equivalent", *aug.equivalent(inst, rng, return_map=True)))
  out.append(("all", *aug.equivalent(inst, rng, kinds=aug.KINDS, return_map=True)))
  return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_equivalent_transforms_keep_optima_and_points(case):
  inst = CASES[case]()
  lp, (ip, x_old) = _lp(inst), _ip(inst)
  for name, new, cp, emap in _transforms(inst, _rng(11)):
    new.validate()
    beta = emap.obj_scale
    assert new.A.shape == inst.A.shape and np.array_equal(cp, emap.col_perm), name
    assert _lp(new) == pytest.approx(beta * lp, rel=1e-7, abs=1e-9), name
    ip_new, x_new_opt = _ip(new)
    assert ip_new == pytest.approx(beta * ip, rel=1e-7, abs=1e-9), name
    x_new = emap.point(x_old)                                 # old optimum -> feasible new point, same value
    assert is_feasible(new, x_new, tol=1e-6), name
    assert objective(new, x_new) == pytest.approx(beta * objective(inst, x_old), rel=1e-9, abs=1e-9), name
    x_back = emap.point_back(x_new_opt)                       # and back
    assert is_feasible(inst, x_back, tol=1e-6), name
    assert objective(inst, x_back) == pytest.approx(ip, rel=1e-7, abs=1e-9), name
    np.testing.assert_allclose(emap.point_back(x_new), x_old, atol=1e-12)
    inv = aug.map_candidates(cp)                              # old column j lives at inv[j]
    np.testing.assert_array_equal(inv[cp], np.arange(inst.num_cols))
    np.testing.assert_array_equal(cp[inv], np.arange(inst.num_cols))
    np.testing.assert_allclose(new.c[inv], beta * inst.c, rtol=1e-15)
    np.testing.assert_array_equal(new.integer[inv], inst.integer)
    np.testing.assert_array_equal(emap.new_index(np.arange(inst.num_cols)), inv)
    if inst.var_names is not None:
      assert [new.var_names[j] for j in inv] == inst.var_names


def test_each_transform_does_what_it_says():
  inst = _general()
  new, cp, rp = aug.permute(inst, _rng(0))
  np.testing.assert_array_equal(new.A.toarray(), inst.A.toarray()[rp][:, cp])
  np.testing.assert_array_equal(new.lhs, inst.lhs[rp])
  np.testing.assert_array_equal(new.ub, inst.ub[cp])

  new, cp = aug.scale_rows(inst, _rng(0), low=0.5, high=2.0)
  np.testing.assert_array_equal(cp, np.arange(4))
  ratio = new.A.toarray().sum(1) / inst.A.toarray().sum(1)
  assert ((ratio >= 0.5) & (ratio <= 2.0)).all() and not np.allclose(ratio, 1.0)
  np.testing.assert_allclose(new.rhs, inst.rhs * ratio)
  np.testing.assert_array_equal(np.isinf(new.lhs), np.isinf(inst.lhs))

  new, cp, emap = aug.shift_variables(inst, _rng(0), max_shift=3, return_map=True)
  s = emap.shift
  assert np.all(s == np.round(s)) and np.abs(s).max() <= 3 and s[3] == 0 and np.any(s != 0)
  np.testing.assert_array_equal(new.lb, inst.lb - s)
  np.testing.assert_allclose(new.rhs, inst.rhs - inst.A @ s)
  assert new.offset == pytest.approx(inst.offset + inst.c @ s)

  cover = gen.set_cover(_rng(0), 10, 20, 0.2)                 # binaries become shifted general integers
  new, _, emap = aug.shift_variables(cover, _rng(1), return_map=True)
  np.testing.assert_array_equal(new.ub - new.lb, 1.0)
  assert (new.lb != 0).any() and new.integer.all()

  new, cp = aug.scale_objective(inst, 0.25)
  np.testing.assert_array_equal(new.c, 0.25 * inst.c)
  assert new.offset == 0.25 * inst.offset and inst.c[0] == -3.0   # input untouched


def test_composition_matches_manual_chain():
  inst = gen.capacitated_facility_location(_rng(2), 5, 3)
  new, cp, emap = aug.equivalent(inst, _rng(3), kinds=("permute", "shift", "scale_rows", "permute"),
                                 return_map=True)
  rng = _rng(3)
  a, cp1, _, m1 = aug.permute(inst, rng, return_map=True)
  b, cp2, m2 = aug.shift_variables(a, rng, return_map=True)
  c, cp3, m3 = aug.scale_rows(b, rng, return_map=True)
  d, cp4, _, m4 = aug.permute(c, rng, return_map=True)
  np.testing.assert_array_equal(cp, cp1[cp2][cp3][cp4])
  np.testing.assert_array_equal(new.A.toarray(), d.A.toarray())
  np.testing.assert_array_equal(new.rhs, d.rhs)
  x = _rng(4).random(inst.num_cols)
  np.testing.assert_allclose(emap.point(x), m4.point(m3.point(m2.point(m1.point(x)))))
  np.testing.assert_allclose(new.A.toarray() @ emap.point(x) - new.rhs,                  # rows: scaled copies
                             emap.row_scale * (inst.A.toarray() @ x - inst.rhs)[emap.row_perm])


def test_perturb_is_close_and_keeps_integrality():
  cover = gen.set_cover(_rng(0), 30, 50, 0.1)
  new = aug.perturb(cover, _rng(1), sigma=0.05)
  assert new.A.shape == cover.A.shape and (new.A != cover.A).nnz == 0
  np.testing.assert_array_equal(new.lhs, cover.lhs)
  assert np.all(new.c == np.round(new.c)) and new.c.min() >= 1 and not np.array_equal(new.c, cover.c)
  assert (np.abs(new.c - cover.c) <= 4 * 0.06 * cover.c + 0.5).all()

  fac = gen.capacitated_facility_location(_rng(0), 6, 4)      # float costs stay float, sides perturbed per row
  new = aug.perturb(fac, _rng(2), sigma=0.1, what=["c", "rhs"])   # a list, as from JSON
  ratio = new.c / fac.c
  assert (np.abs(np.log(ratio)) <= 0.5).all() and np.std(ratio) > 0
  assert np.all(new.lhs <= new.rhs)
  np.testing.assert_array_equal(np.isinf(new.lhs), np.isinf(fac.lhs))

  general = _general()                                        # integral ranged/equality rows keep lhs <= rhs
  for seed in range(20):
    new = aug.perturb(general, _rng(seed), sigma=0.5, what=("rhs",))
    new.validate()
    assert new.lhs[1] == new.rhs[1]
  assert aug.perturb(general, _rng(0), sigma=0.0, what=("c", "rhs")).c.tolist() == general.c.tolist()


def test_bad_arguments():
  inst = _general()
  with pytest.raises(ValueError, match="beta must be positive"):
    aug.scale_objective(inst, 0.0)
  with pytest.raises(ValueError, match=r"unknown transform\(s\) \['rotate'\]"):
    aug.equivalent(inst, _rng(0), kinds=("permute", "rotate"))
  with pytest.raises(ValueError, match="need 0 < low <= high"):
    aug.scale_rows(inst, _rng(0), low=2.0, high=1.0)
  with pytest.raises(ValueError, match="max_shift must be a nonnegative integer"):
    aug.shift_variables(inst, _rng(0), max_shift=-1)
  with pytest.raises(ValueError, match="`what` within"):
    aug.perturb(inst, _rng(0), what=("A",))
