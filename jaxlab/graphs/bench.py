"""Scaling benchmark for `python -m jaxlab.bench swing`: SWING's cost is linear in N; the materialised
baseline is quadratic and is refused where its N x N matrix would not fit.

Each case builds SWING features for N points in R^3 (RBF i-graph, m = 128 features, 4 walks per node,
t_max = 8) from two independent ensembles and applies K_hat to a vector, end to end under one jit.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from jaxlab.errors import ConfigError
from jaxlab.graphs import grf, igraph, swing

SIZES = tuple(int(s) for s in os.environ.get("JAXLAB_SWING_BENCH_SIZES", "1000,10000,100000").split(","))
MATERIALISE_LIMIT = 2 ** 30  # bytes allowed for the baseline's dense W


def _setup(n):
  def setup():
    x = jax.random.normal(jax.random.key(0), (n, 3))
    g = igraph.IGraph("rbf", bandwidth=0.3, scale=1.0 / n)
    f = jnp.ones(9)

    def swing_pipeline(key, v):
      k1, k2 = jax.random.split(key)
      kw = dict(n_walks=4, t_max=8, p_halt=0.5, m=128, sigma2=2.0, impl="auto")
      return grf.kernel_matvec(swing.swing_features(k1, x, g, f, **kw), swing.swing_features(k2, x, g, f, **kw), v)

    out = {"swing": (jax.jit(swing_pipeline), (jax.random.key(1), jnp.ones((n,))))}
    try:
      igraph.check_fits(n, MATERIALISE_LIMIT)

      def dense_pipeline(key, v):
        w = igraph.materialise(g, x, max_bytes=MATERIALISE_LIMIT)
        k1, k2 = jax.random.split(key)
        kw = dict(proposal="uniform", n_walks=4, t_max=8, p_halt=0.5)
        return grf.kernel_matvec(grf.materialised_features(k1, w, f, **kw),
                                 grf.materialised_features(k2, w, f, **kw), v)
      out["materialised"] = (jax.jit(dense_pipeline), (jax.random.key(1), jnp.ones((n,))))
    except ConfigError as e:
      out["materialised"] = f"refused: {e}"
    return out
  return setup


BENCHMARKS = [dict(name=f"swing/n{n}", setup=_setup(n), shape=f"N={n} d=3 m=128 walks=4 t_max=8",
                   flops=0.0, bytes=0.0) for n in SIZES]
