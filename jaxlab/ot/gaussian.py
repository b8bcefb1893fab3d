"""Optimal transport between Gaussians (Bures-Wasserstein geometry) in JAX.

All functions follow the dtype of their inputs. Covariances of nearly singular features (few samples per
client, high dimension) make matrix square roots ill-conditioned in float32: call them on float64 arrays
inside `with jax.enable_x64(True):` (see `jaxlab.federated.server`), as the official SLOT-Align code does on
the host with numpy float64.

Equations (C^{1/2} is the PSD square root):
* W2^2(N(m0, C0), N(m1, C1)) = |m0 - m1|^2 + tr C0 + tr C1 - 2 tr (C0^{1/2} C1 C0^{1/2})^{1/2}.
* Barycenter of N(m_k, C_k) with weights w_k (Agueh-Carlier; fixed point of Alvarez-Esteban et al. 2016):
  m = sum_k w_k m_k and S <- S^{-1/2} (sum_k w_k (S^{1/2} C_k S^{1/2})^{1/2})^2 S^{-1/2}.
* Monge map N(m0, C0) -> N(m1, C1): T(x) = A x + b with
  A = C0^{-1/2} (C0^{1/2} C1 C0^{1/2})^{1/2} C0^{-1/2} (symmetric PSD), b = m1 - A m0.
* McCann (geodesic) interpolation at strength tau in [0, 1]: T_tau(x) = ((1 - tau) I + tau A) x + tau b.
* Ledoit-Wolf shrinkage (Ledoit & Wolf 2004, the estimator of `sklearn.covariance.LedoitWolf`) and an
  eigenvalue floor spd_eps * max(1, tr C / d).

`bures_barycenter(..., backend="ott")` delegates to ott-jax's `costs.Bures.barycenter` (optional
dependency, `pip install -e ".[ot]"`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import DataError


def symmetrize(c: jax.Array) -> jax.Array:
  """(C + C^T) / 2 over the last two axes. c: (..., d, d)."""
  return 0.5 * (c + jnp.swapaxes(c, -1, -2))


def _eig_floor(w: jax.Array, rel: float | None) -> jax.Array:
  """Clips eigenvalues (..., d) at rel * max eigenvalue (rel defaults to the dtype's eps)."""
  rel = float(jnp.finfo(w.dtype).eps) if rel is None else rel
  top = jnp.max(w, axis=-1, keepdims=True)
  return jnp.maximum(w, rel * jnp.maximum(top, jnp.finfo(w.dtype).tiny))


def sqrtm_psd(c: jax.Array, rel_floor: float | None = None) -> tuple[jax.Array, jax.Array]:
  """Square root and inverse square root of a symmetric PSD matrix via eigh.

  Args:
    c: (..., d, d) symmetric positive semi-definite matrices (symmetrised first).
    rel_floor: eigenvalues below rel_floor * max eigenvalue are raised to it before the roots (default:
      the dtype's machine epsilon), which keeps the inverse root finite for singular inputs.

  Returns:
    (c^{1/2}, c^{-1/2}), each (..., d, d), symmetric.
  """
  w, v = jnp.linalg.eigh(symmetrize(c))
  w = _eig_floor(w, rel_floor)
  s = jnp.sqrt(w)
  vt = jnp.swapaxes(v, -1, -2)
  return symmetrize((v * s[..., None, :]) @ vt), symmetrize((v / s[..., None, :]) @ vt)


def sqrtm(c: jax.Array) -> jax.Array:
  """PSD square root (..., d, d) -> (..., d, d) (negative eigenvalues from round-off are clipped to 0)."""
  w, v = jnp.linalg.eigh(symmetrize(c))
  return symmetrize((v * jnp.sqrt(jnp.maximum(w, 0.0))[..., None, :]) @ jnp.swapaxes(v, -1, -2))


def spd_floor(c: jax.Array, spd_eps: float = 1e-8) -> jax.Array:
  """Symmetrises c and raises its eigenvalues to at least spd_eps * max(1, tr(c) / d).

  This is the official code's guard against singular Ledoit-Wolf covariances (spd_eps = 1e-8).

  Args:
    c: (..., d, d).
    spd_eps: relative floor.

  Returns:
    (..., d, d) symmetric positive definite.
  """
  d = c.shape[-1]
  w, v = jnp.linalg.eigh(symmetrize(c))
  floor = spd_eps * jnp.maximum(1.0, jnp.trace(c, axis1=-2, axis2=-1) / d)
  w = jnp.maximum(w, floor[..., None])
  return symmetrize((v * w[..., None, :]) @ jnp.swapaxes(v, -1, -2))


def ledoit_wolf(x: jax.Array, mask: jax.Array | None = None, spd_eps: float | None = 1e-8
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Ledoit-Wolf shrunk covariance (not assuming centred data), optionally over masked rows.

  Matches `sklearn.covariance.LedoitWolf(assume_centered=False)`: empirical covariance S of the centred
  rows (divided by n), mu = tr(S) / d, shrinkage s = min(beta, delta) / delta with
  delta = |S - mu I|_F^2 / d and beta = (sum_i |x_i x_i^T - S|_F^2 / n^2) / d, and C = (1 - s) S + s mu I.

  Args:
    x: (n, d) features (padded rows allowed when `mask` is given).
    mask: optional (n,) 0/1 weights selecting the valid rows (at least 2).
    spd_eps: eigenvalue floor of `spd_floor` (None: no floor).

  Returns:
    (mean (d,), cov (d, d), shrinkage ()).
  """
  return _ledoit_wolf(x, mask, spd_eps)


@functools.partial(jax.jit, static_argnums=(2,))
def _ledoit_wolf(x, mask, spd_eps):
  n_rows, d = x.shape
  m = jnp.ones((n_rows,), x.dtype) if mask is None else mask.astype(x.dtype)
  n = jnp.maximum(jnp.sum(m), 1.0)
  mean = (m @ x) / n
  xc = (x - mean) * m[:, None]
  emp = xc.T @ xc / n
  mu = jnp.trace(emp) / d
  delta = jnp.sum((emp - mu * jnp.eye(d, dtype=x.dtype)) ** 2) / d
  x2 = xc ** 2
  # beta = (sum_k |x_k x_k^T|_F^2 / n - |S|_F^2) / (n d): the spread of the rank-one terms around S.
  beta = (jnp.sum(x2.T @ x2) / n - jnp.sum(emp ** 2)) / (n * d)
  beta = jnp.minimum(beta, delta)
  shrink = jnp.where(delta > 0, beta / jnp.where(delta > 0, delta, 1.0), 0.0)
  cov = (1.0 - shrink) * emp + shrink * mu * jnp.eye(d, dtype=x.dtype)
  cov = symmetrize(cov) if spd_eps is None else spd_floor(cov, spd_eps)
  return mean, cov, shrink


class Barycenter(NamedTuple):
  """Result of `bures_barycenter`: mean (d,), cov (d, d), iterations run (), last relative change ()."""
  mean: jax.Array
  cov: jax.Array
  iterations: jax.Array
  change: jax.Array


def _check_gaussians(means, covs, weights):
  if means.ndim != 2 or covs.ndim != 3 or covs.shape != (means.shape[0], means.shape[1], means.shape[1]):
    raise DataError(f"need means (K, d) and covs (K, d, d); got {means.shape} and {covs.shape}")
  k = means.shape[0]
  if weights is None:
    return jnp.full((k,), 1.0 / k, means.dtype)
  weights = jnp.asarray(weights, means.dtype)
  if weights.shape != (k,):
    raise DataError(f"weights must have shape ({k},) (one per Gaussian), got {weights.shape}")
  if not isinstance(weights, jax.core.Tracer) and (np.any(np.asarray(weights) < 0) or not float(jnp.sum(weights)) > 0):
    raise DataError("barycenter weights must be non-negative with a positive sum")
  return weights / jnp.sum(weights)


def bures_barycenter(means: jax.Array, covs: jax.Array, weights: jax.Array | None = None, *,
                     num_iters: int = 1000, tol: float = 1e-7, backend: str = "jax") -> Barycenter:
  """Wasserstein-2 barycenter of Gaussians N(means[k], covs[k]) with the given weights.

  The covariance solves the fixed point of Alvarez-Esteban et al. (2016), iterated from the weighted
  arithmetic mean of the covariances under `lax.while_loop` until the relative Frobenius change of an
  iterate is below `tol` or `num_iters` iterations ran.

  Args:
    means: (K, d).
    covs: (K, d, d) symmetric positive definite.
    weights: (K,) non-negative (normalised here); default uniform.
    num_iters: maximum fixed-point iterations.
    tol: stopping tolerance on |S_{t+1} - S_t|_F / |S_t|_F.
    backend: "jax" (this implementation) or "ott" (ott-jax's `costs.Bures.barycenter`).

  Returns:
    Barycenter(mean (d,), cov (d, d), iterations, change).
  """
  means = jnp.asarray(means)
  covs = jnp.asarray(covs, means.dtype)
  w = _check_gaussians(means, covs, weights)
  mean = w @ means
  if backend == "ott":
    return _ott_barycenter(means, covs, w, num_iters, tol)
  if backend != "jax":
    raise ValueError(f"backend={backend!r}: use 'jax' or 'ott'")
  covs = symmetrize(covs)
  return _bary_cov(mean, covs, w, num_iters, tol)


@functools.partial(jax.jit, static_argnums=(3,))
def _bary_cov(mean, covs, w, num_iters, tol):
  def step(s):
    r, r_inv = sqrtm_psd(s)
    inner = sqrtm(r[None] @ covs @ r[None])  # (K, d, d)
    t = jnp.einsum("k,kij->ij", w, inner)
    return symmetrize(r_inv @ (t @ t) @ r_inv)

  def cond(carry):
    i, _, change = carry
    return (i < num_iters) & (change > tol)

  def body(carry):
    i, s, _ = carry
    s_new = step(s)
    change = jnp.linalg.norm(s_new - s) / jnp.maximum(jnp.linalg.norm(s), jnp.finfo(s.dtype).tiny)
    return i + 1, s_new, change

  s0 = jnp.einsum("k,kij->ij", w, covs)
  init = (jnp.zeros((), jnp.int32), s0, jnp.asarray(jnp.inf, s0.dtype))
  i, s, change = jax.lax.while_loop(cond, body, init)
  return Barycenter(mean, s, i, change)


def _ott_barycenter(means, covs, w, num_iters, tol) -> Barycenter:
  """ott-jax's fixed point. Runs exactly `num_iters` iterations: ott 0.6's early stop reads the difference
  slot of the not-yet-run block (-1) and stops after the first block, so min = max iterations is forced."""
  del tol
  from jaxlab.errors import require
  costs = require("ott.geometry.costs", "ot")
  k, d = means.shape
  xs = jnp.concatenate([means, covs.reshape(k, d * d)], axis=1)
  tight = 1e-12 if means.dtype == jnp.float64 else 1e-6
  out, diffs = costs.Bures(d).barycenter(
      w, xs, tolerance=0.0, sqrtm_kw=dict(threshold=tight, regularization=0.0),
      min_iterations=num_iters, max_iterations=num_iters, inner_iterations=1)
  cov = symmetrize(out[d:].reshape(d, d))
  return Barycenter(out[:d], cov, jnp.asarray(num_iters, jnp.int32), jnp.sqrt(diffs[-1]))


@jax.jit
def gaussian_map(m0: jax.Array, c0: jax.Array, m1: jax.Array, c1: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Closed-form optimal (Monge) map from N(m0, c0) to N(m1, c1): T(x) = A x + b.

  Args:
    m0, c0: source mean (d,) and SPD covariance (d, d).
    m1, c1: target mean (d,) and PSD covariance (d, d).

  Returns:
    (A (d, d) symmetric PSD, b (d,)), with A c0 A = c1 and A m0 + b = m1.
  """
  r, r_inv = sqrtm_psd(c0)
  a = symmetrize(r_inv @ sqrtm(r @ c1 @ r) @ r_inv)
  return a, m1 - a @ m0


def geodesic_map(a: jax.Array, b: jax.Array, tau) -> tuple[jax.Array, jax.Array]:
  """McCann interpolation of an affine map at strength tau: ((1 - tau) I + tau A, tau b).

  Args:
    a: (..., d, d); b: (..., d); tau: scalar in [0, 1] (0: identity, 1: the full map).

  Returns:
    (A_tau (..., d, d), b_tau (..., d)).
  """
  eye = jnp.eye(a.shape[-1], dtype=a.dtype)
  return (1.0 - tau) * eye + tau * a, tau * b


def partial_transport(x: jax.Array, a: jax.Array, b: jax.Array, tau) -> jax.Array:
  """Moves points a fraction tau along the Wasserstein geodesic: T_tau(x) = ((1 - tau) I + tau A) x + tau b.

  Args:
    x: (n, d) points; a: (d, d); b: (d,); tau: scalar in [0, 1].

  Returns:
    (n, d) transported points.
  """
  at, bt = geodesic_map(a, b, tau)
  return x @ at.T + bt


def push_forward(m: jax.Array, c: jax.Array, a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Image of N(m, c) under x -> A x + b: (A m + b (d,), A c A^T (d, d))."""
  return a @ m + b, a @ c @ a.T


@jax.jit
def bures_wasserstein2(m0: jax.Array, c0: jax.Array, m1: jax.Array, c1: jax.Array) -> jax.Array:
  """Squared 2-Wasserstein distance between N(m0, c0) and N(m1, c1) (scalar)."""
  r = sqrtm(c0)
  cross = jnp.trace(sqrtm(r @ c1 @ r))
  return jnp.sum((m0 - m1) ** 2) + jnp.trace(c0) + jnp.trace(c1) - 2.0 * cross


def pooled_pca(counts: jax.Array, means: jax.Array, scatters: jax.Array, var_keep: float = 0.99
               ) -> tuple[jax.Array, jax.Array, int]:
  """Global PCA from per-client sufficient statistics (no raw features needed).

  The pooled covariance is (sum_k S_k + sum_k n_k (m_k - m)(m_k - m)^T) / N with S_k the within-client
  scatter sum_i (x_i - m_k)(x_i - m_k)^T, m the pooled mean and N = sum_k n_k.

  Args:
    counts: (K,) samples per client.
    means: (K, d) client means.
    scatters: (K, d, d) within-client scatter matrices (not divided by n_k).
    var_keep: fraction of the pooled variance the kept components must explain (0 < var_keep <= 1).

  Returns:
    (pooled mean (d,), basis (d, r) with orthonormal columns by decreasing variance, r).
  """
  if not 0.0 < var_keep <= 1.0:
    raise ValueError(f"var_keep must be in (0, 1], got {var_keep}")
  counts = jnp.asarray(counts, means.dtype)
  n = jnp.sum(counts)
  mean = counts @ means / n
  dm = means - mean
  cov = (jnp.sum(scatters, axis=0) + jnp.einsum("k,ki,kj->ij", counts, dm, dm)) / n
  w, v = jnp.linalg.eigh(symmetrize(cov))
  w, v = w[::-1], v[:, ::-1]
  frac = np.cumsum(np.maximum(np.asarray(w), 0.0)) / max(float(np.sum(np.maximum(np.asarray(w), 0.0))), 1e-300)
  r = int(min(np.searchsorted(frac, var_keep - 1e-12) + 1, len(frac)))
  return mean, v[:, :r], r
