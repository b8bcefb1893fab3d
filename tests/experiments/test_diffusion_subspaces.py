"""Diffusion-on-subspaces experiment: end to end (short), resume, sharded == single device, config errors."""

import numpy as np
import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, registry
from jaxlab.errors import ConfigError

NAME = "diffusion_subspaces"
# A small version of the tiny variant: one union-of-subspaces setting, two sample sizes, 20 sampler steps.
SHORT = {"data.settings": ((8, 2, 2),), "data.ns": (32, 64), "method.steps": 20, "method.chunk": 16,
         "eval.projections": 16, "num_steps": 2}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end(NAME, tmp_path, SHORT)
  for key in ("slope/kde/D8_k2_M2", "slope_train/D8_k2_M2", "w1_ratio_max/kde", "union_dist/kde/D8_k2_M2"):
    assert key in s and np.isfinite(s[key])
  assert s["w1_gen/kde/D8_k2_M2@64"] > 0 and s["union_dist/kde/D8_k2_M2"] < 1e-3   # the KDE sampler memorises


def test_resume(tmp_path):
  check_resume(NAME, tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  # the generated batch (n = 32, 64 rows) is split over the 4-way data axis; rows are independent
  check_sharded_equals_single(NAME, tmp_path, SHORT, rtol=1e-5)


@pytest.mark.slow
def test_learned_score_stages(tmp_path):
  s = check_end_to_end(NAME, tmp_path, {**SHORT, "learned.enabled": True, "learned.steps": 200, "num_steps": 4})
  assert np.isfinite(s["slope/dsm/D8_k2_M2"])


def test_bad_config_is_a_clear_error(tmp_path):
  exp = registry.load(NAME)
  for over, match in ((({"num_steps": 3}), "must equal the number of stages"),
                      ({"data.settings": ((3, 4, 1),), "num_steps": 4}, "1 <= k <= D"),
                      ({"data.ns": (64, 32)}, "strictly increasing"),
                      ({"method.sampler": "ddim"}, "use one of"),
                      ({"data.coords": "laplace"}, "gaussian or uniform"),
                      ({"method.t_min": 7.0}, "t_min < config.method.t_max")):
    c = exp.get_config("tiny")
    configs.apply_overrides(c, over)
    with pytest.raises(ConfigError, match=match):
      exp.train_module.train_and_evaluate(c, str(tmp_path))


def test_variants_and_sweep_validate():
  exp = registry.load(NAME)
  for v in ("tiny", "small", "full"):
    c = exp.get_config(v)
    exp.config_module.validate(c)
  pts = exp.config_module.sweep("full")
  assert len(pts) == 60
  for p in pts[:3]:
    c = configs.apply_overrides(exp.get_config("full"), p)
    exp.config_module.validate(c)
