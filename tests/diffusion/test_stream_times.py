"""Two-stream training-time samplers (Latent Forcing's sample modes): branch structure, distributions, weights."""

import jax
import numpy as np
import pytest
from scipy import special, stats

from jaxlab.diffusion import flow
from jaxlab.diffusion.stream_times import MODES, StreamTimes
from jaxlab.errors import ConfigError

N = 20000


def draw(**kw):
  t, w = StreamTimes(**kw)(jax.random.key(0), N)
  return {k: np.asarray(v) for k, v in t.items()}, {k: np.asarray(v) for k, v in w.items()}


def test_cascaded_noised_is_a_mixture_of_latent_and_pixel_steps():
  t, w = draw(mode="cascaded_noised")
  lat = w["latent"] == 1
  assert np.all(w["pixel"] == 1 - w["latent"])                         # exactly one stream is trained
  assert abs(lat.mean() - 0.4) < 4 * np.sqrt(0.24 / N)                 # p_latent
  assert np.all(t["pixel"][lat] == 0.0)                                # pixels are pure noise on latent steps
  # latent steps: logit(t_lat) ~ N(-1.2, 1.0)
  assert stats.kstest(special.logit(t["latent"][lat]), "norm", args=(-1.2, 1.0)).pvalue > 1e-3
  # pixel steps: t_lat ~ U(0.75, 1); t_pix is the logit-normal(-0.4, 0.8) / U(0, 0.5) mixture
  assert t["latent"][~lat].min() >= 0.75 and stats.kstest(t["latent"][~lat], "uniform", args=(0.75, 0.25)).pvalue > 1e-3
  grid = np.linspace(0.01, 0.99, 50)
  want = 0.9 * stats.norm.cdf(special.logit(grid), -0.4, 0.8) + 0.1 * np.clip(grid / 0.5, 0, 1)
  got = np.searchsorted(np.sort(t["pixel"][~lat]), grid) / (~lat).sum()
  assert np.abs(got - want).max() < 0.03


def test_other_modes():
  t, w = draw(mode="cascaded")
  assert np.all(t["latent"][w["pixel"] == 1] == 1.0)                   # a clean latent on pixel steps
  t, w = draw(mode="shifted_aligned", alpha=9.0)
  np.testing.assert_allclose(t["latent"], flow.shift(t["pixel"], 9.0), rtol=1e-6)
  assert np.all(w["pixel"] == 1) and np.all(w["latent"] == 1)
  t, _ = draw(mode="independent")
  for s in ("pixel", "latent"):   # the inverse of t = shift(u, s) is u = t / (s - (s - 1) t): uniform again
    u = t[s] / (0.5 - (0.5 - 1) * t[s])
    assert stats.kstest(u, "uniform").pvalue > 1e-3
  assert abs(np.corrcoef(t["pixel"], t["latent"])[0, 1]) < 0.05
  t, w = draw(mode="pixel_only")
  assert np.all(t["latent"] == 0) and np.all(w["latent"] == 0) and np.all(w["pixel"] == 1)
  t, w = draw(mode="latent_only")
  assert np.all(t["pixel"] == 0) and np.all(w["pixel"] == 0) and np.all(w["latent"] == 1)
  assert set(MODES) == {"cascaded_noised", "cascaded", "shifted_aligned", "independent", "pixel_only",
                        "latent_only"}


def test_bad_settings_are_clear_errors():
  with pytest.raises(ConfigError, match="is not one of"):
    StreamTimes(mode="dino_first")
  with pytest.raises(ConfigError, match="p_latent"):
    StreamTimes(p_latent=1.5)
  with pytest.raises(ConfigError, match="different names"):
    StreamTimes(pixel="x", latent="x")
