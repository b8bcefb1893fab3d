"""MoE calibration experiment: end to end (small sizes), resume, the world against closed forms, the
aggregate-only toy failing claim 1, config errors."""

import numpy as np
import pytest

from experiment_checks import check_end_to_end, check_resume
from jaxlab import metrics, registry
from jaxlab.errors import ConfigError

SHORT = {"data.train_size": 20_000, "data.val_size": 5_000, "data.test_size": 20_000, "eval.n_boot": 20}


def _method():
  return registry.load("moe_calibration").train_module.method


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("moe_calibration", tmp_path, SHORT)
  for arm in ("hard", "soft", "soft_global_ts", "oracle"):
    for shift in ("S0", "S1", "S2"):
      lo, e, hi = (s[f"{arm}/{shift}/{k}"] for k in ("ece_lo", "ece", "ece_hi"))
      assert 0 <= lo <= hi <= 1 and 0 <= e <= 1 and 0.5 <= s[f"{arm}/{shift}/acc"] <= 1
  assert s["test/S2/size"] == 20_000 and 0 < s["test/S2/accept_rate"] < 1
  # Even at this size the boundary shift separates the soft aggregate from the hard one.
  assert s["soft/S2/ece"] > s["hard/S2/ece"] + 0.005
  assert metrics.read_json(str(tmp_path / "summary.json")) == s
  exp = registry.load("moe_calibration")
  rel = exp.train_module.reliability_data(str(tmp_path))
  assert set(rel) == {f"{a}/{sh}" for a in ("hard", "soft", "soft_global_ts", "oracle") for sh in ("S0", "S1", "S2")}
  assert np.isclose(np.nansum(rel["hard/S0"]["share"]), 1.0)


def test_resume(tmp_path):
  check_resume("moe_calibration", tmp_path, {**SHORT, "data.train_size": 5_000, "data.val_size": 2_000,
                                              "data.test_size": 5_000})


def test_world_regions_labels_and_shifts():
  m = _method()
  world = m.make_world(0, sep=2.0, slope=1.0)
  rng = np.random.default_rng(0)
  x = np.array([[1.0, 2.0], [-3.0, 0.5], [-0.2, -0.1], [0.3, -4.0]])
  np.testing.assert_array_equal(m.region(world, x), [0, 1, 2, 3])     # quadrants (equal priors, equal spread)
  r = m.region(world, x)
  want = 1 / (1 + np.exp(-(np.sum(world.slopes[r] * x, 1) + world.offsets[r])))
  np.testing.assert_allclose(m.true_prob(world, x), want)
  s1 = m.draw_shift(world, rng, "S1", 40_000, (0.7, 0.1, 0.1, 0.1))
  np.testing.assert_allclose(np.bincount(s1["cluster"], minlength=4) / 40_000, [0.7, 0.1, 0.1, 0.1], atol=0.01)
  s0, s2 = (m.draw_shift(world, rng, s, 40_000, None) for s in ("S0", "S2"))
  h = lambda d: np.mean(m.shifts.routing_entropy(m.cluster_posterior(world, d["x"])))   # noqa: E731
  assert h(s2) > 2 * h(s0)          # the boundary shift moves mass to where the router is uncertain


def test_aggregate_only_calibration_fails_claim_one():
  """One temperature on the soft aggregate calibrates the source on average, not the shifted sets: its ECE moves
  by far more than claim 1's 0.005 under the boundary shift, while the hard arm's stays put."""
  m = _method()
  world = m.make_world(3, sep=2.0, slope=1.0)
  rng = np.random.default_rng(3)
  draw = m.draw_source(world)
  train, val = draw(rng, 100_000), draw(rng, 50_000)
  tests = {s: m.draw_shift(world, rng, s, 100_000, (0.7, 0.1, 0.1, 0.1)) for s in ("S0", "S2")}
  arms = m.fit_theory(world, train, val)
  ece = {}
  for s, t in tests.items():
    for a, p in m.theory_probs(world, arms, t["x"]).items():
      ece[a, s] = float(m.metrics.ece(*m.metrics.top_label(p, t["y"])))
  assert ece["soft_global_ts", "S2"] - ece["soft_global_ts", "S0"] > 0.005
  assert abs(ece["hard", "S2"] - ece["hard", "S0"]) < 0.005


@pytest.mark.parametrize("override,match", [
    ({"data.sep": 0.0}, "data.sep=0.0 must be > 0"),
    ({"data.region_prior": (0.5, 0.5, 0.5, 0.5)}, "summing to 1"),
    ({"data.test_size": 10}, "must be >= 1000"),
    ({"eval.n_boot": 1}, "n_boot=1"),
])
def test_bad_config_is_a_clear_error(override, match):
  with pytest.raises(ConfigError, match=match):
    registry.load("moe_calibration").get_config("tiny", override)
