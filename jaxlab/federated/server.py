"""Server side of SLOT-Align: Bures-Wasserstein barycenter of the client Gaussians and one map per client.

All of it runs once, in float64 (`jax.enable_x64`), on the statistics the clients sent:
m_bar = sum_k w_k m_k, C_bar = the Bures fixed point, and per client the Monge map
T_k(x) = A_k x + b_k with A_k = C_k^{-1/2} (C_k^{1/2} C_bar C_k^{1/2})^{1/2} C_k^{-1/2}, b_k = m_bar - A_k m_k.
Weights w_k = n_k / sum n (official default) or uniform.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.federated.client import ClientStats
from jaxlab.ot import gaussian


class Alignment(NamedTuple):
  """Server output (float64 numpy): barycenter mean (d,), cov (d, d); maps a (K, d, d), b (K, d); weights (K,);
  fixed-point iterations and last relative change."""
  mean: np.ndarray
  cov: np.ndarray
  a: np.ndarray
  b: np.ndarray
  weights: np.ndarray
  iterations: int
  change: float


def align(stats: Sequence[ClientStats], weighting: str = "count", num_iters: int = 1000, tol: float = 1e-7,
          backend: str = "jax") -> Alignment:
  """Barycenter of the clients' Gaussians and each client's map onto it.

  Args:
    stats: K client summaries.
    weighting: "count" (n_k / sum n, the official default) or "equal".
    num_iters, tol: fixed-point budget and relative tolerance (official: 1000, 1e-7).
    backend: "jax" or "ott" (`jaxlab.ot.bures_barycenter`).

  Returns:
    Alignment.
  """
  if weighting not in ("count", "equal"):
    raise ValueError(f"weighting={weighting!r}: use 'count' or 'equal'")
  n = np.array([s.n for s in stats], np.float64)
  w = n / n.sum() if weighting == "count" else np.full(len(stats), 1.0 / len(stats))
  with jax.enable_x64(True):
    means = jnp.asarray(np.stack([s.mean for s in stats]), jnp.float64)
    covs = jnp.asarray(np.stack([s.cov for s in stats]), jnp.float64)
    bary = gaussian.bures_barycenter(means, covs, jnp.asarray(w), num_iters=num_iters, tol=tol, backend=backend)
    maps = jax.vmap(gaussian.gaussian_map, in_axes=(0, 0, None, None))(means, covs, bary.mean, bary.cov)
    return Alignment(np.asarray(bary.mean), np.asarray(bary.cov), np.asarray(maps[0]), np.asarray(maps[1]), w,
                     int(bary.iterations), float(bary.change))


def map_residuals(stats: Sequence[ClientStats], al: Alignment) -> tuple[np.ndarray, np.ndarray]:
  """Relative errors of each pushed-forward client Gaussian against the barycenter (float64).

  Returns:
    (|A_k m_k + b_k - m_bar| / max(|m_bar|, sqrt(tr C_bar)) (K,), |A_k C_k A_k^T - C_bar|_F / |C_bar|_F (K,)).
    The mean's error is relative to the barycenter's scale, so a barycenter centred at 0 (e.g. after the
    PCA option's centring) does not divide by ~0.
  """
  em, ec = [], []
  scale_m = max(float(np.linalg.norm(al.mean)), float(np.sqrt(np.trace(al.cov))), 1e-300)
  for k, s in enumerate(stats):
    m = al.a[k] @ s.mean + al.b[k]
    c = al.a[k] @ s.cov @ al.a[k].T
    em.append(np.linalg.norm(m - al.mean) / scale_m)
    ec.append(np.linalg.norm(c - al.cov) / np.linalg.norm(al.cov))
  return np.array(em), np.array(ec)
