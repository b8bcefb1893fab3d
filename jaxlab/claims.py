"""Quantitative claims: what `python -m jaxlab.reproduce` checks for each paper.

An experiment's config.py declares `CLAIMS = [Claim(...), ...]`. A claim measures one number from the
per-seed summaries of its runs (the dicts `train_and_evaluate` returns) and compares it with a target::

    Claim("accuracy", "test accuracy >= 0.93 on every seed",
          measure=fraction(lambda s: s["eval/accuracy"] >= 0.93), op=">=", target=1.0)

A claim that only parallel hardware can meet (a speed-up that the FLOPs do not give on a CPU) declares
`requires="accelerator"`: on a CPU backend it is measured but not checked (`passed` None, shown as "not checked
here: needs an accelerator", never as a pass), and `jaxlab.reproduce` shows the value of the last accelerator
ledger beside it (`jaxlab.ledger.read_accelerator`); on a GPU or TPU it is checked like any claim.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np

Summary = dict[str, Any]
REQUIRES = ("", "accelerator")   # what a claim may need of the backend that runs it
NOT_CHECKED = "not checked here: needs an accelerator"
_OPS = {
    ">=": lambda m, t: m >= t, ">": lambda m, t: m > t, "<=": lambda m, t: m <= t, "<": lambda m, t: m < t,
    "in": lambda m, t: t[0] <= m <= t[1],
}


@dataclasses.dataclass(frozen=True)
class Claim:
  """One checkable claim.

  Attributes:
    name: short identifier (table column).
    text: the claim in words, as the paper states it at small scale.
    measure: `runs -> number` computed from the per-seed summary dicts.
    op: one of ">=", ">", "<=", "<", "in" (target is then a (low, high) pair).
    target: the threshold (or interval).
    requires: "" (any backend) or "accelerator" (checked on a GPU / TPU only; see the module docstring).
  """
  name: str
  text: str
  measure: Callable[[Sequence[Summary]], float]
  op: str
  target: float | tuple[float, float]
  requires: str = ""

  def __post_init__(self):
    if self.op not in _OPS:
      raise ValueError(f"Claim {self.name!r}: op must be one of {list(_OPS)}, got {self.op!r}")
    if self.requires not in REQUIRES:
      raise ValueError(f"Claim {self.name!r}: requires must be one of {list(REQUIRES)}, got {self.requires!r}")

  def checkable(self, backend: str | None) -> bool:
    """Whether a run on `backend` ("cpu", "gpu", "tpu"; None: unknown, checked) can check this claim."""
    return not (self.requires == "accelerator" and backend == "cpu")

  def target_text(self) -> str:
    """The comparison as text, e.g. '>= 0.9' or 'in [-0.4, -0.25]'."""
    if self.op == "in":
      return f"in [{self.target[0]:g}, {self.target[1]:g}]"
    return f"{self.op} {self.target:g}"

  def check(self, runs: Sequence[Summary], backend: str | None = None) -> dict[str, Any]:
    """Measures and compares; returns {"name", "text", "measured", "target", "passed"} (+ "error"; + "requires"
    and, where `backend` cannot check it, "passed" None and "status" `NOT_CHECKED`)."""
    out = {"name": self.name, "text": self.text, "target": self.target_text()}
    if self.requires:
      out["requires"] = self.requires
    checkable = self.checkable(backend)
    try:
      value = float(self.measure(runs))
    except Exception as e:  # a missing key or a failed run must fail the claim, not the report
      return {**out, "measured": None, "passed": False if checkable else None, "error": f"{type(e).__name__}: {e}"}
    if not checkable:
      return {**out, "measured": value, "passed": None, "status": NOT_CHECKED}
    passed = math.isfinite(value) and bool(_OPS[self.op](value, self.target))
    return {**out, "measured": value, "passed": passed}


def _of_key(key: str, reduce: Callable) -> Callable[[Sequence[Summary]], float]:
  """`runs -> reduce(summary[key] over runs)`, with `.key` set: its target is a level of that metric, so plots of
  the metric draw it (`jaxlab.reproduce`)."""
  def measure(runs):
    return float(reduce([r[key] for r in runs]))
  measure.key = key
  return measure


def mean(key: str) -> Callable[[Sequence[Summary]], float]:
  """Mean of `summary[key]` over runs."""
  return _of_key(key, np.mean)


def minimum(key: str) -> Callable[[Sequence[Summary]], float]:
  """Smallest `summary[key]` over runs."""
  return _of_key(key, np.min)


def maximum(key: str) -> Callable[[Sequence[Summary]], float]:
  """Largest `summary[key]` over runs."""
  return _of_key(key, np.max)


def ratio_of_means(a: str, b: str) -> Callable[[Sequence[Summary]], float]:
  """mean(summary[a]) / mean(summary[b]) over runs (e.g. a method's error relative to a baseline's)."""
  return lambda runs: float(np.mean([r[a] for r in runs]) / np.mean([r[b] for r in runs]))


def fraction(pred: Callable[[Summary], bool]) -> Callable[[Sequence[Summary]], float]:
  """Fraction of runs for which `pred(summary)` holds."""
  return lambda runs: float(np.mean([bool(pred(r)) for r in runs]))


def count(pred: Callable[[Summary], bool]) -> Callable[[Sequence[Summary]], float]:
  """Number of runs for which `pred(summary)` holds."""
  return lambda runs: float(sum(bool(pred(r)) for r in runs))


def t_bound(values: Sequence[float], level: float = 0.95, side: str = "lower") -> float:
  """One-sided Student-t confidence bound on the mean of `values` (n >= 2): mean -/+ t_{level, n-1} sd / sqrt(n).

  side: "lower" (the mean is above it with confidence `level`) or "upper".
  """
  from scipy import stats  # pylint: disable=g-import-not-at-top
  v = np.asarray(values, np.float64)
  if v.ndim != 1 or len(v) < 2:
    raise ValueError(f"a t bound needs >= 2 values, got shape {v.shape}")
  if side not in ("lower", "upper"):
    raise ValueError(f"side must be 'lower' or 'upper', got {side!r}")
  half = stats.t.ppf(level, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
  return float(v.mean() - half if side == "lower" else v.mean() + half)
