"""SWING experiment: end to end (short), resume, sharded == single device, config errors."""

import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, registry
from jaxlab.errors import ConfigError

# A small, fast version of the tiny variant: 2 walk counts, 2 unbiasedness seeds, no downstream task.
SHORT = {"data.n": 96, "method.walks": (4, 8), "method.m": 32, "method.t_max": 6, "eval.unbiased_seeds": 2,
         "eval.unbiased_walks": 4, "downstream.task": "none", "num_steps": 4}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("swing", tmp_path, SHORT)
  for key in ("err/swing@8", "err/uniform@8", "err/oracle@8", "unbiased/mean_err"):
    assert key in s and s[key] > 0


def test_resume(tmp_path):
  check_resume("swing", tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  # SWING's walkers are split over the data axis; its randomness depends on walker ids only.
  check_sharded_equals_single("swing", tmp_path, {**SHORT, "method.baselines": False}, rtol=1e-4)


def test_bad_config_is_a_clear_error(tmp_path):
  exp = registry.load("swing")
  c = exp.get_config("tiny")
  configs.apply_overrides(c, {"num_steps": 3})
  with pytest.raises(ConfigError, match="must equal the number of stages"):
    exp.train_module.train_and_evaluate(c, str(tmp_path))
  c = exp.get_config("tiny")
  configs.apply_overrides(c, {"data.points": "npy"})
  with pytest.raises(ConfigError, match="needs --config.data.path"):
    exp.train_module.train_and_evaluate(c, str(tmp_path))
