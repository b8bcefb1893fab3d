"""Gaussian PAC-Bayes: the KL between Gaussians and the McAllester and Catoni bounds on a [0, 1] loss.

With prior P (chosen before the data, e.g. centred at the pretrained weights) and any posterior Q, with
probability >= 1 - delta over an i.i.d. sample of size n, for a loss in [0, 1]:

* McAllester (in Maurer's form, McAllester 1999; Maurer 2004):
  R(Q) <= R_hat(Q) + sqrt((KL(Q || P) + ln(2 sqrt(n) / delta)) / (2 n));
* Catoni (2007, Th. 1.2.6), for a fixed C > 0:
  R(Q) <= (1 - exp(-C R_hat(Q) - (KL(Q || P) + ln(1 / delta)) / n)) / (1 - exp(-C)).

R(Q) and R_hat(Q) are the Gibbs risks (expected loss of a predictor drawn from Q) on the population and on
the sample. `gaussian_residual_loss` gives the Gibbs risk of the bounded loss 1 - exp(-r^2 / (2 tau^2)) in
closed form when the residual r is Gaussian under Q (linear models with Gaussian Q).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def gaussian_kl(mu_q, cov_q, mu_p, cov_p):
  """KL(N(mu_q, cov_q) || N(mu_p, cov_p)) for full covariances; leading axes broadcast (batched).

  0.5 * [tr(cov_p^-1 cov_q) + (mu_p - mu_q)^T cov_p^-1 (mu_p - mu_q) - k + ln det cov_p - ln det cov_q],
  computed through Cholesky factors (both covariances must be positive definite).

  Args:
    mu_q, mu_p: (..., k) means.
    cov_q, cov_p: (..., k, k) covariances.
  """
  from jax.scipy.linalg import solve_triangular  # pylint: disable=g-import-not-at-top
  mu_q, mu_p, cov_q, cov_p = map(jnp.asarray, (mu_q, mu_p, cov_q, cov_p))
  k = mu_q.shape[-1]
  batch = jnp.broadcast_shapes(mu_q.shape[:-1], mu_p.shape[:-1], cov_q.shape[:-2], cov_p.shape[:-2])
  mu_q, mu_p = (jnp.broadcast_to(m, batch + (k,)) for m in (mu_q, mu_p))
  cov_q, cov_p = (jnp.broadcast_to(c, batch + (k, k)) for c in (cov_q, cov_p))
  lp = jnp.linalg.cholesky(cov_p)
  lq = jnp.linalg.cholesky(cov_q)
  solve = lambda b: solve_triangular(lp, b, lower=True)  # noqa: E731  (L_p^-1 b)
  trace = jnp.sum(solve(lq) ** 2, axis=(-2, -1))               # ||L_p^-1 L_q||_F^2 = tr(cov_p^-1 cov_q)
  diff = solve((mu_p - mu_q)[..., None])[..., 0]
  maha = jnp.sum(diff ** 2, axis=-1)
  logdet = lambda l: 2.0 * jnp.sum(jnp.log(jnp.diagonal(l, axis1=-2, axis2=-1)), axis=-1)  # noqa: E731
  return 0.5 * (trace + maha - k + logdet(lp) - logdet(lq))


def diag_gaussian_kl(mu_q, var_q, mu_p, var_p):
  """KL between diagonal Gaussians, summed over the last axis (variances, not standard deviations)."""
  mu_q, var_q, mu_p, var_p = map(jnp.asarray, (mu_q, var_q, mu_p, var_p))
  return 0.5 * jnp.sum(var_q / var_p + (mu_p - mu_q) ** 2 / var_p - 1.0 + jnp.log(var_p) - jnp.log(var_q), axis=-1)


def _check(n, delta):
  if not isinstance(n, jax.core.Tracer) and np.any(np.asarray(n) < 1):
    raise ValueError(f"PAC-Bayes bound: sample size n={n} must be >= 1")
  if not 0.0 < delta < 1.0:
    raise ValueError(f"PAC-Bayes bound: delta={delta} must be in (0, 1)")


def mcallester_bound(emp_risk, kl, n, delta: float = 0.05):
  """McAllester's bound (Maurer's ln(2 sqrt(n) / delta) form) on the Gibbs risk of a loss in [0, 1]."""
  _check(n, delta)
  n = jnp.asarray(n, jnp.float32)
  return jnp.asarray(emp_risk) + jnp.sqrt((jnp.asarray(kl) + jnp.log(2.0 * jnp.sqrt(n) / delta)) / (2.0 * n))


def catoni_bound(emp_risk, kl, n, delta: float = 0.05, c: float = 1.0):
  """Catoni's bound for a fixed C > 0 (chosen before the data) on the Gibbs risk of a loss in [0, 1]."""
  _check(n, delta)
  if not c > 0:
    raise ValueError(f"catoni_bound: c={c} must be > 0")
  n = jnp.asarray(n, jnp.float32)
  inner = c * jnp.asarray(emp_risk) + (jnp.asarray(kl) + math.log(1.0 / delta)) / n
  return -jnp.expm1(-inner) / -math.expm1(-c)


def gaussian_residual_loss(mean, var, tau: float):
  """E[1 - exp(-r^2 / (2 tau^2))] for r ~ N(mean, var): 1 - sqrt(tau^2 / (tau^2 + var)) exp(-mean^2 / (2 (tau^2 + var))).

  The loss is in [0, 1), so the bounds above apply; tau sets the residual scale at which it saturates.
  """
  s = tau ** 2 + jnp.asarray(var)
  return 1.0 - jnp.sqrt(tau ** 2 / s) * jnp.exp(-jnp.asarray(mean) ** 2 / (2.0 * s))
