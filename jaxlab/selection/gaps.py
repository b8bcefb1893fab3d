"""The generalisation / extrapolation decomposition of fine-tuning error over a budget x difficulty grid.

For a model fine-tuned on n examples of difficulty d and evaluated on a target distribution T:

  target error = train error + generalisation gap + extrapolation gap,
  generalisation gap = error on fresh data of difficulty d - train error      (in-distribution),
  extrapolation gap  = error on T - error on fresh data of difficulty d        (the shift from d to T).

Grids are arrays indexed [budget, difficulty]; every function also accepts a leading seed axis.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def decompose(train, in_dist, target) -> dict[str, np.ndarray]:
  """{"train", "gen_gap", "extrap_gap", "target"}: the two gaps of each cell (the sum equals the target error)."""
  train, in_dist, target = (np.asarray(a, np.float64) for a in (train, in_dist, target))
  return {"train": train, "gen_gap": in_dist - train, "extrap_gap": target - in_dist, "target": target}


def optimal_difficulty(target_err, difficulties: Sequence[float]) -> np.ndarray:
  """d*(n): the difficulty with the lowest target error for each budget (last axis = difficulty; first on ties)."""
  return np.asarray(difficulties)[np.argmin(np.asarray(target_err), axis=-1)]


def spearman(x, y) -> float:
  """Spearman's rank correlation (scipy's, average ranks on ties); nan when either side is constant."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if np.ptp(x) == 0 or np.ptp(y) == 0:
    return float("nan")
  return float(stats.spearmanr(x, y).statistic)


def trend_over_difficulty(grid, difficulties: Sequence[float]) -> np.ndarray:
  """Spearman correlation of each budget's row with the difficulty (shape: grid.shape[:-1])."""
  grid = np.asarray(grid)
  flat = grid.reshape(-1, grid.shape[-1])
  return np.array([spearman(difficulties, row) for row in flat]).reshape(grid.shape[:-1])


def is_nondecreasing(values) -> bool:
  """Whether a 1-D sequence never decreases."""
  return bool(np.all(np.diff(np.asarray(values)) >= 0))
