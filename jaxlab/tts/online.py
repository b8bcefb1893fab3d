"""Online (streaming) trajectory allocation of PETS: warm-up, count-pattern buckets, a greedy budget plan.

Questions arrive one at a time and each gets a one-shot budget. The policy (PETS, arXiv 2602.16745, official
code `MultiChoice_online.py`):

1. Draw k0 = 4 warm-up answers; their sorted count pattern (a partition of k0, e.g. (4), (3, 1), (2, 2),
   (2, 1, 1), (1, 1, 1, 1) for M = 4) is the question's bucket t.
2. Spend B_t - k0 more answers (B_t from a plan calibrated offline), predict by majority vote.

Calibration on a split of questions with full pools:
* per question, the exact majority-vote accuracy curve A_q(k) for its empirical answer distribution (label:
  its pool majority), and a probit fit A_q(k) ~ Phi(a_q sqrt(k) + b_q) on k in [k_min, k_max];
* pi_q(t) = P(bucket t | q) from random k0-subsamples of its pool (without replacement);
* pi_t = mean_q pi_q(t); (a_t, b_t) = pi_q(t)-weighted means of (a_q, b_q);
* the greedy marginal plan: start at B_t = k0 and repeatedly add one answer to the bucket with the largest
  gain Delta_t = A_t(B_t + 1) - A_t(B_t) (the gain per unit of expected cost pi_t) while
  sum_t pi_t B_t <= the average budget and B_t <= B_max.

`streaming_policy` applies a plan to a stream. With `avg_budget` it also keeps a running ledger (our
addition, marked reconstructed): question i gets min(B_t, floor(avg_budget * (i + 1) - spent)), so the REALISED
average spend never exceeds the average budget whatever the stream's bucket frequencies (the plan alone only
bounds the expected spend under the calibration frequencies).
"""

from __future__ import annotations

import dataclasses
import fractions
import heapq
import math

import numpy as np

from jaxlab.tts import self_consistency as sc

_BUDGET_TOL = 1e-12   # slack of the plan's expected-budget constraint (official MultiChoice_online.py)


def count_patterns(k0: int, num_options: int) -> list[tuple[int, ...]]:
  """Partitions of k0 into at most `num_options` parts, most concentrated first ((4,), (3, 1), (2, 2), ...)."""
  out = []

  def rec(rest, cap, prefix):
    if rest == 0:
      out.append(tuple(prefix))
      return
    if len(prefix) == num_options:
      return
    for part in range(min(rest, cap), 0, -1):
      rec(rest - part, part, prefix + [part])

  rec(int(k0), int(k0), [])
  return out


def bucket_of(answers_qk: np.ndarray, num_options: int) -> np.ndarray:
  """Bucket index (position in `count_patterns(k0, M)`) of each row of k0 warm-up answers.

  Args:
    answers_qk: (Q, k0) int answers in [0, M).
    num_options: M.

  Returns:
    (Q,) int64 bucket indices.
  """
  answers_qk = np.asarray(answers_qk)
  q, k0 = answers_qk.shape
  if (answers_qk < 0).any():
    raise ValueError("bucket_of: every question needs k0 valid warm-up answers")
  counts = np.zeros((q, num_options), np.int64)
  np.add.at(counts, (np.repeat(np.arange(q), k0), answers_qk.reshape(-1)), 1)
  counts = -np.sort(-counts, axis=1)
  table = {p: i for i, p in enumerate(count_patterns(k0, num_options))}
  return np.array([table[tuple(int(x) for x in row if x > 0)] for row in counts], np.int64)


def bucket_probs(answers_qn: np.ndarray, lengths_q: np.ndarray, num_options: int, k0: int = 4, draws: int = 2000,
                 seed: int = 0) -> np.ndarray:
  """pi_q(t): frequencies of each bucket over `draws` random k0-subsamples (without replacement) of each pool.

  Returns:
    (Q, T) float64 rows summing to 1 (T = number of count patterns).
  """
  answers_qn = np.asarray(answers_qn)
  lengths_q = np.asarray(lengths_q)
  n_buckets = len(count_patterns(k0, num_options))
  rng = np.random.default_rng(seed)
  out = np.zeros((len(answers_qn), n_buckets))
  for i, (row, n) in enumerate(zip(answers_qn, lengths_q)):
    if n < k0:
      raise ValueError(f"bucket_probs: question {i} has {n} answers, fewer than k0={k0}")
    idx = np.argsort(rng.random((draws, int(n))), axis=1)[:, :k0]
    out[i] = np.bincount(bucket_of(row[idx], num_options), minlength=n_buckets) / draws
  return out


def empirical_theta(answers_qn: np.ndarray, num_options: int) -> np.ndarray:
  """(Q, M) answer frequencies of each pool (negative entries ignored)."""
  answers_qn = np.asarray(answers_qn)
  counts = np.stack([(answers_qn == m).sum(1) for m in range(num_options)], 1).astype(np.float64)
  return counts / np.maximum(counts.sum(1, keepdims=True), 1.0)


@dataclasses.dataclass
class BucketModel:
  """Calibrated buckets.

  Attributes:
    patterns: the count patterns (bucket t = patterns[t]).
    pi_t: (T,) bucket probabilities.
    a_t, b_t: (T,) pi-weighted probit parameters (NaN for buckets with pi_t = 0).
    curves_tk: optional (T, k_max) pi-weighted exact curves A_t(k), k = 1..k_max (the "exact" variant).
  """
  patterns: list
  pi_t: np.ndarray
  a_t: np.ndarray
  b_t: np.ndarray
  curves_tk: np.ndarray | None = None

  def gain(self, t: int, k: int, kind: str) -> float:
    """A_t(k + 1) - A_t(k) under the probit fit ("probit") or the exact pooled curve ("exact")."""
    if kind == "probit":
      return float(sc.probit_gain(k, self.a_t[t], self.b_t[t]))
    c = self.curves_tk[t]
    if k + 1 > c.shape[0]:
      return 0.0
    return float(c[k] - (c[k - 1] if k >= 1 else 0.0))


def calibrate(answers_qn: np.ndarray, lengths_q: np.ndarray, labels_q: np.ndarray, num_options: int, *, k0: int = 4,
              k_min: int = 3, k_max: int = 40, curve_k_max: int = 64, draws: int = 2000, seed: int = 0,
              probit_eps: float = 1e-12) -> BucketModel:
  """Fits the bucket model on calibration questions (their full pools and pool-majority labels).

  Args:
    answers_qn: (Q, N) int pools (-1 padding).
    lengths_q: (Q,) pool lengths (>= k0).
    labels_q: (Q,) labels scored by the curves (pool majority); rows with label < 0 are skipped.
    num_options: M.
    k0: warm-up size.
    k_min, k_max: k range of the probit fit (official: 3..40).
    curve_k_max: length of the exact pooled curves (the plan's B_max).
    draws: k0-subsamples per question for pi_q(t).
    seed: subsampling seed.
    probit_eps: clipping of A(k) before the probit transform.

  Returns:
    BucketModel.
  """
  answers_qn = np.asarray(answers_qn)
  labels_q = np.asarray(labels_q)
  keep = labels_q >= 0
  answers_qn, lengths_q, labels_q = answers_qn[keep], np.asarray(lengths_q)[keep], labels_q[keep]
  if len(answers_qn) == 0:
    raise ValueError("calibrate: no calibration question has a label")
  theta = empirical_theta(answers_qn, num_options)
  kk = max(k_max, curve_k_max)
  curves = sc.mv_accuracy_curves(theta, kk, labels_q)
  ks = np.arange(k_min, k_max + 1)
  ab = np.array([sc.probit_fit(ks, c[k_min - 1:k_max], probit_eps) for c in curves])
  pi_qt = bucket_probs(answers_qn, lengths_q, num_options, k0, draws, seed)
  pi_t = pi_qt.mean(0)
  mass = pi_qt.sum(0)
  with np.errstate(invalid="ignore", divide="ignore"):
    a_t = np.where(mass > 0, (pi_qt * ab[:, :1]).sum(0) / mass, np.nan)
    b_t = np.where(mass > 0, (pi_qt * ab[:, 1:]).sum(0) / mass, np.nan)
    curves_tk = np.where(mass[:, None] > 0, pi_qt.T @ curves[:, :curve_k_max] / mass[:, None], np.nan)
  return BucketModel(count_patterns(k0, num_options), pi_t, a_t, b_t, curves_tk)


def greedy_bucket_plan(model: BucketModel, avg_budget: float, *, b_max: int = 64, k0: int = 4,
                       kind: str = "probit") -> np.ndarray:
  """Greedy marginal allocation of per-bucket budgets under an expected average budget.

  Starts at B_t = k0 and adds one answer at a time to the bucket with the largest marginal gain
  A_t(B_t + 1) - A_t(B_t) (every bucket's answer costs pi_t in expectation, and so does its gain) while
  sum_t pi_t B_t stays <= avg_budget + 1e-12 (the official code's tolerance; the running sum is exact, but the
  pi_t themselves need not sum to exactly 1 in floating point, which would otherwise leave one bucket an
  answer short of b_max at avg_budget = b_max) and B_t <= b_max. A bucket whose next answer does not fit is
  closed. Buckets never seen in calibration (pi_t = 0) stay at k0, as in the
  official code (their fitted curve is flat there, so they never gain).

  Args:
    model: calibrated `BucketModel`.
    avg_budget: target expected answers per question (>= k0).
    b_max: per-question cap.
    k0: warm-up size (minimum budget).
    kind: "probit" (the paper's fits) or "exact" (pooled exact curves).

  Returns:
    (T,) int64 budgets.

  Raises:
    ValueError: avg_budget < k0, b_max < k0, or an unknown kind.
  """
  if kind not in ("probit", "exact"):
    raise ValueError(f"greedy_bucket_plan: kind={kind!r}, use 'probit' or 'exact'")
  if avg_budget < k0 or b_max < k0:
    raise ValueError(f"greedy_bucket_plan: need avg_budget >= k0 and b_max >= k0 (got {avg_budget}, {b_max}, k0={k0})")
  pi = np.asarray(model.pi_t, np.float64)
  plan = np.full(pi.shape, k0, np.int64)
  unseen = pi <= 0
  spent = math.fsum(pi * plan)
  heap = [(-model.gain(t, k0, kind), t) for t in range(len(pi)) if not unseen[t] and k0 < b_max]
  heapq.heapify(heap)
  while heap:
    _, t = heapq.heappop(heap)
    if spent + pi[t] > avg_budget + _BUDGET_TOL:
      continue                                      # closed: its next answer never fits
    plan[t] += 1
    spent = math.fsum(pi * plan)
    if plan[t] < b_max:
      heapq.heappush(heap, (-model.gain(t, int(plan[t]), kind), t))
  return plan


def streaming_policy(answers_qn: np.ndarray, lengths_q: np.ndarray, plan_t: np.ndarray, num_options: int, *,
                     k0: int = 4, avg_budget: float | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Budgets of a stream of questions (in row order) under a bucket plan.

  Args:
    answers_qn: (Q, N) int pools; a question's answers are consumed in row order (prefix).
    lengths_q: (Q,) pool lengths (>= k0).
    plan_t: (T,) per-bucket budgets.
    num_options: M.
    k0: warm-up size.
    avg_budget: when given, the running ledger caps question i at floor(avg_budget * (i + 1) - spent)
      (>= k0 whenever avg_budget >= k0), so mean(budgets) <= avg_budget holds exactly.

  Returns:
    (budgets (Q,) int64 answers used per question, buckets (Q,) int64).
  """
  answers_qn = np.asarray(answers_qn)
  lengths_q = np.asarray(lengths_q, np.int64)
  if (lengths_q < k0).any():
    raise ValueError(f"streaming_policy: every pool needs >= k0={k0} answers")
  buckets = bucket_of(answers_qn[:, :k0], num_options)
  budgets = np.minimum(np.asarray(plan_t, np.int64)[buckets], lengths_q)
  if avg_budget is not None:
    if avg_budget < k0:
      raise ValueError(f"streaming_policy: avg_budget={avg_budget} < k0={k0}")
    spent, avg = 0, fractions.Fraction(avg_budget)
    for i in range(len(budgets)):
      allowed = math.floor(avg * (i + 1) - spent)       # exact rational arithmetic
      budgets[i] = max(min(int(budgets[i]), allowed), k0)
      spent += int(budgets[i])
  return budgets, buckets
