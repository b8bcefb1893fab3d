"""Robust Q experiment: end to end (short), resume, sharded == single device, config errors, variants, sweeps."""

import numpy as np
import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, metrics, registry, sweep
from jaxlab.errors import ConfigError

# A small, fast version of the tiny variant: S = 4, 3 stages of 200 steps, 3 corruption settings.
SHORT = {"mdp.num_states": 4, "method.horizon": 600, "method.stage_steps": 200, "train.checkpoint_every": 1,
         "method.capacity": 64, "method.burn_in": 5, "grid.epsilons": (0.0, 0.1), "grid.magnitudes": (100.0, 10000.0)}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("robust_q", tmp_path, SHORT)
  for est in ("vanilla", "mean", "median", "mom", "trimmed", "trimmed_known"):
    for key in (f"q_error/{est}", f"suboptimality/{est}", f"q_error/{est}/eps_0", f"q_error/{est}/M_10000",
                f"rate_slope/{est}"):
      assert key in s, key
  assert s["q_error/vanilla"] == s["q_error/vanilla/M_100"] == s["q_error/vanilla/eps_0.1"]
  assert s["steps"] == 600 and s["num_settings"] == 3
  # Even this short run shows the effect: vanilla's error scales with M, the trimmed mean's does not.
  assert s["q_error/vanilla/M_10000"] > 50 * s["q_error/vanilla/M_100"] > 50 * s["q_error/trimmed/M_100"]
  assert s["q_error/trimmed/M_10000"] == s["q_error/trimmed/M_100"]
  rows = metrics.read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2, 3] and [r["steps"] for r in rows] == [200, 400, 600]
  assert metrics.read_json(str(tmp_path / "summary.json")) == s       # written once, by run_loop


def test_resume(tmp_path):
  check_resume("robust_q", tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  # The batch (seeds x corruption settings, padded) is split over the "data" axis; elements are independent.
  check_sharded_equals_single("robust_q", tmp_path, {**SHORT, "grid.seeds": 2, "train.checkpoint_every": 0}, rtol=1e-6)


@pytest.mark.parametrize("override,match", [
    ({"corruption.model": "gaussian"}, "corruption.model"),
    ({"corruption.budget": "total"}, "corruption.budget"),
    ({"corruption.epsilon": 0.5}, r"in \[0, 0.5\)"),
    ({"grid.epsilons": (0.0, -0.1)}, "grid.epsilons"),
    ({"method.estimators": ("mean", "huber")}, "method.estimators"),
    ({"method.stage_steps": 7000}, "positive multiple"),
    ({"train.num_steps": 5}, "unknown config key 'train.num_steps'"),
    ({"mdp.gamma": 1.0}, "gamma"),
    ({"mdp.noise": "student_t", "mdp.noise_df": 2.0}, "noise_df"),
])
def test_bad_config_is_a_clear_error(override, match):
  exp = registry.load("robust_q")
  with pytest.raises(ConfigError, match=match):
    exp.get_config("tiny", override)
  c = exp.get_config("tiny")
  with pytest.raises(ConfigError, match=match):           # a finalized config is checked again on change
    configs.apply_overrides(c, override)


def test_horizon_alone_sets_the_stages(tmp_path):
  # The stage count follows from method.horizon / method.stage_steps; there is no num_steps to keep in line.
  c = registry.load("robust_q").get_config("tiny", {"method.horizon": 50_000})
  assert sorted(c.train.keys()) == ["async_checkpoint", "checkpoint_every", "keep_checkpoints", "log_every"]
  s = check_end_to_end("robust_q", tmp_path, {**SHORT, "method.horizon": 800})
  assert s["steps"] == 800 and len(metrics.read_metrics(str(tmp_path))) == 4


def test_variants_and_sweeps_validate():
  exp = registry.load("robust_q")
  full = exp.get_config("full")
  exp.config_module.validate(full)
  assert (full.mdp.num_states, full.mdp.gamma, full.method.horizon, full.grid.seeds) == (100, 0.99, 10**7, 20)
  assert len(exp.train_module.method.corruption_settings(full)) == 8
  assert full.method.horizon // full.method.stage_steps == 100
  exp.config_module.validate(exp.get_config("small"))
  assert len(sweep.points("robust_q:full")) == 12 and len(sweep.points("robust_q:tiny")) == 9


def test_rate_slope_fit():
  method = registry.load("robust_q").train_module.method
  t = np.array([1e3, 2e3, 4e3, 8e3, 16e3])
  assert method.rate_slope(t, 3.0 * t ** -0.5) == pytest.approx(-0.5, abs=1e-9)
  assert method.rate_slope(t, 3.0 * t ** -0.5, fit_from=0.4) == pytest.approx(-0.5, abs=1e-9)
  assert np.isnan(method.rate_slope(t[:1], t[:1]))
