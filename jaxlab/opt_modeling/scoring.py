"""ORLM-compatible scoring of predicted objective values against benchmark ground truths.

The rules follow the evaluation script of the ORLM repository (github.com/Cardinal-Operations/ORLM,
`eval/execute.py`) for Tang et al., "ORLM: A Customizable Framework in Training Large Models for Automated
Optimization Modeling" (arXiv 2405.17743), which the optimisation-modelling papers (e.g. OptiVer, arXiv
2605.29556) report against. Predictions and ground truths are compared as numbers:

- `pred` is correct for `gt != 0` when |pred - gt| / |gt| <= tol and, for `gt == 0`, when |pred| <= tol (an
  absolute test, as in ORLM). Papers report tol = 1e-4 and tol = 0.05 (ORLM's default); `REPORT_TOLS`.
- A problem without an optimal solution has the ground truth "No Best Solution" (ORLM's spelling; also
  "infeasible", "unbounded", None or an empty string here). It is matched exactly by a prediction that also says
  there is no optimal solution, and by nothing else; a numeric prediction never matches it and a no-solution
  prediction never matches a number. `normalize_answer` maps every such spelling to None.
- ORLM rounds both sides with Python's `round(float(x))` (round half to even) before comparing, in pass@k and in
  majority voting. Here rounding is the explicit option `round_first` and is off by default: pass
  `round_first=True` to reproduce ORLM's numbers exactly. (After rounding, a ground truth in (-0.5, 0.5) is 0
  and the absolute test applies, again as in ORLM.)

Differences from ORLM, by design: ORLM compares the string "No Best Solution" and treats a missing prediction
(None: the generated program failed or printed no objective) as wrong even against "No Best Solution"; here
None *means* "no optimal solution", so a failed run should be passed as NaN (`float("nan")`), which is never
correct and casts no vote. ORLM's majority vote groups exactly equal (rounded) values and skips failed runs;
`majority_vote` groups values within a relative tolerance (tolerance 0 with `round_first=True` is ORLM's rule)
and lets "no optimal solution" predictions form a group of their own.

pass@k follows ORLM: a problem counts when any of its first k samples is correct (`pass_at_k`); the unbiased
estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", arXiv 2107.03374) for n
samples with c correct is `pass_at_k_unbiased`. mj@k scores the majority answer of the first k samples
(`mj_at_k`).

Bad answers raise `jaxlab.errors.DataError` (one line naming the value); bad settings (a negative tolerance,
k < 1) raise `jaxlab.errors.ConfigError`. This module is pure Python: it imports neither JAX nor numpy.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any, Sequence

from jaxlab.errors import ConfigError, DataError

REPORT_TOLS = (1e-4, 0.05)
"""The tolerances the ORLM-style tables report: accuracy at 1e-4 (strict) and at 0.05 (ORLM's default)."""

NO_SOLUTION_STRINGS = frozenset({
    "no best solution", "no optimal solution", "no feasible solution", "no solution", "infeasible", "unbounded",
    "infeasible or unbounded", "",
})
"""Lower-cased spellings (inner whitespace collapsed) that mean "no optimal solution"; ORLM writes the first."""

_UNSIGNED = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_GROUPED = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d*)?(?:[eE][+-]?\d+)?")
_NAN = float("nan")


def _show(x: Any) -> str:
  text = repr(x)
  return text if len(text) <= 80 else text[:77] + "..."


def _normalize(x: Any, what: str) -> float | None:
  if x is None:
    return None
  if isinstance(x, bool):
    raise DataError(f"{what} {_show(x)} is a boolean; expected a number, a numeric string or 'No Best Solution'")
  if isinstance(x, numbers.Real):
    return float(x)
  if not isinstance(x, str):
    raise DataError(f"{what} {_show(x)} has type {type(x).__name__}; expected a number, a numeric string or "
                    "'No Best Solution'")
  if " ".join(x.lower().split()) in NO_SOLUTION_STRINGS:
    return None
  t = "".join(x.replace("\u2212", "-").split())  # unicode minus; all whitespace
  sign = ""
  if t and t[0] in "+-":
    sign, t = t[0], t[1:]
  if t.startswith("$"):
    t = t[1:]
  if not sign and t and t[0] in "+-":  # "$-5"
    sign, t = t[0], t[1:]
  if t.endswith("%"):
    t = t[:-1]
  if "," in t:
    if not _GROUPED.fullmatch(t):
      raise DataError(f"{what} {_show(x)} has commas that are not thousands separators; write it as a plain "
                      "number such as 1234.5")
    t = t.replace(",", "")
  if not _UNSIGNED.fullmatch(t):
    raise DataError(f"{what} {_show(x)} is neither a number nor a no-solution marker ('No Best Solution', "
                    "'infeasible', 'unbounded'); write the objective value as a plain number")
  return float(sign + t)


def normalize_answer(x: Any) -> float | None:
  """The numeric value of an answer, or None when it says there is no optimal solution.

  Accepts numbers (not booleans), None, and strings: numbers with optional sign, "$" and "%" (dropped: "12%" is
  12.0), commas as thousands separators ("1,234.5"), whitespace and scientific notation ("1.5e+03"); and the
  no-solution spellings of `NO_SOLUTION_STRINGS` in any case ("No Best Solution", "infeasible", "unbounded",
  ""). A float NaN is returned as NaN ("no answer": never correct).

  Raises:
    DataError: any other value (naming it).
  """
  return _normalize(x, "answer")


def _check_tol(tol: Any) -> float:
  if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not math.isfinite(tol) or tol < 0:
    raise ConfigError(f"tolerance {tol!r} must be a finite number >= 0 (e.g. 1e-4 or 0.05)")
  return float(tol)


def _check_k(k: Any) -> int:
  if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
    raise ConfigError(f"k={k!r} must be an integer >= 1")
  return int(k)


def _round(v: float | None) -> float | None:
  """Python's round() (half to even), as ORLM's round(float(x)); None, NaN and infinities unchanged."""
  return float(round(v)) if v is not None and math.isfinite(v) else v


def _close(p: float | None, g: float | None, tol: float) -> bool:
  """The ORLM rule on normalised values (None = no optimal solution)."""
  if g is None or p is None:
    return g is None and p is None
  if g == 0:
    return abs(p) <= tol
  return abs(p - g) / abs(g) <= tol  # NaN or infinite p: False


def _gt(gt: Any) -> float | None:
  g = _normalize(gt, "ground truth")
  if g is not None and not math.isfinite(g):
    raise DataError(f"ground truth {_show(gt)} is not a finite number; write problems without an optimal "
                    "solution as 'No Best Solution'")
  return g


def is_correct(pred: Any, gt: Any, tol: float, round_first: bool = False) -> bool:
  """Whether `pred` matches the ground truth `gt` under ORLM's rule (module docstring).

  Args:
    pred: a prediction (number, numeric string, a no-solution marker or None; NaN = no answer).
    gt: the ground truth (same forms; must be finite when numeric).
    tol: relative tolerance (absolute when gt == 0), e.g. 1e-4 or 0.05.
    round_first: round both to integers first (Python round(), half to even), as ORLM's eval/execute.py does.

  Raises:
    DataError: an answer that is not a number or a no-solution marker, or a non-finite ground truth.
    ConfigError: a negative or non-finite tolerance.
  """
  tol = _check_tol(tol)
  g, p = _gt(gt), _normalize(pred, "prediction")
  if round_first:
    g, p = _round(g), _round(p)
  return _close(p, g, tol)


def _paired(preds: Sequence, gts: Sequence, what: str) -> None:
  if len(preds) != len(gts):
    raise DataError(f"{len(preds)} {what} for {len(gts)} ground truths; give one per problem, in the same order")
  if not gts:
    raise DataError("no problems to score; give at least one ground truth")


def _at(i: int, e: DataError) -> DataError:
  return DataError(f"problem {i}: {e}")


def accuracy(preds: Sequence, gts: Sequence, tol: float, round_first: bool = False) -> float:
  """The fraction of problems whose prediction `is_correct` (one prediction per problem, in order).

  Raises:
    DataError: different lengths, no problems, or a bad answer (naming the problem index).
  """
  _paired(preds, gts, "predictions")
  tol = _check_tol(tol)
  hits = 0
  for i, (p, g) in enumerate(zip(preds, gts)):
    try:
      hits += is_correct(p, g, tol, round_first)
    except DataError as e:
      raise _at(i, e) from None
  return hits / len(gts)


def report(preds: Sequence, gts: Sequence, tols: Sequence[float] = REPORT_TOLS, *,
           round_first: bool = False) -> dict[str, float | int]:
  """Accuracy at each tolerance and the number of problems: {"acc@0.0001": ..., "acc@0.05": ..., "n": ...}.

  Keys are "acc@" + the tolerance in `%g` form.
  """
  out: dict[str, float | int] = {f"acc@{tol:g}": accuracy(preds, gts, tol, round_first) for tol in tols}
  out["n"] = len(gts)
  return out


def pass_at_k(samples_correct: Sequence[Sequence[bool]], k: int) -> float:
  """ORLM's pass@k: the fraction of problems with at least one correct answer among their first k samples.

  Args:
    samples_correct: per problem, whether each sample (in sampling order) is correct.
    k: samples looked at per problem; every problem needs at least k.

  Raises:
    DataError: no problems, or a problem with fewer than k samples (naming it).
    ConfigError: k < 1.
  """
  k = _check_k(k)
  if not samples_correct:
    raise DataError("no problems to score; give at least one list of per-sample results")
  hits = 0
  for i, row in enumerate(samples_correct):
    if len(row) < k:
      raise DataError(f"problem {i} has {len(row)} samples, fewer than k={k}; sample at least k per problem or "
                      "lower k")
    hits += any(bool(c) for c in row[:k])
  return hits / len(samples_correct)


def pass_at_k_unbiased(n: int, c: int, k: int) -> float:
  """The unbiased pass@k estimate 1 - C(n - c, k) / C(n, k) from n samples of which c are correct.

  Chen et al. 2021 (arXiv 2107.03374): the probability that k samples drawn without replacement from the n
  include a correct one. Computed exactly with integers, then divided once.

  Raises:
    ConfigError: unless 0 <= c <= n and 1 <= k <= n.
  """
  k = _check_k(k)
  for name, v in (("n", n), ("c", c)):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
      raise ConfigError(f"{name}={v!r} must be an integer >= 0")
  if c > n or k > n:
    raise ConfigError(f"need c <= n and k <= n, got n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_vote(preds: Sequence, tol: float, *, round_first: bool = False) -> float | None:
  """The majority answer of a list of predictions (mj@k's vote).

  Predictions are normalised (`normalize_answer`; rounded first with `round_first`) and grouped in order: each
  joins the first group whose first member it matches under `is_correct`'s rule with that member as the
  ground truth (relative tolerance `tol`, absolute near 0), else it starts a group. No-solution predictions
  (None) form one group of their own. The largest group wins; ties go to the group whose first member came
  first. Returns that first member (a float or None). NaN predictions (failed runs) cast no vote; when there
  is no vote at all the result is NaN (never correct).

  Raises:
    DataError: a prediction that is not a number or a no-solution marker (naming its index).
  """
  tol = _check_tol(tol)
  groups: list[list[Any]] = []  # [representative, count]
  for i, x in enumerate(preds):
    try:
      v = _normalize(x, "prediction")
    except DataError as e:
      raise DataError(f"sample {i}: {e}") from None
    if round_first:
      v = _round(v)
    if v is not None and math.isnan(v):
      continue
    for grp in groups:
      if _close(v, grp[0], tol):
        grp[1] += 1
        break
    else:
      groups.append([v, 1])
  if not groups:
    return _NAN
  best = groups[0]
  for grp in groups[1:]:
    if grp[1] > best[1]:
      best = grp
  return best[0]


def mj_at_k(samples: Sequence[Sequence], gts: Sequence, k: int, tol: float, *, round_first: bool = False,
            vote_tol: float | None = None) -> float:
  """mj@k: the fraction of problems whose `majority_vote` over the first k samples is correct.

  Args:
    samples: per problem, its sampled predictions in sampling order (at least k each).
    gts: the ground truths, one per problem.
    k: samples voted on per problem.
    tol: the tolerance of the final comparison with the ground truth.
    round_first: round predictions and ground truths first (ORLM).
    vote_tol: the tolerance that groups votes (default: `tol`); ORLM groups exactly equal rounded values, i.e.
      `round_first=True, vote_tol=0`.

  Raises:
    DataError: different lengths, no problems, fewer than k samples, or a bad answer (naming the problem).
  """
  k = _check_k(k)
  tol = _check_tol(tol)
  vote_tol = tol if vote_tol is None else _check_tol(vote_tol)
  _paired(samples, gts, "sample lists")
  hits = 0
  for i, (row, g) in enumerate(zip(samples, gts)):
    if len(row) < k:
      raise DataError(f"problem {i} has {len(row)} samples, fewer than k={k}; sample at least k per problem or "
                      "lower k")
    try:
      hits += is_correct(majority_vote(row[:k], vote_tol, round_first=round_first), g, tol, round_first)
    except DataError as e:
      raise _at(i, e) from None
  return hits / len(gts)
