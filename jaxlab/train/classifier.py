"""A small classifier trained in-process: minibatch AdamW on softmax cross-entropy over arrays in memory.

For the frozen helper networks of an experiment (a judge whose features score samples, a semantic latent
encoder), trained in seconds on the host before the main run; deterministic given `seed` (numpy draws the
minibatch indices, with replacement, one batch per step).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


def train_classifier(model: nnx.Module, images, labels, *, steps: int, batch_size: int, learning_rate: float,
                     weight_decay: float, seed: int,
                     logits: Callable[[nnx.Module, jax.Array], jax.Array] | None = None) -> nnx.Module:
  """Trains `model` in place and returns it.

  Args:
    model: the classifier (its `nnx.Param`s are trained).
    images, labels: (N, ...) inputs and (N,) integer labels.
    steps, batch_size, learning_rate, weight_decay: the optimisation (optax.adamw, constant rate).
    seed: the numpy seed of the minibatch draws.
    logits: `(model, x) -> (B, classes)` (default: `model(x)`).
  """
  logits = logits or (lambda m, x: m(x))
  opt = nnx.Optimizer(model, optax.adamw(learning_rate, weight_decay=weight_decay), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt, x, y):
    def loss(m):
      return optax.softmax_cross_entropy_with_integer_labels(logits(m, x), y).mean()
    _, g = nnx.value_and_grad(loss)(model)
    opt.update(model, g)

  rng = np.random.default_rng(int(seed))
  x, y = jnp.asarray(images), jnp.asarray(labels)
  for _ in range(int(steps)):
    idx = rng.integers(0, len(y), int(batch_size))
    step(model, opt, x[idx], y[idx])
  return model
