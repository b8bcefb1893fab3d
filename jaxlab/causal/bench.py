"""Benchmarks for `python -m jaxlab.bench navar`: NAVAR ensemble training and ICE curves at DREAM3-like size.

* `navar/train`: one chunk of 5 full-batch AdamW steps of an 8-member NAVAR-MLP ensemble (N = 100 variables,
  K = 5 lags, H = 32, B = 2048 windows), members looped with `lax.map` vs batched with `vmap`.
* `navar/ice`: ICE / PD / dispersion curves of all N^2 edges on a 50-point grid over 1024 windows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.causal import ensemble, ice
from jaxlab.causal.navar import Navar

N, K, H, B, M, STEPS, G, B_ICE = 100, 5, 32, 2048, 8, 5, 50, 1024


def _train_setup():
  model = Navar(N, K, H)
  tx = optax.adamw(1e-3, weight_decay=1e-4)
  rng = np.random.default_rng(0)
  state = ensemble.init(model, tx, rng, M)
  data = {"x": jnp.asarray(rng.normal(size=(B, N, K)), jnp.float32), "y": jnp.asarray(rng.normal(size=(B, N)),
                                                                                      jnp.float32),
          "w": jnp.ones((M, B)), "v": jnp.zeros(B)}
  return {impl: (jax.jit(ensemble.make_chunk_step(model, tx, 0.1, STEPS, impl)), (state, data))
          for impl in ensemble.MEMBER_LOOPS}


def _ice_setup():
  model = Navar(N, K, H)
  params = model.init(np.random.default_rng(1))
  x = np.random.default_rng(2).normal(size=(B_ICE, N, K)).astype(np.float32)
  grid = ice.grids(x, 1, G)
  return {"chunked": (lambda: ice.response_curves(model, params, x, grid, 1), ())}


_FWD = 2 * B * N * (K * H + H * N)     # one forward pass of one member
BENCHMARKS = [
    dict(name="navar/train", setup=_train_setup, flops=3.0 * _FWD * M * STEPS, bytes=4.0 * B * N * (K + 1) * M * STEPS,
         baseline="map", shape=f"N={N} K={K} H={H} B={B} members={M} steps={STEPS}", count=M * STEPS * B,
         unit="window-steps"),
    dict(name="navar/ice", setup=_ice_setup, flops=2.0 * N * G * B_ICE * (K * H + H * N), bytes=4.0 * N * G * B_ICE * N,
         shape=f"N={N} G={G} B={B_ICE}", count=N * N * G, unit="curve-pts"),
]
