"""Equivalent reformulations of a MILP instance, for data augmentation of learned branching policies.

Each transform maps an `Instance` to one with a one-to-one correspondence of points,
`x_new = x_old[col_perm] - shift`, under which rows, bounds and integrality hold in one exactly when they hold
in the other, and objective values are equal (times `beta` for `scale_objective`). The LP relaxation's optimum
and the set of optimal (fractional) points therefore correspond too, and so do branching candidates and
strong-branching scores: a label for old column j belongs to new column `map_candidates(col_perm)[j]`. (A
solver may still behave differently on the new instance through tie-breaking and floating-point effects.)

- `permute`: random row and column order.
- `scale_rows`: each row (its coefficients and both sides) times a positive factor, log-uniform in [low, high].
- `shift_variables`: x = x' + s with integer s for integer columns with finite bounds, as in CAMBranch
  (Lin et al., ICLR 2024): bounds and row sides move by s and A s, the offset absorbs c.s; binary columns
  become general integers with bounds [-s, 1 - s].
- `scale_objective`: c and offset times beta > 0.
- `equivalent`: a composition of the above with the composed column permutation.

`perturb` is not equivalent: multiplicative noise on c (and optionally row sides), for "nearby" instances whose
labels are reused approximately. Numpy only: SCIP workers import this module.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from jaxlab.errors import DataError
from jaxlab.milp.instance import Instance


@dataclasses.dataclass(frozen=True)
class EquivMap:
  """How a transformed instance corresponds to the original.

  Attributes:
    col_perm: (n,) col_perm[j_new] = j_old.
    row_perm: (m,) row_perm[i_new] = i_old.
    row_scale: (m,) new row i = row_scale[i] * (old row row_perm[i]), after the variable change.
    shift: (n,) x_new = x_old[col_perm] - shift.
    obj_scale: objective_new(x_new) = obj_scale * objective_old(x_old).
  """
  col_perm: np.ndarray
  row_perm: np.ndarray
  row_scale: np.ndarray
  shift: np.ndarray
  obj_scale: float = 1.0

  @classmethod
  def identity(cls, inst: Instance) -> EquivMap:
    m, n = inst.A.shape
    return cls(np.arange(n), np.arange(m), np.ones(m), np.zeros(n), 1.0)

  def point(self, x_old: np.ndarray) -> np.ndarray:
    """The new instance's point corresponding to a point of the old instance."""
    return np.asarray(x_old, dtype=np.float64)[self.col_perm] - self.shift

  def point_back(self, x_new: np.ndarray) -> np.ndarray:
    """The old instance's point corresponding to a point of the new instance."""
    x_old = np.empty(len(self.col_perm))
    x_old[self.col_perm] = np.asarray(x_new, dtype=np.float64) + self.shift
    return x_old

  def new_index(self, j_old):
    """New column index (or indices) of old column(s) j_old."""
    return map_candidates(self.col_perm)[j_old]

  def then(self, other: EquivMap) -> EquivMap:
    """This map followed by `other` (which maps this map's output instance further)."""
    return EquivMap(self.col_perm[other.col_perm], self.row_perm[other.row_perm],
                    other.row_scale * self.row_scale[other.row_perm], self.shift[other.col_perm] + other.shift,
                    self.obj_scale * other.obj_scale)


def map_candidates(col_perm: np.ndarray) -> np.ndarray:
  """Inverse of a column permutation: `new_index = inv[old_index]` (inv[col_perm[j]] = j)."""
  col_perm = np.asarray(col_perm, dtype=np.int64)
  inv = np.empty_like(col_perm)
  inv[col_perm] = np.arange(len(col_perm))
  return inv


def _out(inst: Instance, emap: EquivMap, return_map: bool, *extra):
  return (inst, emap.col_perm, *extra) + ((emap,) if return_map else ())


def _permute(inst: Instance, rng: np.random.Generator) -> tuple[Instance, EquivMap]:
  m, n = inst.A.shape
  cp, rp = rng.permutation(n), rng.permutation(m)
  new = Instance(inst.A[rp][:, cp], inst.lhs[rp], inst.rhs[rp], inst.c[cp], inst.lb[cp], inst.ub[cp],
                 inst.integer[cp], inst.offset, inst.name,
                 None if inst.var_names is None else [inst.var_names[j] for j in cp])
  return new, EquivMap(cp, rp, np.ones(m), np.zeros(n))


def permute(inst: Instance, rng: np.random.Generator, return_map: bool = False):
  """Random row and column permutation: returns (new, col_perm, row_perm[, EquivMap])."""
  new, emap = _permute(inst, rng)
  return _out(new, emap, return_map, emap.row_perm)


def _scale_rows(inst: Instance, rng: np.random.Generator, low: float, high: float) -> tuple[Instance, EquivMap]:
  if not 0 < low <= high:
    raise DataError(f"scale_rows: need 0 < low <= high (got low={low}, high={high})")
  scale = np.exp(rng.uniform(np.log(low), np.log(high), size=inst.num_rows))
  new = inst.copy()
  new.A = sp.csr_matrix(sp.diags(scale) @ inst.A)
  new.lhs, new.rhs = inst.lhs * scale, inst.rhs * scale   # +-inf stay +-inf (scale > 0)
  emap = EquivMap.identity(inst)
  return new, dataclasses.replace(emap, row_scale=scale)


def scale_rows(inst: Instance, rng: np.random.Generator, low: float = 0.5, high: float = 2.0,
               return_map: bool = False):
  """Each row times a positive log-uniform factor in [low, high]: returns (new, col_perm[, EquivMap])."""
  return _out(*_scale_rows(inst, rng, low, high), return_map)


def _shift(inst: Instance, rng: np.random.Generator, max_shift: int) -> tuple[Instance, EquivMap]:
  if max_shift < 0 or int(max_shift) != max_shift:
    raise DataError(f"shift_variables: max_shift must be a nonnegative integer (got {max_shift})")
  movable = inst.integer & np.isfinite(inst.lb) & np.isfinite(inst.ub)
  s = np.where(movable, rng.integers(-max_shift, max_shift + 1, size=inst.num_cols), 0).astype(np.float64)
  As = inst.A @ s
  new = inst.copy()
  new.lhs, new.rhs = inst.lhs - As, inst.rhs - As
  new.lb, new.ub = inst.lb - s, inst.ub - s
  new.offset = inst.offset + float(inst.c @ s)
  return new, dataclasses.replace(EquivMap.identity(inst), shift=s)


def shift_variables(inst: Instance, rng: np.random.Generator, max_shift: int = 3, return_map: bool = False):
  """x = x' + s, s integer in [-max_shift, max_shift] for integer columns with finite bounds, 0 otherwise:
  returns (new, col_perm[, EquivMap]); x_new = x_old - s."""
  return _out(*_shift(inst, rng, max_shift), return_map)


def _scale_objective(inst: Instance, beta: float) -> tuple[Instance, EquivMap]:
  if not (beta > 0 and np.isfinite(beta)):
    raise DataError(f"scale_objective: beta must be positive and finite (got {beta})")
  new = inst.copy()
  new.c, new.offset = inst.c * beta, inst.offset * beta
  return new, dataclasses.replace(EquivMap.identity(inst), obj_scale=float(beta))


def scale_objective(inst: Instance, beta: float, return_map: bool = False):
  """c and offset times beta > 0: returns (new, col_perm[, EquivMap])."""
  return _out(*_scale_objective(inst, beta), return_map)


KINDS = ("permute", "scale_rows", "shift", "scale_objective")


def equivalent(inst: Instance, rng: np.random.Generator, kinds: Sequence[str] = ("permute", "scale_rows", "shift"),
               return_map: bool = False):
  """Applies `kinds` in order (scale_objective draws beta log-uniform in [0.5, 2]); returns
  (new, col_perm[, EquivMap]) with the composed permutation, col_perm[j_new] = j_old."""
  unknown = [k for k in kinds if k not in KINDS]
  if unknown:
    raise DataError(f"equivalent: unknown transform(s) {unknown}; choose from {', '.join(KINDS)}")
  emap, cur = EquivMap.identity(inst), inst
  for k in kinds:
    if k == "permute":
      cur, step = _permute(cur, rng)
    elif k == "scale_rows":
      cur, step = _scale_rows(cur, rng, 0.5, 2.0)
    elif k == "shift":
      cur, step = _shift(cur, rng, 3)
    else:
      cur, step = _scale_objective(cur, float(np.exp(rng.uniform(np.log(0.5), np.log(2.0)))))
    emap = emap.then(step)
  return _out(cur, emap, return_map)


def _integral(*arrays: np.ndarray) -> bool:
  return all(np.all(a[np.isfinite(a)] == np.round(a[np.isfinite(a)])) for a in arrays)


def _noisy(values: np.ndarray, factor: np.ndarray, integral: bool) -> np.ndarray:
  """values * factor; if `integral`, rounded with nonzero entries keeping their sign and |v| >= 1 (monotone, so
  lhs <= rhs survives when both sides get the same factor)."""
  out = values * factor
  if integral:
    finite = np.isfinite(values)
    out = np.where(finite, np.round(out), out)
    nz = finite & (values != 0)
    out[nz] = np.sign(values[nz]) * np.maximum(np.abs(out[nz]), 1.0)
  return out


def perturb(inst: Instance, rng: np.random.Generator, sigma: float = 0.05, what: Sequence[str] = ("c",)) -> Instance:
  """NOT equivalent: multiplies c (what has "c") and/or each row's finite sides (what has "rhs", one factor per
  row) by exp(sigma * N(0, 1)); integral data stays integral. Returns the new instance (columns and rows keep their
  order, so labels carry over by index)."""
  bad = [w for w in what if w not in ("c", "rhs")]
  if bad or sigma < 0:
    raise DataError(f"perturb: need sigma >= 0 and `what` within ('c', 'rhs') (got sigma={sigma}, what={what})")
  new = inst.copy()
  if "c" in what:
    new.c = _noisy(inst.c, np.exp(sigma * rng.standard_normal(inst.num_cols)), _integral(inst.c))
  if "rhs" in what:
    f = np.exp(sigma * rng.standard_normal(inst.num_rows))
    integral = _integral(inst.lhs, inst.rhs)
    new.lhs, new.rhs = _noisy(inst.lhs, f, integral), _noisy(inst.rhs, f, integral)
  return new.validate()
