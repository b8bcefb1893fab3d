"""Quickstart's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/quickstart/config.py:full
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab import compile_check
from jaxlab.nn import MLP

from .train import loss_fn

TOPOLOGY = "v5e-4"   # the slice `compile_check --all` proves the full config on


def compile_targets(config):
  """The full config's train step (MNIST: 784 features, 10 classes)."""
  in_features, hidden, b = 784, tuple(config.model.hidden), config.train.batch_size
  widths = (in_features, *hidden, 10)
  flops = 6 * b * sum(a * c for a, c in zip(widths[:-1], widths[1:]))   # forward + backward matmuls
  batch = {"x": jax.ShapeDtypeStruct((b, in_features), jnp.float32),
           "label": jax.ShapeDtypeStruct((b,), jnp.int32)}
  return [compile_check.train_target(config, lambda rngs: MLP(in_features, hidden, 10, rngs=rngs), loss_fn, batch,
                                     model_flops=flops)]
