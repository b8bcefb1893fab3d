"""ORLM-compatible answer scoring: the comparison rule, pass@k, the unbiased estimator and majority voting."""

from __future__ import annotations

import ast
import itertools
import math
import os
import random
from collections import Counter

import pytest

from jaxlab.errors import ConfigError, DataError
from jaxlab.opt_modeling import scoring
from jaxlab.opt_modeling.scoring import (REPORT_TOLS, accuracy, is_correct, majority_vote, mj_at_k, normalize_answer,
                                         pass_at_k, pass_at_k_unbiased, report)

NBS = "No Best Solution"


# ---------------------------------------------------------------------------------------------------------------
# normalize_answer


@pytest.mark.parametrize("raw, want", [
    (3, 3.0), (-2.5, -2.5), ("3050.0", 3050.0), ("  42 ", 42.0), ("1,234.5", 1234.5), ("-1,000,000", -1e6),
    ("$1,200", 1200.0), ("-$5", -5.0), ("$-5", -5.0), ("12.5%", 12.5), ("1.5e+03", 1500.0), ("2E-3", 0.002),
    (".5", 0.5), ("7.", 7.0), ("+8", 8.0), ("\u22123", -3.0), ("1 000", 1000.0),
])
def test_normalize_numbers(raw, want):
  assert normalize_answer(raw) == want


@pytest.mark.parametrize("raw", [None, NBS, "no best solution", "NO  BEST SOLUTION", "Infeasible", "UNBOUNDED",
                                 "", "   ", "no optimal solution"])
def test_normalize_no_solution(raw):
  assert normalize_answer(raw) is None


@pytest.mark.parametrize("raw", ["abc", "12 apples", "1,5", "12,34", "nan", "inf", "--3", "1e", "$", "-", "1_000",
                                 "0x10"])
def test_normalize_rejects_strings_naming_them(raw):
  with pytest.raises(DataError) as e:
    normalize_answer(raw)
  msg = str(e.value)
  assert repr(raw) in msg and "\n" not in msg


@pytest.mark.parametrize("raw", [True, [1], {"a": 1}, object()])
def test_normalize_rejects_other_types(raw):
  with pytest.raises(DataError):
    normalize_answer(raw)


def test_normalize_nan_is_kept():
  assert math.isnan(normalize_answer(float("nan")))


# ---------------------------------------------------------------------------------------------------------------
# is_correct


@pytest.mark.parametrize("pred, gt, strict, loose", [
    (100.0, 100, True, True),
    (100.005, 100, True, True),      # rel 5e-5
    (100.02, 100, False, True),      # rel 2e-4
    (104.9, 100, False, True),
    (105.1, 100, False, False),
    (95.0, 100, False, True),        # rel exactly 0.05
    ("3050.0", "3050", True, True),
    (-199.99, -200, True, True),     # negative values: relative to |gt|
    (-190.5, -200, False, True),
    (-189.0, -200, False, False),
    (200.0, -200, False, False),     # the sign matters
    (0.0, 0, True, True),            # gt == 0: |pred| <= tol
    (5e-5, 0, True, True),
    (-2e-4, 0, False, True),
    (0.06, 0, False, False),
])
def test_is_correct_both_tolerances(pred, gt, strict, loose):
  assert is_correct(pred, gt, 1e-4) is strict
  assert is_correct(pred, gt, 0.05) is loose
  assert REPORT_TOLS == (1e-4, 0.05)


@pytest.mark.parametrize("pred, gt, want", [
    (None, NBS, True), ("No Best Solution", NBS, True), ("infeasible", NBS, True), ("UNBOUNDED", None, True),
    (None, "", True), (NBS, "infeasible", True),
    (0, NBS, False), ("0", None, False), (1e9, NBS, False),
    (None, 5, False), (NBS, 0, False), ("infeasible", "0", False),
])
def test_is_correct_no_solution(pred, gt, want):
  for tol in REPORT_TOLS:
    assert is_correct(pred, gt, tol) is want


def test_is_correct_rounding_option():
  assert not is_correct(10.4, 10, 1e-4)
  assert is_correct(10.4, 10, 1e-4, round_first=True)
  assert is_correct(2.5, 2, 0, round_first=True)        # Python round: half to even, as ORLM's round(float(x))
  assert not is_correct(3.5, 3, 0, round_first=True)    # 3.5 -> 4
  assert is_correct(0.3, 0.4, 0, round_first=True)      # both round to 0 -> the absolute test
  assert not is_correct(0.3, 0.4, 0.05)
  assert is_correct(-7.6, -8, 1e-4, round_first=True)
  assert is_correct(None, NBS, 1e-4, round_first=True)


def test_is_correct_failed_runs_and_bad_inputs():
  assert not is_correct(float("nan"), 3, 0.05)
  assert not is_correct(float("nan"), NBS, 0.05)
  assert not is_correct(float("inf"), 3, 0.05)
  assert not is_correct(float("nan"), 0, 0.05, round_first=True)
  with pytest.raises(DataError, match="ground truth"):
    is_correct(3, float("nan"), 0.05)
  with pytest.raises(DataError, match="prediction 'oops'"):
    is_correct("oops", 3, 0.05)
  for tol in (-1e-4, float("nan"), float("inf"), "0.05", True):
    with pytest.raises(ConfigError):
      is_correct(3, 3, tol)


def _orlm_judge(pred, gt, tol, rounding):
  """ORLM eval/execute.py's comparison of one prediction (a string printed by the program, or None) with a gt,
  re-implemented step by step; `rounding=False` skips its round(float(x)) calls."""
  if gt == "No Best Solution":
    return pred is not None and pred == gt
  conv = (lambda x: round(float(x))) if rounding else float
  gt = conv(gt)
  if pred is None or pred == "No Best Solution":
    return False
  pred = conv(pred)
  if gt == 0:
    return abs(pred) <= tol
  return abs((pred - gt) / gt) <= tol


def _random_pair(rng: random.Random):
  r = rng.random()
  if r < 0.1:
    gt = NBS
  elif r < 0.2:
    gt = rng.choice([0, 0.0, "0", "0.0"])
  elif r < 0.4:
    gt = round(rng.uniform(-2, 2), rng.choice([1, 2, 3]))  # near zero: rounding matters
  else:
    gt = rng.choice([1, -1]) * round(10 ** rng.uniform(0, 6), rng.choice([0, 1, 2, 4]))
  gt = rng.choice([gt, str(gt)]) if gt != NBS else gt
  base = 0.0 if gt == NBS else float(gt)
  r = rng.random()
  if r < 0.1:
    pred = NBS
  elif r < 0.2:
    pred = rng.uniform(-1, 1) * rng.choice([1e-5, 1e-3, 0.04, 0.06, 1])
  elif r < 0.3:
    pred = rng.uniform(-1e4, 1e4)
  else:
    eps = rng.choice([0, 5e-5, 9e-5, 1.1e-4, 3e-4, 0.01, 0.049, 0.051, 0.2]) * rng.choice([1, -1])
    pred = base * (1 + eps) + rng.choice([0, 0, 0.3, -0.4, 0.5, -0.5])
  return (str(pred) if pred != NBS else pred), gt


def test_matches_a_literal_reimplementation_of_orlm():
  rng = random.Random(2405_17743)
  pairs = [_random_pair(rng) for _ in range(200)]
  agree = Counter()
  for pred, gt in pairs:
    for tol in REPORT_TOLS:
      for rounding in (True, False):
        want = _orlm_judge(pred, gt, tol, rounding)
        assert is_correct(pred, gt, tol, round_first=rounding) is want, (pred, gt, tol, rounding)
        agree[want] += 1
  assert agree[True] > 100 and agree[False] > 100  # both outcomes well exercised


# ---------------------------------------------------------------------------------------------------------------
# pass@k


def test_pass_at_k_against_brute_force():
  rng = random.Random(0)
  for _ in range(50):
    n_problems, n_samples = rng.randint(1, 12), rng.randint(1, 8)
    rows = [[rng.random() < 0.3 for _ in range(n_samples)] for _ in range(n_problems)]
    for k in range(1, n_samples + 1):
      hits = 0
      for row in rows:
        for j in range(k):
          if row[j]:
            hits += 1
            break
      assert pass_at_k(rows, k) == hits / n_problems


def test_pass_at_k_errors():
  with pytest.raises(DataError, match="problem 1 has 2 samples, fewer than k=3"):
    pass_at_k([[True, False, False], [True, False]], 3)
  with pytest.raises(DataError):
    pass_at_k([], 1)
  for k in (0, -1, 1.5, True):
    with pytest.raises(ConfigError):
      pass_at_k([[True]], k)


def test_pass_at_k_unbiased_against_subset_enumeration():
  for n in range(1, 8):
    for c in range(n + 1):
      outcomes = [True] * c + [False] * (n - c)
      for k in range(1, n + 1):
        subsets = list(itertools.combinations(range(n), k))
        want = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
        assert pass_at_k_unbiased(n, c, k) == pytest.approx(want, abs=1e-12), (n, c, k)
  assert pass_at_k_unbiased(10, 3, 1) == pytest.approx(0.3)
  assert pass_at_k_unbiased(200, 0, 50) == 0.0
  assert 0.0 < pass_at_k_unbiased(10_000, 1, 10) < 1.0


def test_pass_at_k_unbiased_errors():
  for n, c, k in [(3, 4, 1), (3, 1, 4), (3, 1, 0), (-1, 0, 1), (3, -1, 1)]:
    with pytest.raises(ConfigError):
      pass_at_k_unbiased(n, c, k)


# ---------------------------------------------------------------------------------------------------------------
# majority voting


def test_majority_vote_ties_go_to_first_occurrence():
  assert majority_vote([1, 2], 0) == 1
  assert majority_vote([2, 1, 1, 2], 0) == 2
  assert majority_vote([1, 2, 2], 0) == 2
  assert majority_vote(["3", 3.0, "4"], 0) == 3.0


def test_majority_vote_groups_within_tolerance():
  preds = [100, 101, 102, 5, 5]
  assert majority_vote(preds, 0.05) == 100  # 100, 101, 102 group at 5%
  assert majority_vote(preds, 1e-4) == 5
  assert majority_vote([0, 0.01, 1e-5, 7, 7], 0.05) == 0  # absolute near 0
  assert majority_vote([2.4, 1.6, 2.0, 7.0, 7.0], 0, round_first=True) == 2.0
  assert majority_vote([2.4, 1.6, 2.0, 7.0, 7.0], 0) == 7.0


def test_majority_vote_no_solution_and_failed_runs():
  assert majority_vote([None, 3, None], 0.05) is None
  assert majority_vote(["infeasible", 3, 3, NBS], 0.05) is None   # tie; the None group came first
  assert majority_vote([3, "infeasible", 3, NBS], 0.05) == 3
  assert majority_vote([float("nan"), float("nan"), 4], 0.05) == 4  # NaN = failed run: no vote
  assert math.isnan(majority_vote([float("nan")], 0.05))
  assert math.isnan(majority_vote([], 0.05))
  with pytest.raises(DataError, match="sample 1"):
    majority_vote([1, "junk"], 0.05)


def test_mj_at_k():
  samples = [[1, 2, 2], [None, None, 5], [7, 8, 9]]
  gts = [2, NBS, 100]
  assert mj_at_k(samples, gts, 3, 0.05) == pytest.approx(2 / 3)
  assert mj_at_k(samples, gts, 1, 0.05) == pytest.approx(1 / 3)
  with pytest.raises(DataError, match="problem 0 has 3 samples"):
    mj_at_k(samples, gts, 4, 0.05)
  with pytest.raises(DataError):
    mj_at_k(samples, gts[:2], 1, 0.05)


def test_mj_at_k_matches_orlm_counting_on_integers():
  """ORLM: round, count equal values (Counter), the first most common wins; then compare with tolerance."""
  rng = random.Random(1)
  samples = [[str(rng.choice([10, 11, 12, 40]) + rng.choice([0, 0.2, -0.3])) for _ in range(8)] for _ in range(40)]
  gts = [rng.choice([10, 11, 12, 40, 41]) for _ in range(40)]
  for k in (1, 4, 8):
    hits = 0
    for row, gt in zip(samples, gts):
      count = Counter(round(float(p)) for p in row[:k])
      top = max(count.values())
      vote = [a for a, n in count.items() if n == top][0]
      hits += abs((vote - gt) / gt) <= 0.05
    assert mj_at_k(samples, gts, k, 0.05, round_first=True, vote_tol=0) == hits / len(gts)


# ---------------------------------------------------------------------------------------------------------------
# accuracy and report


def test_accuracy_and_report():
  preds = [100.00001, 103, None, "", -50]
  gts = [100, 100, NBS, NBS, 50]  # the prediction "" says "no solution"
  assert accuracy(preds, gts, 1e-4) == pytest.approx(3 / 5)
  assert accuracy(preds, gts, 0.05) == pytest.approx(4 / 5)
  rep = report(preds, gts)
  assert rep == {"acc@0.0001": pytest.approx(0.6), "acc@0.05": pytest.approx(0.8), "n": 5}
  assert report([10.4], [10], round_first=True)["acc@0.0001"] == 1.0


def test_accuracy_errors():
  with pytest.raises(DataError, match="2 predictions for 1 ground truths"):
    accuracy([1, 2], [1], 0.05)
  with pytest.raises(DataError, match="no problems"):
    accuracy([], [], 0.05)
  with pytest.raises(DataError, match="problem 1: prediction 'x'"):
    accuracy([1, "x"], [1, 2], 0.05)


def test_modules_do_not_import_jax_or_numpy():
  here = os.path.dirname(os.path.abspath(__file__))
  pkg = os.path.join(os.path.dirname(os.path.dirname(here)), "jaxlab", "opt_modeling")
  for name in ("scoring.py", "benchmarks.py"):
    with open(os.path.join(pkg, name)) as f:
      tree = ast.parse(f.read())
    for node in tree.body:  # module level
      mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
              else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      for mod in mods:
        assert mod.split(".")[0] not in ("jax", "jaxlib", "numpy", "flax"), (name, mod)
  assert scoring.__doc__ and "Cardinal-Operations/ORLM" in scoring.__doc__ and "2405.17743" in scoring.__doc__
