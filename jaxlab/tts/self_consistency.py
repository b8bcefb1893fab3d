"""Self-consistency: majority / weighted votes, the self-consistency rate, exact MV accuracy curves, probit fits.

Notation (PETS, arXiv 2602.16745): question q has an answer distribution theta_q over M options; its
population (infinite-budget) majority is y*_q = argmax_m theta_q[m]. With b sampled trajectories the
self-consistency of q is SC_q(b) = P(MV(b samples) = y*_q) and the self-consistency RATE of a method is the
fraction of questions whose vote agrees with y*_q (in practice: with the majority vote of a large pool).

Votes work on integer answers in [0, M) (-1 = no answer / padding) and run on device (jnp, shardable over the
question axis). Ties are broken either by the smallest option index ("min", the default and the official online
code's rule for its labels and votes) or by the option seen first ("first", the official offline code's vote);
`first_seen` gives the position of each option's first vote. Labels and votes must use the same rule: "min"
does not depend on the order in which answers were collected, so any method that ends up holding a question's
whole pool votes its label; with "first" an allocator that draws the pool in another order than the label's
may not.

`mv_accuracy_curve(theta, k_max)` is exact: A(k) = P(MV of k iid draws from Categorical(theta) = label) with
ties split uniformly, computed by a generating function over the other options' counts (no enumeration of
the M^k sequences), so it is cheap for any M and k up to a few hundred. `probit_fit` fits
A(k) ~ Phi(a sqrt(k) + b) by least squares in probit space; `probit_gain` gives the stable marginal gain
A(k + 1) - A(k) from log survival functions (no 1 - 1 cancellation when A saturates).

`budget_saving` is the paper's headline statistic on a budget sweep: the first budget at which a method's
self-consistency rate reaches a level (1.0: perfect self-consistency), its realised spend there, and the
saving 1 - spend / (the baseline's first budget reaching the same level).
"""

from __future__ import annotations

import functools
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special, stats

TIE_BREAKS = ("first", "min")
_BIG = np.iinfo(np.int32).max


def vote_counts(answers_kn: jax.Array, num_options: int, weights_kn: jax.Array | None = None,
                valid_kn: jax.Array | None = None) -> jax.Array:
  """Per-question (weighted) vote totals.

  Args:
    answers_kn: (K, N) int answers in [0, M); negative entries are ignored.
    num_options: M.
    weights_kn: optional (K, N) float vote weights (default 1).
    valid_kn: optional (K, N) bool mask of the votes to count (e.g. a budget prefix).

  Returns:
    (K, M) float32 vote totals.
  """
  answers_kn = jnp.asarray(answers_kn)
  ok = answers_kn >= 0
  if valid_kn is not None:
    ok = ok & valid_kn
  w = jnp.ones(answers_kn.shape, jnp.float32) if weights_kn is None else jnp.asarray(weights_kn, jnp.float32)
  onehot = jax.nn.one_hot(jnp.where(ok, answers_kn, -1), num_options, dtype=jnp.float32)  # -1 -> all zeros
  return jnp.einsum("kn,knm->km", w, onehot)


def first_seen(answers_kn: jax.Array, num_options: int, valid_kn: jax.Array | None = None) -> jax.Array:
  """(K, M) int32 position of each option's first vote (int32 max when it never occurs)."""
  answers_kn = jnp.asarray(answers_kn)
  ok = answers_kn >= 0
  if valid_kn is not None:
    ok = ok & valid_kn
  pos = jnp.arange(answers_kn.shape[1], dtype=jnp.int32)[None, :, None]
  hit = ok[..., None] & (answers_kn[..., None] == jnp.arange(num_options)[None, None, :])
  return jnp.min(jnp.where(hit, pos, _BIG), axis=1).astype(jnp.int32)


def majority_vote(counts_km: jax.Array, first_km: jax.Array | None = None) -> jax.Array:
  """Winning option per question.

  Args:
    counts_km: (K, M) vote totals (counts or confidence sums).
    first_km: optional (K, M) first-vote positions; ties go to the earliest option ("first"). Without it
      ties go to the smallest option index ("min").

  Returns:
    (K,) int32 winners; -1 for questions without any vote.
  """
  counts_km = jnp.asarray(counts_km)
  top = jnp.max(counts_km, axis=-1, keepdims=True)
  if first_km is None:
    win = jnp.argmax(counts_km, axis=-1)
  else:
    win = jnp.argmin(jnp.where(counts_km == top, jnp.asarray(first_km), _BIG), axis=-1)
  return jnp.where(top[..., 0] > 0, win, -1).astype(jnp.int32)


def vote(answers_kn: jax.Array, num_options: int, *, weights_kn: jax.Array | None = None,
         budget_k: jax.Array | int | None = None, tie_break: str = "min") -> jax.Array:
  """Majority (or confidence-weighted, with `weights_kn`) vote of each question's first `budget_k` answers.

  Args:
    answers_kn: (K, N) int answers, -1 = none.
    num_options: M.
    weights_kn: optional (K, N) float confidences (weighted vote).
    budget_k: None (all N), an int, or (K,) ints: only the first budget_k[q] answers of row q vote.
    tie_break: "min" (smallest option index) or "first" (earliest answer among the tied options).

  Returns:
    (K,) int32 winners, -1 where no answer voted.
  """
  if tie_break not in TIE_BREAKS:
    raise ValueError(f"tie_break={tie_break!r}: use one of {TIE_BREAKS}")
  answers_kn = jnp.asarray(answers_kn)
  k, n = answers_kn.shape
  b = jnp.broadcast_to(jnp.asarray(n if budget_k is None else budget_k, jnp.int32), (k,))
  return _vote(answers_kn, weights_kn, b, num_options=int(num_options), tie_break=tie_break)


@functools.partial(jax.jit, static_argnames=("num_options", "tie_break"))
def _vote(answers_kn, weights_kn, budget_k, *, num_options, tie_break):
  valid = jnp.arange(answers_kn.shape[1])[None, :] < budget_k[:, None]
  counts = vote_counts(answers_kn, num_options, weights_kn, valid)
  first = first_seen(answers_kn, num_options, valid) if tie_break == "first" else None
  return majority_vote(counts, first)


def weighted_vote(answers_kn: jax.Array, weights_kn: jax.Array, num_options: int, **kwargs) -> jax.Array:
  """Confidence-weighted majority vote (see `vote`)."""
  return vote(answers_kn, num_options, weights_kn=weights_kn, **kwargs)


@jax.jit
def sc_rate(pred_k: jax.Array, label_k: jax.Array, mask_k: jax.Array | None = None) -> jax.Array:
  """Self-consistency rate: fraction of (masked) questions whose prediction equals the label.

  Questions whose label is -1 (unknown) are excluded; a label of -2 (known but never predictable) counts.

  Args:
    pred_k: (K,) int predictions (-1 = abstain, never correct).
    label_k: (K,) int labels (pool majority for SC, gold answers for accuracy).
    mask_k: optional (K,) bool question mask (e.g. test split, padding removed).

  Returns:
    float32 scalar in [0, 1] (0 when no question counts).
  """
  label_k = jnp.asarray(label_k)
  use = label_k != -1
  if mask_k is not None:
    use = use & jnp.asarray(mask_k)
  hits = jnp.sum((jnp.asarray(pred_k) == label_k) & use & (label_k >= 0))
  return (hits / jnp.maximum(jnp.sum(use), 1)).astype(jnp.float32)


def first_budget_reaching(rates: Mapping[int, float], level: float) -> int | None:
  """Smallest budget whose rate is >= level (None when none is): {budget: SC rate} -> budget."""
  hits = [b for b, v in rates.items() if v is not None and v >= level]
  return min(hits) if hits else None


def budget_saving(method_rates: Mapping[int, float], method_spend: Mapping[int, float],
                  base_rates: Mapping[int, float], level: float = 1.0) -> dict:
  """Budget saving of a method over a baseline at a self-consistency level, on a budget sweep.

  b_base = the first (smallest) budget at which the baseline's rate reaches `level`; b_method = the first
  budget at which the method's does; spend = the method's realised average spend at b_method (an online
  policy may spend less than its nominal average budget); saving = 1 - spend / b_base (the official code's
  "budget at perfect consistency" comparison with level = 1). Rates are exact fractions of questions, so
  level = 1.0 means every question agrees with its label.

  Args:
    method_rates: {budget: the method's SC rate}.
    method_spend: {budget: the method's realised answers per question} (keys as in method_rates).
    base_rates: {budget: the baseline's SC rate} (the baseline spends its budget).
    level: the self-consistency level.

  Returns:
    {"base_budget", "method_budget", "method_spend", "saving", "nominal_saving"} (nominal: 1 - b_method /
    b_base); entries are None where a curve never reaches the level.
  """
  b_base = first_budget_reaching(base_rates, level)
  b_m = first_budget_reaching(method_rates, level)
  spend = None if b_m is None else float(method_spend[b_m])
  ok = b_base is not None and b_m is not None
  return {"base_budget": b_base, "method_budget": b_m, "method_spend": spend,
          "saving": 1.0 - spend / b_base if ok else None, "nominal_saving": 1.0 - b_m / b_base if ok else None}


# ------------------------------------------------------------------------------------- exact A(k) curves


def mv_accuracy_curve(theta: Sequence[float] | np.ndarray, k_max: int, label: int | None = None) -> np.ndarray:
  """Exact P(majority vote of k iid draws = label) for k = 1..k_max, ties split uniformly.

  With c draws on the label and n_o on each other option o (sum k), the label wins alone when all n_o < c
  and shares a j+1-way tie (counted 1/(j+1)) when exactly j others have n_o = c. For each c the other
  options' counts are summed by the generating function prod_o [sum_{n<c} (theta_o x)^n / n! + y (theta_o
  x)^c / c!] (x counts draws, y counts ties), and the multinomial weight k! theta_l^c / c! is applied per k.
  Cost O(k_max^3 M) float64 operations.

  Args:
    theta: (M,) nonnegative option probabilities (normalised here).
    k_max: largest number of draws (>= 1).
    label: the option scored (default argmax theta, first index on ties).

  Returns:
    (k_max,) float64 array; entry k-1 is A(k).
  """
  theta = np.asarray(theta, np.float64)
  if theta.ndim != 1 or theta.size < 1 or (theta < 0).any() or theta.sum() <= 0:
    raise ValueError(f"theta must be a nonnegative (M,) vector with positive sum, got {theta}")
  if int(k_max) < 1:
    raise ValueError(f"k_max must be >= 1, got {k_max}")
  k_max = int(k_max)
  theta = theta / theta.sum()
  m = theta.size
  label = int(np.argmax(theta)) if label is None else int(label)
  t_l = theta[label]
  others = np.delete(theta, label)
  logfact = special.gammaln(np.arange(k_max + 1) + 1.0)
  out = np.zeros(k_max + 1)
  ties = 1.0 / (1.0 + np.arange(m))
  for c in range(1, k_max + 1):
    d = k_max - c                                    # the others may hold 0..d draws
    poly = np.zeros((d + 1, m))                      # poly[s, j]: others hold s draws, j of them tie at c
    poly[0, 0] = 1.0
    for th in others:
      n = np.arange(min(c, d + 1))                   # counts strictly below c
      below = np.exp(n * np.log(th) - logfact[n]) if th > 0 else (n == 0).astype(np.float64)
      new = np.zeros_like(poly)
      for i, coef in enumerate(below):
        if coef:
          new[i:] += coef * poly[: d + 1 - i]
      if c <= d and th > 0:
        new[c:, 1:] += np.exp(c * np.log(th) - logfact[c]) * poly[: d + 1 - c, :-1]
      poly = new
    ks = c + np.arange(d + 1)
    if t_l > 0:
      w = np.exp(logfact[ks] - logfact[c] + c * np.log(t_l))
      out[ks] += w * (poly @ ties)
  return np.clip(out[1:], 0.0, 1.0)


def mv_accuracy_curves(theta_qm: np.ndarray, k_max: int, labels_q: np.ndarray | None = None) -> np.ndarray:
  """`mv_accuracy_curve` for each row: (Q, M) thetas, optional (Q,) labels -> (Q, k_max) float64."""
  theta_qm = np.asarray(theta_qm, np.float64)
  labels = [None] * len(theta_qm) if labels_q is None else [int(x) for x in labels_q]
  return np.stack([mv_accuracy_curve(t, k_max, lab) for t, lab in zip(theta_qm, labels)]) if len(theta_qm) else \
      np.zeros((0, int(k_max)))


def probit_fit(ks: Sequence[float], acc: Sequence[float], eps: float = 1e-12) -> tuple[float, float]:
  """Least-squares fit of Phi^-1(A(k)) = a sqrt(k) + b.

  Args:
    ks: (n,) numbers of samples (n >= 2 distinct values).
    acc: (n,) accuracies A(k), clipped to [eps, 1 - eps] before the probit transform.
    eps: clipping margin (saturated curves would otherwise map to +-inf).

  Returns:
    (a, b) floats.
  """
  ks = np.asarray(ks, np.float64)
  z = special.ndtri(np.clip(np.asarray(acc, np.float64), eps, 1.0 - eps))
  if ks.shape != z.shape or len(np.unique(ks)) < 2:
    raise ValueError(f"probit_fit needs matching ks/acc with >= 2 distinct k, got shapes {ks.shape}, {z.shape}")
  a, b = np.polyfit(np.sqrt(ks), z, 1)
  return float(a), float(b)


def probit_curve(k, a: float, b: float) -> np.ndarray:
  """Phi(a sqrt(k) + b) (float64)."""
  return special.ndtr(a * np.sqrt(np.asarray(k, np.float64)) + b)


def probit_gain(k, a: float, b: float) -> np.ndarray:
  """Marginal gain A(k + 1) - A(k) of the probit curve, computed as sf(x_k) - sf(x_{k+1}) in log space.

  Stays accurate when both values round to 1 in float64 (gains ~1e-300 remain ordered).
  """
  k = np.asarray(k, np.float64)
  x1 = a * np.sqrt(k) + b
  x2 = a * np.sqrt(k + 1.0) + b
  l1, l2 = stats.norm.logsf(x1), stats.norm.logsf(x2)
  hi, lo = np.maximum(l1, l2), np.minimum(l1, l2)
  mag = np.exp(hi) * -np.expm1(lo - hi)
  return np.where(l1 >= l2, mag, -mag)
