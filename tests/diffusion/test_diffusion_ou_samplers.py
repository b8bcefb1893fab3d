"""OU forward process vs its closed form (and an independent SDE simulation); samplers on Gaussian data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.diffusion import ou, samplers
from jaxlab.diffusion.score import EmpiricalScore
from jaxlab.errors import ConfigError


def test_coefficients_closed_form_and_semigroup():
  t = np.array([1e-3, 0.1, 1.0, 6.0])
  a, s2 = ou.ou_coeffs(t)
  np.testing.assert_allclose(np.asarray(a), np.exp(-t), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(s2), 1 - np.exp(-2 * t), rtol=1e-5)
  # x_t = a(s,t) x_s + noise: alpha_t = a alpha_s, sigma_t^2 = a^2 sigma_s^2 + v
  s = 0.3
  ats, vts = ou.ou_transition(s, t[1:])
  a_s, s2_s = ou.ou_coeffs(s)
  np.testing.assert_allclose(np.asarray(ats * a_s), np.asarray(a[1:]), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(ats ** 2 * s2_s + vts), np.asarray(s2[1:]), rtol=1e-5)


def test_marginal_matches_independent_sde_simulation():
  # Euler-Maruyama of dx = -x dt + sqrt(2) dW in numpy (independent of the library), vs the closed form and
  # vs ou_sample; 20000 paths, t = 0.5.
  rng = np.random.default_rng(0)
  x0 = np.array([2.0, -1.0])
  n, t, steps = 20000, 0.5, 500
  dt = t / steps
  x = np.tile(x0, (n, 1))
  for _ in range(steps):
    x = x - x * dt + np.sqrt(2 * dt) * rng.normal(size=x.shape)
  mean_ref, var_ref = np.exp(-t) * x0, 1 - np.exp(-2 * t)
  np.testing.assert_allclose(x.mean(0), mean_ref, atol=0.03)
  np.testing.assert_allclose(x.var(0), var_ref, rtol=0.05)
  xt, z = ou.ou_sample(jax.random.key(1), jnp.tile(jnp.asarray(x0, jnp.float32), (n, 1)), t)
  np.testing.assert_allclose(np.asarray(xt).mean(0), mean_ref, atol=0.03)
  np.testing.assert_allclose(np.asarray(xt).var(0), var_ref, rtol=0.05)
  np.testing.assert_allclose(np.asarray(xt), np.exp(-t) * x0 + np.sqrt(var_ref) * np.asarray(z), atol=1e-5)


def _gaussian_denoiser(mu, s2):
  """Closed-form E[x0 | x_t] for x0 ~ N(mu, s2 I) under the OU process."""
  def denoise(x, t):
    a, v = ou.ou_coeffs(t)
    return mu + a * s2 / (a ** 2 * s2 + v) * (x - a * mu)
  return denoise


def _exp_integrator_variance(s2, grid):
  """Exact output variance of the DDPM-posterior sampler on N(mu, s2) data with the exact denoiser (1-D, float64):
  every step is affine in x plus Gaussian noise, so the variance follows a scalar recursion."""
  c = lambda t: (np.exp(-t), 1 - np.exp(-2 * t))  # noqa: E731
  var = 1.0
  for t, s in zip(grid[:-1], grid[1:]):
    (at, vt), (as_, vs), (a, v) = c(t), c(s), c(t - s)
    gain = at * s2 / (at ** 2 * s2 + vt)                    # d E[x0|x_t] / dx
    slope = as_ * v / vt * gain + a * vs / vt
    var = slope ** 2 * var + vs * v / vt
  at, vt = c(grid[-1])
  return (at * s2 / (at ** 2 * s2 + vt)) ** 2 * var


@pytest.mark.parametrize("which", ["exponential", "euler_maruyama"])
def test_samplers_recover_gaussian_data(which):
  mu, s2 = jnp.asarray([1.5, -0.5, 0.0]), 0.36
  den = _gaussian_denoiser(mu, s2)
  x_t = jax.random.normal(jax.random.key(0), (8000, 3))
  if which == "exponential":
    # coarse grid: the plug-in posterior step under-disperses by a known amount (exact recursion) ...
    grid = ou.geometric_grid(6.0, 1e-3, 40)
    out = np.asarray(jax.jit(lambda x: samplers.exponential_integrator(den, x, grid, jax.random.key(1)))(x_t))
    expected = _exp_integrator_variance(s2, grid)
    assert expected < 0.95 * s2
    np.testing.assert_allclose(out.var(0), expected, rtol=0.05)
    np.testing.assert_allclose(out.mean(0), np.asarray(mu), atol=0.04)
    # ... which vanishes as the grid is refined
    assert _exp_integrator_variance(s2, ou.geometric_grid(6.0, 1e-3, 800)) == pytest.approx(s2, rel=0.02)
    return
  else:
    grid = ou.geometric_grid(6.0, 1e-3, 400)
    sc = lambda x, t: (ou.ou_coeffs(t)[0] * den(x, t) - x) / ou.ou_coeffs(t)[1]  # noqa: E731
    out = jax.jit(lambda x: samplers.euler_maruyama(sc, x, grid, jax.random.key(1), denoise=den))(x_t)
    tol = 0.08
  out = np.asarray(out)
  np.testing.assert_allclose(out.mean(0), np.asarray(mu), atol=0.04)
  np.testing.assert_allclose(out.var(0), s2, rtol=tol)


def test_kde_sampler_memorises_training_points():
  train = jnp.asarray(np.random.default_rng(0).normal(size=(6, 4)) * 3, jnp.float32)
  x_t = jax.random.normal(jax.random.key(0), (64, 4))
  model = EmpiricalScore(train, chunk=4)

  @jax.jit
  def run(x):
    raw = samplers.exponential_integrator(model.denoise, x, ou.geometric_grid(6.0, 1e-3, 50), jax.random.key(2),
                                          final_denoise=False)
    return raw, model.denoise(raw, 1e-3)

  raw, out = run(x_t)
  d = np.linalg.norm(np.asarray(out)[:, None] - np.asarray(train)[None], axis=-1).min(1)
  assert d.max() < 1e-3
  # without the final denoise the samples are still noisy at sigma ~ sqrt(2e-3)
  d = np.linalg.norm(np.asarray(raw)[:, None] - np.asarray(train)[None], axis=-1).min(1)
  assert 0.01 < d.mean() < 0.3


def test_bad_grids_are_clear_errors():
  with pytest.raises(ConfigError, match="t_min < t_max"):
    ou.geometric_grid(1e-3, 6.0, 10)
  with pytest.raises(ConfigError, match="decreasing"):
    samplers.exponential_integrator(lambda x, t: x, jnp.zeros((2, 2)), np.array([0.1, 0.5]), jax.random.key(0))
