"""First-order Markov chains with a controllable (Zipf-like) stationary distribution.

Recipe of the focus-dilution spec (reconstructed): P = (1 - alpha) 1 pi0^T + alpha Q, with pi0 = Zipf(s) over V
states and Q a random row-stochastic matrix with Dirichlet(concentration) rows. The stationary distribution of P
stays Zipf-like while P carries real transition structure. Sequences start from the stationary distribution.
"""

from __future__ import annotations

import numpy as np


def zipf(v: int, s: float = 1.0) -> np.ndarray:
  """Zipf(s) probabilities over v ranks: p_i ∝ (i + 1)^-s, (v,) float64."""
  if v < 2:
    raise ValueError(f"zipf needs v >= 2 states, got {v}")
  p = np.arange(1, v + 1, dtype=np.float64) ** (-float(s))
  return p / p.sum()


def make_chain(v: int, alpha: float = 0.5, zipf_s: float = 1.0, concentration: float = 1.0,
               seed: int = 0) -> np.ndarray:
  """The (v, v) row-stochastic transition matrix P = (1 - alpha) 1 pi0^T + alpha Q (float64)."""
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}")
  rng = np.random.default_rng(seed)
  q = rng.dirichlet(np.full(v, float(concentration)), size=v)
  return (1.0 - alpha) * np.ones((v, 1)) * zipf(v, zipf_s)[None, :] + alpha * q


def stationary(p: np.ndarray) -> np.ndarray:
  """Stationary distribution pi (pi P = pi) of a row-stochastic matrix, by a linear solve; (v,) float64."""
  p = np.asarray(p, np.float64)
  if p.ndim != 2 or p.shape[0] != p.shape[1]:
    raise ValueError(f"transition matrix must be square, got shape {p.shape}")
  if np.any(p < -1e-12) or not np.allclose(p.sum(1), 1.0, atol=1e-8):
    raise ValueError("transition matrix rows must be non-negative and sum to 1")
  v = p.shape[0]
  a = np.vstack([p.T - np.eye(v), np.ones((1, v))])
  b = np.zeros(v + 1)
  b[-1] = 1.0
  pi = np.linalg.lstsq(a, b, rcond=None)[0]
  pi = np.clip(pi, 0.0, None)
  return pi / pi.sum()


def sample(p: np.ndarray, n: int, length: int, seed: int = 0, pi: np.ndarray | None = None) -> np.ndarray:
  """n sequences of `length` states, the first drawn from `pi` (default: the stationary distribution).

  Returns:
    (n, length) int32 array of states in [0, v).
  """
  p = np.asarray(p, np.float64)
  pi = stationary(p) if pi is None else np.asarray(pi, np.float64)
  rng = np.random.default_rng(seed)
  cum = np.cumsum(p, axis=1)
  cum[:, -1] = 1.0
  out = np.empty((n, length), np.int32)
  c0 = np.cumsum(pi)
  c0[-1] = 1.0
  out[:, 0] = np.searchsorted(c0, rng.random(n), side="right")
  for t in range(1, length):
    out[:, t] = np.minimum((cum[out[:, t - 1]] < rng.random((n, 1))).sum(1), p.shape[0] - 1)
  return out
