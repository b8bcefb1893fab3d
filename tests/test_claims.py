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


def test_claim_levels_are_drawn_on_the_curves_of_their_metric(tmp_path):
  """A claim on one metric reduced over seeds gives its target as a dashed level on that metric's panel, with an
  axis label per panel (reproduce's curves.png)."""
  import json
  import os
  from jaxlab import plotting, reproduce
  from jaxlab.claims import Claim, mean, minimum, ratio_of_means
  cs = [Claim("acc", "", minimum("eval/accuracy"), ">=", 0.93), Claim("band", "", mean("train/loss"), "in", (0.1, 0.2)),
        Claim("ratio", "", ratio_of_means("a", "b"), "<=", 0.7)]
  assert reproduce.claim_levels(cs) == {"eval/accuracy": [(0.93, "claim acc: >= 0.93")],
                                        "train/loss": [(0.1, "claim band: in [0.1, 0.2]"),
                                                       (0.2, "claim band: in [0.1, 0.2]")]}
  wd = tmp_path / "run"
  os.makedirs(wd)
  (wd / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "eval/accuracy": 0.5 + s / 10}) + "\n"
                                            for s in range(1, 5)))
  captured = {}
  real_save = plotting.save

  def save(fig, out_dir, name, dpi=110):
    ax = fig.axes[0]
    captured.update(ylabel=ax.get_ylabel(), levels=[ln.get_ydata()[0] for ln in ax.lines if ln.get_linestyle() == "--"])
    return real_save(fig, out_dir, name, dpi)
  plotting.save, saved = save, None
  try:
    saved = plotting.plot_curves([str(wd)], ["eval/accuracy"], str(tmp_path / "c.png"),
                                 levels=reproduce.claim_levels(cs))
  finally:
    plotting.save = real_save
  assert saved and captured == {"ylabel": "eval/accuracy", "levels": [0.93]}


def test_a_claim_that_needs_an_accelerator_is_measured_but_never_passed_on_a_cpu():
  speed = claims.Claim("speed", "4x faster", claims.minimum("acc"), ">=", 0.5, requires="accelerator")
  cpu = speed.check(RUNS, "cpu")
  assert cpu["passed"] is None and cpu["measured"] == 0.91 and cpu["status"] == claims.NOT_CHECKED
  assert cpu["requires"] == "accelerator"
  for backend in ("gpu", "tpu", None):            # checked like any claim where the hardware is there
    assert speed.check(RUNS, backend)["passed"] is True
  slow = claims.Claim("slow", "fails", claims.minimum("acc"), ">=", 0.95, requires="accelerator")
  assert slow.check(RUNS, "gpu")["passed"] is False and slow.check(RUNS, "cpu")["passed"] is None
  plain = claims.Claim("acc", "any backend", claims.minimum("acc"), ">=", 0.9)
  assert plain.check(RUNS, "cpu")["passed"] is True and "requires" not in plain.check(RUNS, "cpu")
  with pytest.raises(ValueError, match="requires must be one of"):
    claims.Claim("g", "bad", claims.mean("acc"), ">=", 1.0, requires="gpu")
