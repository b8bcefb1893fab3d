"""Unions of low-dimensional linear subspaces: the data of the diffusion sample-complexity experiments.

M random k-dimensional subspaces of R^D, each spanned by the orthonormal columns of U_m (QR of a Gaussian
D x k matrix, i.e. uniformly distributed on the Grassmannian); a sample picks m uniformly (or with given
weights) and returns U_m c with subgaussian coordinates c in R^k: standard Gaussian or uniform on
[-sqrt(3), sqrt(3)] (unit variance). Generated on the host with numpy (a dataset, not a device computation).
"""

from __future__ import annotations

import numpy as np

from jaxlab.errors import ConfigError

COORDS = ("gaussian", "uniform")


def random_subspaces(rng: np.random.Generator, dim: int, k: int, m: int) -> np.ndarray:
  """(m, dim, k) float32 orthonormal bases of m independent uniformly random k-dim subspaces of R^dim."""
  if not 1 <= k <= dim or m < 1:
    raise ConfigError(f"need 1 <= k <= D and M >= 1, got D={dim}, k={k}, M={m}")
  q, r = np.linalg.qr(rng.standard_normal((m, dim, k)))
  return (q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[:, None, :]).astype(np.float32)


def sample_union(rng: np.random.Generator, bases_mdk: np.ndarray, n: int, coords: str = "gaussian",
                 weights=None) -> tuple[np.ndarray, np.ndarray]:
  """Draws n points from the mixture over subspaces.

  Args:
    rng: numpy Generator.
    bases_mdk: (M, D, k) orthonormal bases.
    n: number of points.
    coords: "gaussian" (N(0, I_k)) or "uniform" (U[-sqrt 3, sqrt 3]^k, unit variance).
    weights: optional (M,) mixture weights (default uniform).

  Returns:
    (x (n, D) float32, labels (n,) int32 subspace index of each point).
  """
  if coords not in COORDS:
    raise ConfigError(f"coords={coords!r}: use one of {COORDS}")
  bases = np.asarray(bases_mdk, np.float64)
  m, _, k = bases.shape
  labels = rng.choice(m, size=n, p=None if weights is None else np.asarray(weights) / np.sum(weights))
  c = rng.standard_normal((n, k)) if coords == "gaussian" else rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), (n, k))
  return np.einsum("ndk,nk->nd", bases[labels], c).astype(np.float32), labels.astype(np.int32)
