"""Reverse-time samplers for the OU process, started from N(0, I) at t_max and stopped early at t_min.

* `exponential_integrator`: from t to s < t, draws x_s from the Gaussian posterior q(x_s | x_t, x_0) of the forward
  process with x_0 replaced by the model's denoiser D(x_t, t) (the DDPM-posterior step, exact for the OU
  drift). With a, v = e^{-(t-s)}, 1 - e^{-2(t-s)}:

      mean = alpha_s v / sigma_t^2 * D(x_t, t) + a sigma_s^2 / sigma_t^2 * x_t,   var = sigma_s^2 v / sigma_t^2.

* `euler_maruyama`: the reverse SDE dx = [x + 2 score(x, t)] dt + sqrt(2) dW_bar, one Euler step per grid
  interval.

Both run as one `lax.scan` over the grid (a decreasing array of times, e.g. `ou.geometric_grid`) with noise
`fold_in(key, i)` at step i, and optionally finish with the Tweedie denoise E[x_0 | x_{t_min}].
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.diffusion.ou import ou_coeffs, ou_transition
from jaxlab.errors import ConfigError

Fn = Callable[[jax.Array, jax.Array], jax.Array]


def _pairs(times):
  times = np.asarray(times, np.float64)
  if times.ndim != 1 or times.size < 2 or not np.all(np.diff(times) < 0) or times[-1] <= 0:
    raise ConfigError(f"sampler grid must be a decreasing 1-D array of >= 2 positive times, got {times}")
  return jnp.asarray(times[:-1], jnp.float32), jnp.asarray(times[1:], jnp.float32), float(times[-1])


def exponential_integrator(denoise: Fn, x_bd: jax.Array, times, key: jax.Array, *,
                           final_denoise: bool = True) -> jax.Array:
  """DDPM-posterior exponential-integrator sampler.

  Args:
    denoise: (x (batch, dim), t scalar) -> E[x_0 | x_t = x] (batch, dim).
    x_bd: (batch, dim) float32 start points at times[0] (usually N(0, I) draws).
    times: decreasing times t_0 > ... > t_K > 0 (numpy, K + 1 entries).
    key: PRNG key for the step noise.
    final_denoise: return D(x_{t_K}, t_K) (Tweedie) instead of x_{t_K}.

  Returns:
    (batch, dim) float32 samples.
  """
  ts, ss, t_end = _pairs(times)

  def step(x, inp):
    i, t, s = inp
    x0 = denoise(x, t)
    alpha_s, s2_s = ou_coeffs(s)
    _, s2_t = ou_coeffs(t)
    a, v = ou_transition(s, t)
    mean = (alpha_s * v / s2_t) * x0 + (a * s2_s / s2_t) * x
    z = jax.random.normal(jax.random.fold_in(key, i), x.shape, x.dtype)
    return mean + jnp.sqrt(s2_s * v / s2_t) * z, None

  x, _ = jax.lax.scan(step, x_bd, (jnp.arange(ts.shape[0]), ts, ss))
  return denoise(x, jnp.float32(t_end)) if final_denoise else x


def euler_maruyama(score: Fn, x_bd: jax.Array, times, key: jax.Array, *, denoise: Fn | None = None) -> jax.Array:
  """Euler-Maruyama on the reverse OU SDE.

  Args:
    score: (x (batch, dim), t scalar) -> grad log p_t(x) (batch, dim).
    x_bd: (batch, dim) float32 start points at times[0].
    times: decreasing times (numpy, K + 1 entries).
    key: PRNG key.
    denoise: if given, the output is denoise(x_{t_K}, t_K) (Tweedie) instead of x_{t_K}.

  Returns:
    (batch, dim) float32 samples.
  """
  ts, ss, t_end = _pairs(times)

  def step(x, inp):
    i, t, s = inp
    h = t - s
    z = jax.random.normal(jax.random.fold_in(key, i), x.shape, x.dtype)
    return x + h * (x + 2.0 * score(x, t)) + jnp.sqrt(2.0 * h) * z, None

  x, _ = jax.lax.scan(step, x_bd, (jnp.arange(ts.shape[0]), ts, ss))
  return denoise(x, jnp.float32(t_end)) if denoise is not None else x
