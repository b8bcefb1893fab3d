"""Benchmarks for `python -m jaxlab.bench gumbel_rf`: the fused walk step vs the unfused XLA reference.

Case: N = 100k nodes in R^3, m = 256 features, 400k walkers (4 per node). Per step the reference moves the
(walkers, m) gathered feature rows twice and the (walkers, m) logits/Gumbels through memory; the fused kernel
reads the two feature rows per walker once and keeps the rest in registers. Roofline bytes: two feature
rows (2 m floats) + two coordinate rows + the CDF search (log2 N floats) + walker state per walker;
transcendentals: m logs for the Gumbels (x2) + 2 m exps for q per walker. The Pallas impl runs on GPU only.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxlab.kernels.gumbel_rf.ops import walk_step

N, M, D, WALKERS = 100_000, 256, 3, 400_000


def _setup():
  k = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(k[0], (N, D))
  log_phi = jax.random.normal(k[1], (N, M)) - 3.0
  log_s = jax.nn.logsumexp(log_phi, axis=0)
  p = jnp.exp(log_phi - log_s).T
  cdf = jnp.cumsum(p, axis=1)
  cdf = cdf / cdf[:, -1:]
  cur = jax.random.randint(k[2], (WALKERS,), 0, N)
  args = (cur, jnp.ones((WALKERS,)), jnp.arange(WALKERS, dtype=jnp.int32), jnp.uint32(1), jnp.uint32(2), log_phi,
          log_s, cdf, x)
  impls = ["xla"] + (["pallas"] if jax.default_backend() in ("gpu", "cuda") else [])
  return {impl: (jax.jit(lambda *a, impl=impl: walk_step(*a, impl=impl, scale=0.01)), args) for impl in impls}


BENCHMARKS = [dict(
    name="gumbel_rf/step", setup=_setup, baseline="xla", shape=f"N{N} m{M} d{D} walkers{WALKERS}",
    flops=WALKERS * (8.0 * M + 10.0 * D), bytes=WALKERS * 4.0 * (2 * M + 2 * D + math.log2(N) + 8),
    transcendentals=WALKERS * 4.0 * M)]
