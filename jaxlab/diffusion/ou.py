"""The Ornstein-Uhlenbeck forward process dx = -x dt + sqrt(2) dW and its time grid.

Marginal given x_0: x_t = alpha_t x_0 + sigma_t z with alpha_t = e^{-t}, sigma_t^2 = 1 - e^{-2t}, z ~ N(0, I).
Transition s < t: x_t | x_s ~ N(e^{-(t - s)} x_s, (1 - e^{-2(t - s)}) I). The stationary law is N(0, I).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError


def ou_coeffs(t) -> tuple[jax.Array, jax.Array]:
  """Returns (alpha_t, sigma_t^2) = (e^{-t}, 1 - e^{-2t}) for times t (any shape, float)."""
  t = jnp.asarray(t, jnp.float32)
  return jnp.exp(-t), -jnp.expm1(-2.0 * t)


def ou_transition(s, t) -> tuple[jax.Array, jax.Array]:
  """Returns (a, v) with x_t | x_s ~ N(a x_s, v I) for s <= t: a = e^{-(t - s)}, v = 1 - e^{-2(t - s)}."""
  return ou_coeffs(jnp.asarray(t, jnp.float32) - jnp.asarray(s, jnp.float32))


def ou_sample(key: jax.Array, x0_bd: jax.Array, t) -> tuple[jax.Array, jax.Array]:
  """Draws x_t given x_0 from the closed-form marginal.

  Args:
    key: PRNG key.
    x0_bd: (batch, dim) float32 clean points.
    t: scalar time or (batch,) times.

  Returns:
    (x_t (batch, dim), z (batch, dim)): the noisy points and the standard normal noise used.
  """
  alpha, sigma2 = ou_coeffs(t)
  alpha, sigma = jnp.reshape(alpha, (-1, 1)), jnp.reshape(jnp.sqrt(sigma2), (-1, 1))
  z = jax.random.normal(key, x0_bd.shape, x0_bd.dtype)
  return alpha * x0_bd + sigma * z, z


def geometric_grid(t_max: float, t_min: float, steps: int) -> np.ndarray:
  """Decreasing times t_max = t_0 > t_1 > ... > t_steps = t_min, geometrically spaced (float64, steps + 1).

  Raises:
    ConfigError: unless 0 < t_min < t_max and steps >= 1.
  """
  if not (0.0 < t_min < t_max) or steps < 1:
    raise ConfigError(f"geometric_grid needs 0 < t_min < t_max and steps >= 1, got t_max={t_max}, "
                      f"t_min={t_min}, steps={steps}")
  return np.geomspace(t_max, t_min, steps + 1)
