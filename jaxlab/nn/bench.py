"""Scaling benchmark for `python -m jaxlab.bench df_mamba`: DF-Mamba's training step is linear in length.

Each case times one jitted forward + backward step (MSE loss, batch 8, d_model 32, d_state 16, one shared
block, lookback L with K = 1 + log2(L / 32) levels) of DF-Mamba and of flat Mamba (one layer) at
L = 128 ... 4096. The levels of DF-Mamba add at most L / r + L / r^2 + ... < L more scan steps (r = 2), so
its time per step is at most about 2x flat Mamba's and grows linearly in L. FLOPs are counted analytically
for the scan + projections (`step_flops`); set JAXLAB_DF_BENCH_LENGTHS to change the lengths.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab.nn import multiscale

LENGTHS = tuple(int(s) for s in os.environ.get("JAXLAB_DF_BENCH_LENGTHS", "128,512,1024,4096").split(","))
BATCH, D_MODEL, D_STATE, HORIZON = 8, 32, 16, 32


def step_flops(length: int, mode: str, batch: int = BATCH, d_model: int = D_MODEL, d_state: int = D_STATE,
               expand: int = 2, ratio: int = 2, min_len: int = 32) -> float:
  """Forward + backward FLOPs (3x forward) of the Mamba layers over all levels (projections + scan)."""
  d_inner = expand * d_model
  per_token = 2 * d_model * 2 * d_inner + 2 * d_inner * d_model + 2 * d_inner * (2 * d_state + 2) + 9 * d_inner * d_state
  levels = 1 if mode == "flat" else multiscale.num_levels(length, ratio, min_len)
  tokens = sum(length // ratio ** k for k in range(levels))
  return 3.0 * batch * tokens * per_token


def _setup(length: int):
  def setup():
    out = {}
    x = jax.random.normal(jax.random.key(0), (BATCH, length, 1))
    y = jax.random.normal(jax.random.key(1), (BATCH, HORIZON))
    for mode in ("fractal", "flat"):
      model = multiscale.FractalMamba(1, HORIZON, D_MODEL, mode=mode, d_state=D_STATE, rngs=nnx.Rngs(0))
      graphdef, params = nnx.split(model)

      def loss(p, x, y, graphdef=graphdef):
        return jnp.mean((nnx.merge(graphdef, p)(x) - y) ** 2)
      out[mode] = (jax.jit(jax.value_and_grad(loss)), (params, x, y))
    return out
  return setup


BENCHMARKS = [dict(name=f"df_mamba/L{n}", setup=_setup(n), shape=f"batch={BATCH} L={n} d={D_MODEL} N={D_STATE}",
                   flops=step_flops(n, "fractal"), bytes=0.0, baseline="flat", count=BATCH * n, unit="tok")
              for n in LENGTHS]
