"""Claim checks: measured from per-seed summaries, compared with the target, failures reported."""

import pytest

from jaxlab import claims

RUNS = [{"acc": 0.95, "loss": 0.1}, {"acc": 0.91, "loss": 0.3}, {"acc": 0.97, "loss": 0.2}]


def test_measures():
  assert claims.mean("acc")(RUNS) == pytest.approx(0.91 / 3 + 0.95 / 3 + 0.97 / 3)
  assert claims.minimum("acc")(RUNS) == 0.91 and claims.maximum("loss")(RUNS) == 0.3
  assert claims.fraction(lambda r: r["acc"] >= 0.93)(RUNS) == pytest.approx(2 / 3)
  assert claims.count(lambda r: r["loss"] < 0.25)(RUNS) == 2


def test_check_pass_fail_interval_and_errors():
  ok = claims.Claim("a", "min acc >= 0.9", claims.minimum("acc"), ">=", 0.9).check(RUNS)
  assert ok["passed"] and ok["measured"] == 0.91 and ok["target"] == ">= 0.9"
  bad = claims.Claim("b", "all >= 0.93", claims.fraction(lambda r: r["acc"] >= 0.93), ">=", 1.0).check(RUNS)
  assert not bad["passed"]
  inside = claims.Claim("c", "loss in band", claims.mean("loss"), "in", (0.1, 0.25)).check(RUNS)
  assert inside["passed"] and inside["target"] == "in [0.1, 0.25]"
  missing = claims.Claim("d", "needs a key", claims.mean("nope"), "<", 1.0).check(RUNS)
  assert not missing["passed"] and missing["measured"] is None and "KeyError" in missing["error"]
  nan = claims.Claim("e", "nan fails", lambda runs: float("nan"), "<", 1.0).check(RUNS)
  assert not nan["passed"]
  with pytest.raises(ValueError, match="op must be"):
    claims.Claim("f", "bad op", claims.mean("acc"), "==", 1.0)


def test_t_bound_is_the_one_sided_student_interval():
  import numpy as np
  from scipy import stats
  v = [1.0, 1.5, 0.7, 1.2]
  half = stats.t.ppf(0.95, 3) * np.std(v, ddof=1) / 2
  assert claims.t_bound(v) == pytest.approx(np.mean(v) - half)
  assert claims.t_bound(v, 0.95, "upper") == pytest.approx(np.mean(v) + half)
  assert claims.t_bound(v, 0.99, "upper") > claims.t_bound(v, 0.95, "upper")
  with pytest.raises(ValueError, match="needs >= 2 values"):
    claims.t_bound([1.0])
  with pytest.raises(ValueError, match="'lower' or 'upper'"):
    claims.t_bound(v, side="both")
