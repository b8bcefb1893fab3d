"""Scalar edge scores, AUROC against a ground-truth graph, and the linear VAR (Granger-coefficient) baseline.

NAVAR's causal score of i -> j is the standard deviation of the contribution c_{i->j} over the training
windows (official `train_NAVAR.py`); AUROC is computed over the off-diagonal entries (`ignore_self_links`, as
in the NAVAR paper's DREAM3 / CauseMe evaluation).
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def edge_scores(contrib_bij: np.ndarray, weights_b: np.ndarray | None = None) -> np.ndarray:
  """std over windows of each contribution.

  Args:
    contrib_bij: (B, N, N) contributions.
    weights_b: optional (B,) non-negative window weights (e.g. 0 for padding / validation windows).

  Returns:
    (N_src, N_tgt) float64 scores, [i, j] for i -> j.
  """
  c = np.asarray(contrib_bij, np.float64)
  w = np.ones(c.shape[0]) if weights_b is None else np.asarray(weights_b, np.float64)
  w = w / w.sum()
  mean = np.einsum("b,bij->ij", w, c)
  return np.sqrt(np.einsum("b,bij->ij", w, (c - mean) ** 2))


def auroc(scores: np.ndarray, truth: np.ndarray, ignore_self_links: bool = True) -> float:
  """Area under the ROC curve of `scores` for the binary `truth` (Mann-Whitney U, ties counted half).

  Args:
    scores: (N, N) edge scores.
    truth: (N, N) 0/1 adjacency.
    ignore_self_links: drop the diagonal (NAVAR's evaluation).

  Returns:
    AUROC in [0, 1] (nan when truth has only one class).
  """
  s, t = np.asarray(scores, np.float64), np.asarray(truth) != 0
  if ignore_self_links:
    off = ~np.eye(s.shape[0], dtype=bool)
    s, t = s[off], t[off]
  s, t = s.ravel(), t.ravel()
  pos, neg = int(t.sum()), int((~t).sum())
  if pos == 0 or neg == 0:
    return float("nan")
  r = stats.rankdata(s)  # average ranks for ties
  return float((r[t].sum() - pos * (pos + 1) / 2) / (pos * neg))


def fit_linear_var(x_bnk: np.ndarray, y_bn: np.ndarray, weights_b: np.ndarray | None = None) -> dict:
  """Least-squares linear VAR(K) on the same windows NAVAR sees: y_j = a_j + sum_{i,l} A[i, l, j] x_i,t-l.

  Args:
    x_bnk: (B, N, K) windows (lags oldest first, as NAVAR's inputs).
    y_bn: (B, N) targets.
    weights_b: optional (B,) 0/1 mask of the windows to fit on.

  Returns:
    {"coef": (N_src, K, N_tgt) with coef[i, l - 1, j] the lag-l coefficient of i -> j, "intercept": (N,),
     "score": (N, N) |lag-1 coefficient| (the Granger-coefficient edge score)}.
  """
  x = np.asarray(x_bnk, np.float64)
  b, n, k = x.shape
  keep = np.ones(b, bool) if weights_b is None else np.asarray(weights_b) > 0
  feats = np.concatenate([np.ones((b, 1)), x[:, :, ::-1].reshape(b, n * k)], 1)   # lag 1 first
  sol, *_ = np.linalg.lstsq(feats[keep], np.asarray(y_bn, np.float64)[keep], rcond=None)
  coef = sol[1:].reshape(n, k, -1)
  return {"coef": coef, "intercept": sol[0], "score": np.abs(coef[:, 0, :])}
