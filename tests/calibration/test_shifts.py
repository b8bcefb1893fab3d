"""Shift generators: density ratios against closed forms, rejection sampling against the target law."""

import numpy as np
import pytest
from scipy import stats

from jaxlab.calibration import shifts
from jaxlab.errors import ConfigError


def test_routing_entropy_closed_forms():
  g = np.array([[1.0, 0, 0, 0], [0.25] * 4, [0.5, 0.5, 0, 0]])
  np.testing.assert_allclose(shifts.routing_entropy(g), [0.0, 1.0, np.log(2) / np.log(4)], atol=1e-12)
  with pytest.raises(ConfigError, match="gates of shape"):
    shifts.routing_entropy(np.ones(4))


def test_region_prior_weights_and_errors():
  w = shifts.region_prior_weights(np.array([0, 1, 2, 3]), [0.25] * 4, [0.7, 0.1, 0.1, 0.1])
  np.testing.assert_allclose(w, [2.8, 0.4, 0.4, 0.4])
  with pytest.raises(ConfigError, match="probability vector"):
    shifts.region_prior_weights(np.array([0]), [0.5, 0.5], [0.9, 0.2])
  with pytest.raises(ConfigError, match="never draws"):
    shifts.region_prior_weights(np.array([0]), [1.0, 0.0], [0.5, 0.5])


def test_rejection_sample_follows_the_reweighted_law():
  """Source N(0, 1), weight = 1[x > 0] * x / 4 on [0, 4): the target density is x exp(-x^2/2) (Rayleigh(1))."""
  rng = np.random.default_rng(0)
  draw = lambda r, m: {"x": r.normal(size=m), "i": np.arange(m)}     # noqa: E731
  weight = lambda p: np.clip(p["x"], 0, 4) / 4                        # noqa: E731
  out = shifts.rejection_sample(rng, draw, weight, 20_000, w_max=1.0)
  assert out["x"].shape == (20_000,) and out["i"].shape == (20_000,)
  assert stats.kstest(out["x"], stats.rayleigh.cdf).pvalue > 0.01
  # acceptance = E[w] = E[x 1(x > 0)] / 4 = 1 / (4 sqrt(2 pi)) (the clip at 4 is negligible)
  assert abs(out["accept_rate"] - 1 / (4 * np.sqrt(2 * np.pi))) < 0.005


def test_rejection_sample_region_prior_reaches_the_target_frequencies():
  rng = np.random.default_rng(1)
  draw = lambda r, m: {"c": r.integers(0, 4, m)}                      # noqa: E731
  target = np.array([0.7, 0.1, 0.1, 0.1])
  out = shifts.rejection_sample(rng, draw, lambda p: shifts.region_prior_weights(p["c"], [0.25] * 4, target),
                                50_000, w_max=2.8)
  freq = np.bincount(out["c"], minlength=4) / 50_000
  np.testing.assert_allclose(freq, target, atol=0.01)


def test_rejection_sample_bad_inputs():
  rng = np.random.default_rng(2)
  draw = lambda r, m: {"x": r.normal(size=m)}                         # noqa: E731
  with pytest.raises(ConfigError, match=r"weights must lie in \[0, w_max"):
    shifts.rejection_sample(rng, draw, lambda p: np.abs(p["x"]), 10, w_max=0.5)
  with pytest.raises(ConfigError, match="accepted in 3 rounds"):
    shifts.rejection_sample(rng, draw, lambda p: np.zeros(len(p["x"])), 10, w_max=1.0, max_rounds=3)
  with pytest.raises(ConfigError, match="n >= 1"):
    shifts.rejection_sample(rng, draw, lambda p: p["x"], 0, w_max=1.0)
