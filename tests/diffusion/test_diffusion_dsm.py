"""DSM-trained score network: learns the closed-form Gaussian denoiser; same interface as the empirical score."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.diffusion import dsm, ou
from jaxlab.errors import ConfigError


def test_dsm_learns_gaussian_score():
  s2 = jnp.asarray([0.25, 2.0])
  train = jax.random.normal(jax.random.key(0), (2048, 2)) * jnp.sqrt(s2)
  model, losses = dsm.train_dsm(jax.random.key(1), train, width=48, depth=2, steps=500, batch=128,
                                learning_rate=3e-3, t_min=0.05, t_max=3.0)
  # Bayes-optimal value of the preconditioned loss: with y = x_t / a = x0 + s z (s^2 = v / a^2) the posterior
  # variance of x0 per coordinate is s2 s^2 / (s2 + s^2), divided by c_out^2 = s^2 sd^2 / (s^2 + sd^2) and averaged
  # over log-uniform t and the two coordinates.
  sd = float(np.sqrt(np.mean(np.asarray(train) ** 2)))
  ts = np.exp(np.linspace(np.log(0.05), np.log(3.0), 2001))
  ss = (1 - np.exp(-2 * ts)) / np.exp(-2 * ts)
  post = np.asarray(s2)[None] * ss[:, None] / (np.asarray(s2)[None] + ss[:, None])
  optimum = np.mean(post / (ss * sd ** 2 / (ss + sd ** 2))[:, None])
  final = float(np.mean(losses[-200:]))
  assert optimum * 0.9 < final < optimum * 1.15, (final, optimum)
  x = jax.random.normal(jax.random.key(2), (256, 2))
  for t in (0.2, 1.0):
    a, v = ou.ou_coeffs(t)
    ref = (a * s2 / (a ** 2 * s2 + v)) * x            # E[x0 | x_t] for x0 ~ N(0, diag(s2))
    err = np.sqrt(np.mean((np.asarray(model.denoise(x, t)) - np.asarray(ref)) ** 2))
    assert err < 0.15, (t, err)
    np.testing.assert_allclose(np.asarray(model.score(x, t)),
                               np.asarray((a * model.denoise(x, t) - x) / v), rtol=1e-3, atol=1e-3)


def test_bad_arguments():
  with pytest.raises(ConfigError, match="t_min < t_max"):
    dsm.train_dsm(jax.random.key(0), jnp.zeros((4, 2)), steps=1, t_min=1.0, t_max=0.5)
