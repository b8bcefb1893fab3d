"""Mechanism indicators of a response curve and a rule-based label: monotone, threshold, saturating, sign-changing.

Indicators of a curve f on an increasing grid v (the PD of an edge; all scale-free):

* `rho`: Spearman correlation of f with v (monotonicity).
* `minority`: min(total rise, total fall) / total variation: 0 for a monotone curve, ~0.5 for x^2.
* `sign_changes`: sign changes of the slope, ignoring slopes below 10% of the largest.
* threshold: the best one-break piecewise-linear (hinge) fit; `flat_ratio` = |slope of the flatter side| /
  |slope of the steeper side|, `break_at` its location, `hinge_gain` = 1 - SSE_hinge / SSE_line.
* `end_ratio`: mean |slope| over the outer `edge` fraction at both ends / |slope| over the central fraction
  (saturation: < 1).
* `asymmetry`: (slope above the regime cut - slope below) / (|above| + |below|), cut at the grid's middle.
* `amplitude`: max - min of f.

Label rules, applied in this order (the paper's mechanism classes, arXiv 2605.26408; the numeric cut-offs are reconstructed):

1. flat: amplitude < `flat_tol` (no effect to classify);
2. sign-changing: minority >= 0.15 with at least one slope sign change, or |rho| < 0.5;
3. threshold: hinge_gain >= 0.5, flat_ratio <= 0.2 and the break inside the grid (not in the outer 10%);
4. saturating: end_ratio < 0.3;
5. monotone: |rho| > 0.95;
6. nonlinear: anything else.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

LABELS = ("flat", "sign-changing", "threshold", "saturating", "monotone", "nonlinear")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
  """Spearman rank correlation (average ranks for ties)."""
  ra, rb = stats.rankdata(np.asarray(a, np.float64)), stats.rankdata(np.asarray(b, np.float64))
  ra, rb = ra - ra.mean(), rb - rb.mean()
  den = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
  return float((ra * rb).sum() / den) if den > 0 else 0.0


def hinge_fit(v: np.ndarray, f: np.ndarray, margin: int = 2) -> dict:
  """Best one-break continuous piecewise-linear fit f ~ a + b1 min(v - c, 0) + b2 max(v - c, 0) over grid breaks c.

  Returns:
    {"break_at", "break_index", "left_slope", "right_slope", "sse", "sse_line"}.
  """
  v, f = np.asarray(v, np.float64), np.asarray(f, np.float64)
  line = np.stack([np.ones_like(v), v], 1)
  sse_line = float(np.sum((f - line @ np.linalg.lstsq(line, f, rcond=None)[0]) ** 2))
  best = None
  for k in range(margin, len(v) - margin):
    c = v[k]
    a = np.stack([np.ones_like(v), np.minimum(v - c, 0), np.maximum(v - c, 0)], 1)
    coef = np.linalg.lstsq(a, f, rcond=None)[0]
    sse = float(np.sum((f - a @ coef) ** 2))
    if best is None or sse < best["sse"]:
      best = {"break_at": float(c), "break_index": k, "left_slope": float(coef[1]), "right_slope": float(coef[2]),
              "sse": sse}
  best["sse_line"] = sse_line
  return best


def indicators(v: np.ndarray, f: np.ndarray, edge: float = 0.2) -> dict:
  """Scale-free shape indicators of the curve f(v) (see the module docstring)."""
  v, f = np.asarray(v, np.float64), np.asarray(f, np.float64)
  g = len(v)
  d = np.diff(f) / np.diff(v)
  inc = np.diff(f)
  rise, fall = inc[inc > 0].sum(), -inc[inc < 0].sum()
  tv = rise + fall
  big = np.abs(d) >= 0.1 * np.abs(d).max() if np.abs(d).max() > 0 else np.zeros_like(d, bool)
  signs = np.sign(d[big])
  hinge = hinge_fit(v, f)
  steep = max(abs(hinge["left_slope"]), abs(hinge["right_slope"]))
  flat = min(abs(hinge["left_slope"]), abs(hinge["right_slope"]))
  m = max(1, int(round(edge * (g - 1))))
  mid = (g - 1) // 2
  centre = np.abs(np.mean(d[max(0, mid - m // 2): mid - m // 2 + m]))
  ends = 0.5 * (np.abs(np.mean(d[:m])) + np.abs(np.mean(d[-m:])))
  half = g // 2
  below = np.polyfit(v[:half + 1], f[:half + 1], 1)[0]
  above = np.polyfit(v[half:], f[half:], 1)[0]
  return {
      "rho": spearman(v, f),
      "minority": float(min(rise, fall) / tv) if tv > 0 else 0.0,
      "sign_changes": int(np.sum(signs[1:] != signs[:-1])) if len(signs) > 1 else 0,
      "flat_ratio": float(flat / steep) if steep > 0 else 1.0,
      "break_at": hinge["break_at"],
      "break_index": hinge["break_index"],
      "hinge_gain": float(1.0 - hinge["sse"] / hinge["sse_line"]) if hinge["sse_line"] > 0 else 0.0,
      "end_ratio": float(ends / centre) if centre > 0 else float("inf"),
      "asymmetry": float((above - below) / (abs(above) + abs(below))) if abs(above) + abs(below) > 0 else 0.0,
      "amplitude": float(f.max() - f.min()),
  }


def label(ind: dict, grid_size: int, flat_tol: float = 0.02) -> str:
  """The mechanism label from `indicators` (rules in the module docstring)."""
  if ind["amplitude"] < flat_tol:
    return "flat"
  if (ind["minority"] >= 0.15 and ind["sign_changes"] >= 1) or abs(ind["rho"]) < 0.5:
    return "sign-changing"
  inner = max(1, int(round(0.1 * (grid_size - 1))))
  if ind["hinge_gain"] >= 0.5 and ind["flat_ratio"] <= 0.2 and inner <= ind["break_index"] <= grid_size - 1 - inner:
    return "threshold"
  if ind["end_ratio"] < 0.3:
    return "saturating"
  if abs(ind["rho"]) > 0.95:
    return "monotone"
  return "nonlinear"


def classify(v: np.ndarray, f: np.ndarray, flat_tol: float = 0.02) -> tuple[str, dict]:
  """(label, indicators) of one curve."""
  ind = indicators(v, f)
  return label(ind, len(v), flat_tol), ind
