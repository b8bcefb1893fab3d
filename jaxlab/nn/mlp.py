"""Multi-layer perceptron with logical axis annotations."""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx


class MLP(nnx.Module):
  """Dense layers with an activation between them; weights annotated ("embed", "mlp") / ("mlp", "embed").

  Hidden layers alternate the sharded dimension so that, with the default rules, the weights of an MLP
  split over the `model` mesh axis Megatron-style (column-parallel then row-parallel).

  Args:
    in_features: input size.
    hidden: sizes of the hidden layers.
    out_features: output size.
    rngs: NNX random streams for initialisation.
    activation: elementwise nonlinearity (default gelu).
    dtype: computation dtype (parameters stay float32).
  """

  def __init__(self, in_features: int, hidden: Sequence[int], out_features: int, *, rngs: nnx.Rngs,
               activation: Callable[[jax.Array], jax.Array] = nnx.gelu, dtype=jnp.float32):
    sizes = [in_features, *hidden, out_features]
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
      names = ("embed", "mlp") if i % 2 == 0 else ("mlp", "embed")
      init = nnx.with_partitioning(nnx.initializers.lecun_normal(), names)
      layers.append(nnx.Linear(a, b, kernel_init=init,
                               bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), names[1:]),
                               dtype=dtype, rngs=rngs))
    self.layers = nnx.List(layers)
    self.activation = activation

  def __call__(self, x_bd: jax.Array) -> jax.Array:
    """Maps (batch, in_features) to (batch, out_features)."""
    for i, layer in enumerate(self.layers):
      x_bd = layer(x_bd)
      if i < len(self.layers) - 1:
        x_bd = self.activation(x_bd)
    return x_bd
