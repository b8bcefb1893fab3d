"""SWING experiment glue: point sets, estimator runs, error metrics and the downstream task.

The estimators themselves live in the library (`jaxlab.graphs`: GRF walks, SWING proposal; the fused step in
`jaxlab.kernels.gumbel_rf`). Here: relative Frobenius error ||K_hat - K||_F / ||K||_F (dense for small N,
Gaussian-probe estimate E||(K_hat - K) v||^2 = ||K_hat - K||_F^2 for large N, with K v by conjugate
gradients on implicit mat-vecs), and graph-kernel label propagation (scores = K Y_labeled).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError, DataError
from jaxlab.graphs import grf, igraph, swing


def load_points(config, key) -> jax.Array:
  """(N, d) node features from config.data."""
  d = config.data
  if d.points == "npy" and not d.path:
    raise ConfigError("config.data.points='npy' needs --config.data.path=POINTS.npy (an (N, d) float array)")
  if d.points == "gaussian":
    return jax.random.normal(key, (d.n, d.dim))
  if d.points == "uniform":
    return jax.random.uniform(key, (d.n, d.dim), minval=-1.0, maxval=1.0)
  try:
    x = np.load(d.path)
  except (OSError, ValueError) as e:
    raise DataError(f"config.data.path={d.path!r}: cannot read an .npy point array ({e})") from None
  if x.ndim != 2 or not np.all(np.isfinite(x)):
    raise DataError(f"config.data.path={d.path!r}: need a finite (N, d) array, got shape {x.shape}")
  return jnp.asarray(x[: d.n], jnp.float32)


def make_graph(config, x) -> igraph.IGraph:
  d = config.data
  g = igraph.IGraph(d.graph, bandwidth=d.bandwidth, eps=d.eps, sharpness=d.sharpness)
  return igraph.normalise(g, x, d.rho)


def f_mod(config) -> np.ndarray:
  return grf.modulation_from_alpha(grf.alpha_coefficients(config.method.kernel, config.method.t_max))


def swing_ensemble(config, key, x, g, walks, **over):
  """SWING features of every node (under the mesh in context, if any)."""
  m = config.method
  kw = dict(n_walks=walks, t_max=m.t_max, p_halt=m.p_halt, m=m.m, sigma2=m.sigma2, lam=m.lam, impl=m.impl,
            orthogonal=m.orthogonal, proposal_bandwidth=m.proposal_bandwidth or None)
  kw.update(over)
  return swing.swing_features(key, x, g, jnp.asarray(f_mod(config), jnp.float32), **kw)


def materialised_ensemble(config, key, w_nn, walks, proposal):
  m = config.method
  return grf.materialised_features(key, w_nn, jnp.asarray(f_mod(config), jnp.float32), proposal=proposal,
                                   n_walks=walks, t_max=m.t_max, p_halt=m.p_halt)


def exact_matvec(config, g, x, v):
  """K v for the configured kernel with implicit mat-vecs (CG for the inverses)."""
  mv = lambda y: igraph.matvec(g, x, y)  # noqa: E731
  solve = lambda b: jax.scipy.sparse.linalg.cg(lambda y: y - mv(y), b, tol=1e-7, maxiter=500)[0]  # noqa: E731
  kind = config.method.kernel
  if kind == "inverse":
    return jax.vmap(solve, 1, 1)(v)
  if kind == "inverse_squared":
    return jax.vmap(lambda b: solve(solve(b)), 1, 1)(v)
  out, term = v, v
  for k in range(1, 30):
    term = jax.vmap(mv, 1, 1)(term) / k
    out = out + term
  return out


class Evaluator:
  """Relative Frobenius error of estimates against K (dense when N <= dense_max, else probes)."""

  def __init__(self, config, g, x, key):
    self.n = x.shape[0]
    self.dense = self.n <= config.eval.dense_max
    if self.dense:
      self.w = igraph.materialise(g, x)
      self.k = grf.exact_kernel(np.asarray(self.w), config.method.kernel)
    else:
      self.w = None
      self.probes = jax.random.normal(key, (self.n, config.eval.probes))
      self.kp = np.asarray(exact_matvec(config, g, x, self.probes), np.float64)

  def estimate(self, a: grf.WalkFeatures, b: grf.WalkFeatures):
    """Dense K_hat (small N) or K_hat @ probes."""
    if self.dense:
      return np.asarray(grf.dense_estimate(a, b), np.float64)
    return np.asarray(grf.kernel_matvec(a, b, self.probes), np.float64)

  def error(self, est) -> float:
    ref = self.k if self.dense else self.kp
    return float(np.linalg.norm(est - ref) / np.linalg.norm(ref))


def label_propagation(scores_nc: np.ndarray, labels: np.ndarray, labeled: np.ndarray) -> float:
  """Accuracy on the unlabeled nodes of argmax over classes of K Y (scores already K @ Y_labeled)."""
  pred = np.argmax(scores_nc, axis=1)
  return float(np.mean(pred[~labeled] == labels[~labeled]))
