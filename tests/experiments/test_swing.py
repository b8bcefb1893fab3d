"""SWING experiment: end to end (short), resume, SIGTERM inside a stage, sharded == single device, config errors."""

import numpy as np
import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single, check_sigterm_resume
from jaxlab import metrics, registry
from jaxlab.errors import ConfigError
from jaxlab.train import stage_arrays

# A small, fast version of the tiny variant: 2 walk counts, 2 unbiasedness seeds, no downstream task (4 stages).
SHORT = {"data.n": 96, "method.walks": (4, 8), "method.m": 32, "method.t_max": 6, "eval.unbiased_seeds": 2,
         "eval.unbiased_walks": 4, "downstream.task": "none"}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("swing", tmp_path, {**SHORT, "eval.unbiased_seeds": 3})
  assert s["stages"] == ["walks@4", "walks@8", "unbiased@1", "unbiased@2", "unbiased@3"]
  for key in ("err/swing@8", "err/uniform@8", "err/oracle@8", "unbiased/mean_err"):
    assert key in s and s[key] > 0
  assert np.isfinite(s["unbiased/slope"]) and s["n"] == 96 and s["dense_eval"] is True
  rows = metrics.read_metrics(str(tmp_path))                # one row per stage, as the plot reads them
  assert [r["stage"] for r in rows] == s["stages"] and [r["walks"] for r in rows[:2]] == [4, 8]
  assert [r["unbiased/seeds"] for r in rows[2:]] == [1, 2, 3]
  assert rows[-1]["unbiased/mean_err"] == s["unbiased/mean_err"]
  assert metrics.read_json(str(tmp_path / "summary.json")) == s
  assert not stage_arrays(str(tmp_path), 0, "walks@4")       # results are scalars; the running sum is the state


def test_resume(tmp_path):
  check_resume("swing", tmp_path, SHORT)


def test_sigterm_inside_a_stage_resumes(tmp_path):
  # SIGTERM inside walks@8, then between unbiased@1 and unbiased@2: the running sum (carried state) survives.
  check_sigterm_resume("swing", tmp_path, SHORT, inside=1)


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_sharded_equals_single_device(tmp_path):
  # SWING's walkers are split over the data axis; its randomness depends on walker ids only.
  check_sharded_equals_single("swing", tmp_path, {**SHORT, "method.baselines": False}, rtol=1e-4)


def test_walks_alone_set_the_stages():
  # No step count to keep in line: --config.method.walks alone changes the run's stages.
  c = registry.load("swing").get_config("tiny", {"method.walks": (4, 8, 16)})
  assert "train" not in c and "num_steps" not in c


def test_bad_config_is_a_clear_error(tmp_path):
  exp = registry.load("swing")
  for overrides, message in (({"method.walks": (4, 4)}, "distinct positive walk counts"),
                             ({"eval.unbiased_seeds": -1}, "unbiased_seeds"),
                             ({"data.graph": "knn"}, "use rbf, eps or smooth_step"),
                             ({"num_steps": 3}, "unknown config key 'num_steps'")):
    with pytest.raises(ConfigError, match=message):
      exp.get_config("tiny", overrides)
  c = exp.get_config("tiny", {"data.points": "npy"})
  with pytest.raises(ConfigError, match="needs --config.data.path"):
    exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
  exp.get_config("full")                                     # builds; its point cloud is read at run time
