"""Positive random features for the Gaussian kernel, with importance sampling.

For unit bandwidth, exp(-||x - y||^2 / 2) = E_{w ~ N(0, I)}[phi_w(x) phi_w(y)] with the positive features
phi_w(x) = exp(w.x - ||x||^2) (Choromanski et al., "Rethinking attention with Performers", 2021).
Drawing w ~ N(0, sigma2 I) instead and weighting each feature by the density ratio
rho(w) = N(w; 0, I) / N(w; 0, sigma2 I) = sigma2^(d/2) exp(-||w||^2 (1 - 1/sigma2) / 2) keeps the estimate
unbiased; sigma2 is the "temperature" of the importance-sampling proposal (SWING, Manenti et al. 2026).
Features are returned in log space (they overflow easily): log phi_r(x) = w_r.x - ||x||^2
+ (log rho(w_r) - log m) / 2, so that sum_r phi_r(x) phi_r(y) estimates the kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gaussian_omegas(key: jax.Array, m: int, d: int, sigma2: float = 1.0, orthogonal: bool = True):
  """Frequencies w (m, d) ~ N(0, sigma2 I) and their log importance weights (m,).

  Args:
    key: PRNG key.
    m: number of features.
    d: input dimension.
    sigma2: variance of the proposal (1.0 = plain positive random features, weights all 1).
    orthogonal: block-orthogonal frequencies (orthogonal within blocks of d rows, chi-distributed norms),
      which keeps each w marginally N(0, sigma2 I) and lowers the variance.

  Returns:
    (omega (m, d) float32, log_weight (m,) float32).
  """
  k1, k2 = jax.random.split(key)
  if orthogonal:
    blocks = -(-m // d)
    g = jax.random.normal(k1, (blocks, d, d))
    q, _ = jnp.linalg.qr(g)
    norms = jnp.linalg.norm(jax.random.normal(k2, (blocks, d, d)), axis=-1)
    omega = (q * norms[:, :, None]).reshape(blocks * d, d)[:m]
  else:
    omega = jax.random.normal(k1, (m, d))
  omega = omega * jnp.sqrt(sigma2)
  sq = jnp.sum(omega ** 2, axis=-1)
  log_weight = 0.5 * d * jnp.log(sigma2) - 0.5 * sq * (1.0 - 1.0 / sigma2)
  return omega.astype(jnp.float32), log_weight.astype(jnp.float32)


def log_positive_features(x_nd: jax.Array, omega: jax.Array, log_weight: jax.Array) -> jax.Array:
  """log phi (N, m) with sum_r exp(log phi_r(x) + log phi_r(y)) ~ exp(-||x - y||^2 / 2) (unit bandwidth).

  Rescale x by 1 / bandwidth first for other bandwidths.
  """
  m = omega.shape[0]
  return (x_nd @ omega.T - jnp.sum(x_nd ** 2, -1, keepdims=True)
          + 0.5 * (log_weight - jnp.log(m))[None, :])
