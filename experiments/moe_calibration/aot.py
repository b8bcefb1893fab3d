"""Calibrated MoE's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/moe_calibration/config.py:full

Only the "robust" stage (claim 3) trains on the accelerator: `training.Trainer` runs whole epochs of minibatch AdamW
steps in one jitted call (`Trainer._epochs`, vmapped over worlds; a claim run trains one world). The theory stage
(claims 1-2, the 2M / 1M / 1M points of the full variant) fits logistic regressions with sklearn on the host. The
run places its arrays on one default device, so one chip does the work: the target replicates it over the slice
(per-chip memory and FLOPs are one chip's; the printed MFU divides by every chip of the slice, so one chip's is that
times the slice's chips). `v5e-1` would be the slice, but `compile_check.topology` cannot describe a one-chip slice
(libtpu needs chips_per_host_bounds=(1, 1, 1)).
"""

from __future__ import annotations

import math
import types

import jax
import jax.numpy as jnp

from jaxlab import compile_check
from jaxlab import mesh as mesh_lib

from . import training

TOPOLOGY = "v5e-4"
FORWARD_CHUNK = 50_000    # `Trainer.forward`'s default chunk of rows


def compile_targets(config):
  """One world's warm-up call (ERM epochs), one arm's call (the filtered tilt, the costliest objective) and one
  forward chunk of the evaluation."""
  t = config.robust
  if not t.enabled:
    return []
  in_features = 2 + int(t.noise_dims)
  found = []   # the Trainer builds a module to read its graphdef: traced, so no eager op meets the TPU mesh
  jax.eval_shape(lambda: found.append(training.Trainer(in_features, t)))
  trainer = found[0]
  rep = mesh_lib.replicated()
  put = lambda tree: jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), tree)  # noqa: E731
  worlds = 1
  keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), worlds))
  carry = put(jax.eval_shape(trainer.init, keys))
  state = types.SimpleNamespace(params=carry[0], opt_state=carry[1])
  n = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(carry[0])) // worlds
  x = put(jax.ShapeDtypeStruct((worlds, t.train_size, in_features), jnp.float32))
  y = put(jax.ShapeDtypeStruct((worlds, t.train_size), jnp.int32))
  rows_per_epoch = trainer.steps_per_epoch * t.batch_size

  def epochs_target(name, epochs, kind, eta):
    ekeys = put(jax.eval_shape(lambda: jax.random.split(jax.random.key(0), (worlds, epochs))))
    fn = jax.jit(lambda c, x, y, k: trainer.run(c, x, y, k, kind, eta), donate_argnums=(0,))
    # 6 N per example (forward + backward of the dense network; soft routing evaluates every expert)
    return compile_check.Target(name, fn, (carry, x, y, ekeys), state=state,
                                model_flops=6.0 * n * rows_per_epoch * epochs * worlds)

  warm = epochs_target("train_warmup_erm", t.warmup_epochs, "erm", 0.0)
  arm = epochs_target("train_arm_filtered", t.epochs - t.warmup_epochs, "filtered", float(t.eta))
  chunk = min(FORWARD_CHUNK, t.test_size)
  fwd = compile_check.Target("forward_chunk", jax.jit(trainer._forward),
                             (carry[0], put(jax.ShapeDtypeStruct((worlds, chunk, in_features), jnp.float32))),
                             state=carry[0], model_flops=2.0 * n * chunk * worlds)
  return [warm, arm, fwd]
