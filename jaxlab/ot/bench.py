"""Benchmarks for `python -m jaxlab.bench ot`: the Bures barycenter + per-client maps (SLOT-Align's server step).

K = 6 Gaussians in d = 64 / 512 / 768 dimensions (CLIP feature sizes), float64 (as the server runs it; on
CPU, XLA's float32 eigh is also ~7x slower than its float64 LAPACK path), a fixed 30 fixed-point
iterations (tol = 0) so both implementations do the same work: ours (eigh-based roots, `lax.while_loop`) and
ott-jax's `costs.Bures.barycenter` (Newton-Schulz roots), each followed by the K closed-form maps (ours).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from jaxlab.ot import gaussian

DIMS = tuple(int(s) for s in os.environ.get("JAXLAB_OT_BENCH_DIMS", "64,512,768").split(","))
K, ITERS = 6, 30


def _x64(fn):
  """Calls a jitted fn with 64-bit types enabled (the harness times it outside any context)."""
  def call(*args):
    with jax.enable_x64(True):
      return fn(*args)
  return call


def _setup(d):
  def setup():
    with jax.enable_x64(True):
      key = jax.random.key(0)
      a = jax.random.normal(key, (K, d, d), jnp.float64) / jnp.sqrt(d)
      covs = a @ jnp.swapaxes(a, -1, -2) + 0.1 * jnp.eye(d)
      means = jax.random.normal(jax.random.fold_in(key, 1), (K, d), jnp.float64)
      w = jnp.full((K,), 1.0 / K, jnp.float64)

    def ours(means, covs, w):
      b = gaussian.bures_barycenter(means, covs, w, num_iters=ITERS, tol=0.0)
      return jax.vmap(gaussian.gaussian_map, in_axes=(0, 0, None, None))(means, covs, b.mean, b.cov)

    out = {"jax_eigh": (_x64(jax.jit(ours)), (means, covs, w))}
    try:
      import ott  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

      def with_ott(means, covs, w):
        b = gaussian.bures_barycenter(means, covs, w, num_iters=ITERS, backend="ott")
        return jax.vmap(gaussian.gaussian_map, in_axes=(0, 0, None, None))(means, covs, b.mean, b.cov)
      out["ott"] = (_x64(jax.jit(with_ott)), (means, covs, w))
    except ImportError:
      out["ott"] = "refused: ott-jax is not installed (pip install -e '.[ot]')"
    return out
  return setup


BENCHMARKS = [dict(name=f"ot/bures_barycenter_d{d}", setup=_setup(d), shape=f"K={K} d={d} iters={ITERS} f64",
                   flops=0.0, bytes=0.0, baseline="ott") for d in DIMS]
