"""Diffusion-subspaces' accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/diffusion_subspaces/config.py:full

Each stage is one (score, setting (D, k, M), n); the targets take the largest: the largest ambient D of
data.settings at the largest n of data.ns (the shapes do not depend on k or M, only on D and n). The DSM stage
trains its score network in one jitted scan inside `jaxlab.diffusion.dsm.train_dsm`, which builds the network and
runs the scan in one call, so the target traces the whole call (on one chip, as the run: the training set is not
sharded). The sampler (`method._sample`) runs all method.steps reverse steps in one call, the start points split
over the data axis and the score's training set replicated, as `method.generate` places them. The W1 metrics (POT /
ott-jax Sinkhorn) and the sliced-W1 / nearest-subspace metrics are left out. With method.batch_chunk smaller than
the sharded query rows, the compiled sampler all-gathers them and every chip denoises all rows (compare
`--config.method.batch_chunk=0`).
"""

from __future__ import annotations

import functools
import math
import types

import jax
import jax.numpy as jnp

from jaxlab import compile_check
from jaxlab import mesh as mesh_lib
from jaxlab.diffusion import dsm

from . import method

TOPOLOGY = "v5e-4"


def compile_targets(config):
  """DSM training at the largest stage (when config.learned.enabled) and the KDE-score sampler at the largest
  stage."""
  d = max(int(s[0]) for s in config.data.settings)
  n = max(int(v) for v in config.data.ns)
  mc, lc = config.method, config.learned
  rep, bsh = mesh_lib.replicated(), mesh_lib.batch_sharding()
  sds = lambda shape, sh, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=sh)  # noqa: E731
  key = jax.eval_shape(lambda: jax.random.key(0))
  key = sds(key.shape, rep, key.dtype)
  train = sds((n, d), rep)
  targets = []
  if lc.enabled:
    def fit(k, x):
      model, losses = dsm.train_dsm(k, x, width=int(lc.width), depth=int(lc.depth), steps=int(lc.steps),
                                    batch=int(lc.batch), learning_rate=float(lc.learning_rate),
                                    t_min=float(mc.t_min), t_max=float(mc.t_max))
      return model.state, losses
    state = jax.eval_shape(fit, key, train)[0]
    nparams = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state))
    # 6 N per example (forward + backward of the MLP), lc.batch examples per step
    report = types.SimpleNamespace(params=state)   # Adam's moments live inside the scan (temporaries)
    targets.append(compile_check.Target("dsm_train", jax.jit(fit), (key, train), state=report,
                                        model_flops=6.0 * nparams * int(lc.batch) * int(lc.steps)))
  # The KDE denoiser per evaluation: query-train inner products and the weighted mean, 2 x 2 n_q n D; one
  # evaluation per reverse step plus the final (Tweedie) denoise.
  evals = int(mc.steps) + int(bool(mc.final_denoise))
  sample = jax.jit(functools.partial(method._sample, build=method._kde_builder(int(mc.chunk), int(mc.batch_chunk)),
                                     sampler=mc.sampler, steps=int(mc.steps), t_max=float(mc.t_max),
                                     t_min=float(mc.t_min), final_denoise=bool(mc.final_denoise)))
  targets.append(compile_check.Target("sample_kde", sample, (train, sds((n, d), bsh), key),
                                      model_flops=4.0 * n * n * d * evals))
  return targets
