"""Diffusion-on-subspaces experiment: end to end (short), resume, sharded == single device, SIGTERM, config errors."""

import numpy as np
import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single, check_sigterm_resume
from jaxlab import configs, metrics, registry
from jaxlab.errors import ConfigError

NAME = "diffusion_subspaces"
# A small version of the tiny variant: one union-of-subspaces setting, two sample sizes, 20 sampler steps.
SHORT = {"data.settings": ((8, 2, 2),), "data.ns": (32, 64), "method.steps": 20, "method.chunk": 16,
         "eval.projections": 16}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end(NAME, tmp_path, SHORT)
  for key in ("slope/kde/D8_k2_M2", "slope_train/D8_k2_M2", "w1_ratio_max/kde", "union_dist/kde/D8_k2_M2"):
    assert key in s and np.isfinite(s[key])
  assert s["w1_gen/kde/D8_k2_M2@64"] > 0 and s["union_dist/kde/D8_k2_M2"] < 1e-3   # the KDE sampler memorises
  assert s["stages"] == ["kde/D8_k2_M2@32", "kde/D8_k2_M2@64"]
  rows = metrics.read_metrics(str(tmp_path))
  assert [r["stage"] for r in rows] == s["stages"] and [r["n"] for r in rows] == [32.0, 64.0]
  assert rows[1]["kde/D8_k2_M2/w1_gen"] == s["w1_gen/kde/D8_k2_M2@64"]


def test_resume(tmp_path):
  check_resume(NAME, tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  # the generated batch (n = 32, 64 rows) is split over the 4-way data axis; rows are independent
  check_sharded_equals_single(NAME, tmp_path, SHORT, rtol=1e-5)


def test_sigterm_inside_and_between_stages_resumes(tmp_path):
  # four stages (n = 16, 24, 32, 40): SIGTERM inside stage 1, then between stages 2 and 3
  check_sigterm_resume(NAME, tmp_path, {**SHORT, "data.ns": (16, 24, 32, 40), "method.steps": 10}, inside=1)


@pytest.mark.slow
def test_learned_score_stages(tmp_path):
  s = check_end_to_end(NAME, tmp_path, {**SHORT, "learned.enabled": True, "learned.steps": 200})
  assert np.isfinite(s["slope/dsm/D8_k2_M2"]) and len(s["stages"]) == 4


def test_stages_follow_the_grid():
  exp = registry.load(NAME)
  # the stage list follows data.settings x data.ns (x scores): no step count to keep in line
  c = exp.get_config("tiny", {"data.ns": (64, 128, 256)})
  assert len(exp.config_module.stages(c)) == 3 * 3
  c = exp.get_config("tiny", {"learned.enabled": True})
  names = [exp.config_module.stage_name(c, p) for p in exp.config_module.stages(c)]
  assert len(names) == 2 * 3 * 4 == len(set(names)) and names[0] == "kde/D32_k3_M3@128"
  assert names[-1] == "dsm/D8_k8_M1@1024"
  assert "train" not in c and "num_steps" not in configs.flatten(c)


def test_bad_config_is_a_clear_error():
  exp = registry.load(NAME)
  for over, match in (({"data.settings": ((3, 4, 1),)}, "1 <= k <= D"),
                      ({"data.settings": ((8, 2, 2), (8, 2, 2))}, "repeats a setting"),
                      ({"data.ns": (64, 32)}, "strictly increasing"),
                      ({"method.sampler": "ddim"}, "use one of"),
                      ({"data.coords": "laplace"}, "gaussian or uniform"),
                      ({"method.t_min": 7.0}, "t_min < config.method.t_max")):
    with pytest.raises(ConfigError, match=match):
      exp.get_config("tiny", over)
    with pytest.raises(ConfigError, match=match):   # a finalized config is validated again when changed
      configs.apply_overrides(exp.get_config("tiny"), over)
  with pytest.raises(ConfigError, match="unknown config key 'num_steps'"):
    exp.get_config("tiny", {"num_steps": 12})


def test_variants_and_sweep_validate():
  exp = registry.load(NAME)
  for v in ("tiny", "small", "full"):
    exp.get_config(v)
  pts = exp.config_module.sweep("full")
  assert len(pts) == 60
  for p in pts[:3]:
    c = exp.get_config("full", p)
    assert len(exp.config_module.stages(c)) == 2 * len(c.data.ns)
