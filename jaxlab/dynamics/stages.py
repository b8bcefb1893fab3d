"""Stage detector for the focus-dilution cycle (Chen, Lin, Xu, Luo, ICML 2026, arXiv 2605.01199).

Reads the logged metric rows of a run (step, train/loss, dyn/share_E, dyn/rank_E, dyn/qk_ratio, dyn/focus) and
reports the stages it finds, each with a step range:

* condensation (S1): attention frozen (||W_Q W_K^T|| <= frozen_ratio x its initial value) and the embedding
  condensed; the condensation point is the step of maximal top-1 share of W_E within the initial run of frozen
  rows (none when the first logged row is already past frozen_ratio),
* focus (S2): from the condensation point to the first focus peak,
* dilution (S3): from that peak to the next focus trough,
* next cycle (S4): after the first confirmed focus trough, when the numerical rank of W_E is >= 2; the largest focus
  index after that trough is the second cycle's focus (`refocus`), whether or not it has diluted yet.

Focus peaks and troughs are the turning points of a zig-zag filter: an extremum is confirmed once the focus index
has moved `reversal` away from it in the other direction (a standard threshold on reversals, robust to noise).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def zigzag(x: Sequence[float], reversal: float) -> list[tuple[int, str]]:
  """Alternating confirmed extrema of a series.

  Args:
    x: the series (n,).
    reversal: the absolute move away from an extremum that confirms it (> 0).

  Returns:
    [(index, "max" | "min"), ...] alternating; the last, unconfirmed, extremum is included only when the series
    has already moved `reversal` away from it (so every returned extremum is confirmed).
  """
  if reversal <= 0:
    raise ValueError(f"reversal must be > 0, got {reversal}")
  x = np.asarray(x, np.float64)
  out: list[tuple[int, str]] = []
  if len(x) == 0:
    return out
  hi_i = lo_i = 0
  trend = 0  # +1 looking for a max, -1 looking for a min, 0 unknown
  for i in range(1, len(x)):
    if x[i] > x[hi_i]:
      hi_i = i
    if x[i] < x[lo_i]:
      lo_i = i
    if trend >= 0 and x[hi_i] - x[i] >= reversal and (trend == 1 or hi_i >= lo_i):
      out.append((hi_i, "max"))
      trend, lo_i = -1, i
    elif trend <= 0 and x[i] - x[lo_i] >= reversal and (trend == -1 or lo_i >= hi_i):
      out.append((lo_i, "min"))
      trend, hi_i = 1, i
  return out


def detect_stages(rows: Sequence[dict], *, frozen_ratio: float = 2.0, reversal: float = 0.05,
                  min_peak_excess: float = 0.1) -> dict:
  """Finds the stages of the focus-dilution cycle in logged metrics.

  Args:
    rows: metric rows with keys step, train/loss, dyn/share_E, dyn/rank_E, dyn/qk_ratio, dyn/focus.
    frozen_ratio: attention counts as frozen while qk_ratio <= this.
    reversal: zig-zag threshold on the focus index.
    min_peak_excess: a focus peak must exceed 1 by at least this much.

  Returns:
    {"condensation": {"step", "range", "share_E", "qk_ratio", "index"} | None,
     "cycles": [{"focus_peak", "peak_step", "trough", "trough_step", "focus": (a, b), "dilution": (b, c),
                 "drop_frac", "loss_decreasing", "rank_after"}, ...],
     "next_cycle": {"start", "rank", "refocus", "refocus_step"} | None}. Steps are the logged `step` values;
    next_cycle needs a confirmed trough (the focus rose by `reversal` after it).
  """
  need = ("step", "train/loss", "dyn/share_E", "dyn/rank_E", "dyn/qk_ratio", "dyn/focus")
  rows = [r for r in rows if all(k in r for k in need)]
  if not rows:
    raise ValueError(f"detect_stages: no metric rows carry all of {need}")
  step = np.array([r["step"] for r in rows])
  loss = np.array([r["train/loss"] for r in rows], np.float64)
  share = np.array([r["dyn/share_E"] for r in rows], np.float64)
  rank = np.array([r["dyn/rank_E"] for r in rows])
  qk = np.array([r["dyn/qk_ratio"] for r in rows], np.float64)
  focus = np.array([r["dyn/focus"] for r in rows], np.float64)
  out: dict = {"condensation": None, "cycles": [], "next_cycle": None}
  frozen = qk <= frozen_ratio
  if not frozen[0]:   # attention already moved at the first logged row: no frozen phase to read
    return out
  last_frozen = len(qk) - 1 if frozen.all() else int(np.argmin(frozen)) - 1   # end of the initial frozen run
  window = np.arange(0, last_frozen + 1)
  c = int(window[np.argmax(share[window])])
  out["condensation"] = {"step": int(step[c]), "range": (int(step[0]), int(step[last_frozen])),
                         "share_E": float(share[c]), "qk_ratio": float(qk[c]), "index": c}
  ext = [(i + c, k) for i, k in zigzag(focus[c:], reversal)]
  # An unconfirmed final maximum (focus still high at the end) counts as a peak without a trough.
  peaks = [i for i, k in ext if k == "max" and focus[i] - 1.0 >= min_peak_excess]
  start = c
  for p in peaks:
    if p < start:
      continue
    troughs = [i for i, k in ext if k == "min" and i > p]
    t = troughs[0] if troughs else len(focus) - 1 - int(np.argmin(focus[p:][::-1]))
    drop = (focus[p] - focus[t]) / max(focus[p] - 1.0, 1e-12)
    seg = loss[p:t + 1]
    out["cycles"].append({
        "focus_peak": float(focus[p]), "peak_step": int(step[p]), "trough": float(focus[t]),
        "trough_step": int(step[t]), "focus": (int(step[start]), int(step[p])), "dilution": (int(step[p]), int(step[t])),
        "drop_frac": float(drop), "loss_decreasing": bool(len(seg) < 2 or (seg[-1] < seg[0] and np.all(np.diff(seg) <= 1e-6))),
        "rank_after": int(rank[t:].max())})
    start = t
  if out["cycles"]:
    t = [i for i in range(len(step)) if step[i] == out["cycles"][0]["trough_step"]][0]
    confirmed = any(i == t and k == "min" for i, k in ext)
    later = np.flatnonzero(rank[t:] >= 2)
    if confirmed and len(later):
      r = t + int(np.argmax(focus[t:]))
      out["next_cycle"] = {"start": int(step[t + later[0]]), "rank": int(rank[t:].max()),
                           "refocus": float(focus[r]), "refocus_step": int(step[r])}
  return out


def cycle_check(rows: Sequence[dict], *, frozen_ratio: float = 2.0, reversal: float = 0.05,
                min_peak_excess: float = 0.1, min_share: float = 0.9, min_drop: float = 0.5) -> dict:
  """Per-run test that one focus-dilution cycle happened and a next one began ("cycle present").

  All of, in order:
    s1           the condensation point (`detect_stages`) has W_E top-1 share >= `min_share` while
                 ||W_Q W_K^T|| <= `frozen_ratio` x its initial value;
    first_peak   the first confirmed extremum of the focus index after the condensation point (zig-zag filter,
                 `reversal`) is a maximum with excess over 1 >= `min_peak_excess`;
    diluted      the next confirmed extremum (a minimum: the trough) is below the peak by >= `min_drop` of the
                 peak's excess;
    loss_down    the loss decreases from the peak to the trough (non-increasing at every logged row);
    rank_rises   the numerical rank of W_E at the second peak exceeds its rank at the trough (new embedding
                 directions open after the dilution);
    second_peak  the largest focus index after the trough has excess >= `min_peak_excess`.

  Args:
    rows: metric rows as for `detect_stages`.
    frozen_ratio, reversal, min_peak_excess: as for `detect_stages`.
    min_share: the S1 share threshold.
    min_drop: the dilution threshold (fraction of the peak's excess).

  Returns:
    {"present": bool, the six criteria (bool), "first": "max" | "min" | None (the first extremum's kind),
     "peak", "peak_step", "trough", "trough_step", "drop_frac", "second", "second_step" (None where absent),
     "rank_cond", "rank_peak", "rank_trough", "rank_second" (numerical ranks of W_E there; None where absent)}.
  """
  st = detect_stages(rows, frozen_ratio=frozen_ratio, reversal=reversal, min_peak_excess=min_peak_excess)
  need = ("step", "train/loss", "dyn/share_E", "dyn/rank_E", "dyn/qk_ratio", "dyn/focus")
  rows = [r for r in rows if all(k in r for k in need)]
  step = np.array([r["step"] for r in rows])
  loss = np.array([r["train/loss"] for r in rows], np.float64)
  rank = np.array([r["dyn/rank_E"] for r in rows])
  focus = np.array([r["dyn/focus"] for r in rows], np.float64)
  crit = ("s1", "first_peak", "diluted", "loss_down", "rank_rises", "second_peak")
  out: dict = {k: False for k in ("present",) + crit}
  out.update({k: None for k in ("first", "peak", "peak_step", "trough", "trough_step", "drop_frac", "second",
                                "second_step", "rank_cond", "rank_peak", "rank_trough", "rank_second")})
  cond = st["condensation"]
  if cond is None:
    return out
  c = cond["index"]
  out["rank_cond"] = int(rank[c])
  out["s1"] = bool(cond["share_E"] >= min_share and cond["qk_ratio"] <= frozen_ratio)
  ext = [(i + c, k) for i, k in zigzag(focus[c:], reversal)]
  if not ext:
    return out
  p, kind = ext[0]
  out["first"] = kind
  if kind != "max":
    return out
  out.update(peak=float(focus[p]), peak_step=int(step[p]), rank_peak=int(rank[p]))
  out["first_peak"] = bool(focus[p] - 1.0 >= min_peak_excess)
  if len(ext) < 2:
    return out
  t = ext[1][0]
  drop = (focus[p] - focus[t]) / max(focus[p] - 1.0, 1e-12)
  seg = loss[p:t + 1]
  out.update(trough=float(focus[t]), trough_step=int(step[t]), drop_frac=float(drop), rank_trough=int(rank[t]))
  out["diluted"] = bool(out["first_peak"] and drop >= min_drop)
  out["loss_down"] = bool(seg[-1] < seg[0] and np.all(np.diff(seg) <= 1e-6))
  r = t + int(np.argmax(focus[t:]))
  out.update(second=float(focus[r]), second_step=int(step[r]), rank_second=int(rank[r]))
  out["rank_rises"] = bool(rank[r] > rank[t])
  out["second_peak"] = bool(focus[r] - 1.0 >= min_peak_excess)
  out["present"] = all(out[k] for k in crit)
  return out
