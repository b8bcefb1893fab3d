"""A small semantic encoder trained in-process: a two-conv classifier whose stride-2 feature map is the latent.

At digits scale it plays DINOv2's part in Latent Forcing: a frozen network whose features carry the class
(semantics) on a coarse spatial grid. Trained once with softmax cross-entropy on the training images, then
frozen; `encode` returns the ReLU feature map of the second convolution (before pooling).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlab.errors import DataError


class TinySemanticEncoder(nnx.Module):
  """conv 3x3 (width) -> ReLU -> conv 3x3 stride `stride` (channels) -> ReLU -> [latent] -> mean -> linear.

  Args:
    in_channels: image channels.
    channels: latent channels.
    num_classes: classifier outputs (only used for training).
    width: the first convolution's width.
    stride: the second convolution's stride (the latent grid is the image size / stride).
  """

  def __init__(self, in_channels: int, channels: int, num_classes: int, *, width: int = 32, stride: int = 2,
               rngs: nnx.Rngs):
    with nnx.use_eager_sharding(False):
      self.conv1 = nnx.Conv(in_channels, width, (3, 3), padding="SAME", rngs=rngs)
      self.conv2 = nnx.Conv(width, channels, (3, 3), strides=(stride, stride), padding="SAME", rngs=rngs)
      self.head = nnx.Linear(channels, num_classes, rngs=rngs)

  def encode(self, x: jax.Array) -> jax.Array:
    """(B, H, W, C) in [-1, 1] -> (B, H / stride, W / stride, channels)."""
    return jax.nn.relu(self.conv2(jax.nn.relu(self.conv1(jnp.asarray(x, jnp.float32)))))

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.head(self.encode(x).mean(axis=(1, 2)))


def train_semantic_encoder(images, labels, *, channels: int = 8, num_classes: int | None = None, width: int = 32,
                           stride: int = 2, steps: int = 1500, batch_size: int = 128, learning_rate: float = 2e-3,
                           seed: int = 0) -> tuple[TinySemanticEncoder, float]:
  """Trains a `TinySemanticEncoder` classifier (AdamW, minibatches drawn with numpy's `seed`); deterministic.

  Returns:
    (the frozen encoder, its final training accuracy over all images).
  """
  x, y = np.asarray(images, np.float32), np.asarray(labels, np.int32)
  if x.ndim != 4 or len(x) != len(y) or len(x) < 2:
    raise DataError(f"train_semantic_encoder: need images (N, H, W, C) and N labels, got {x.shape}, {y.shape}")
  nc = int(num_classes or y.max() + 1)
  model = TinySemanticEncoder(x.shape[-1], channels, nc, width=width, stride=stride, rngs=nnx.Rngs(seed))
  opt = nnx.Optimizer(model, optax.adamw(learning_rate, weight_decay=1e-4), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt, xb, yb):
    def loss(m):
      return optax.softmax_cross_entropy_with_integer_labels(m(xb), yb).mean()
    _, g = nnx.value_and_grad(loss)(model)
    opt.update(model, g)

  rng = np.random.default_rng(seed)
  xj, yj = jnp.asarray(x), jnp.asarray(y)
  for _ in range(int(steps)):
    idx = rng.integers(0, len(y), int(batch_size))
    step(model, opt, xj[idx], yj[idx])
  acc = float(jnp.mean(jnp.argmax(nnx.jit(lambda m, v: m(v))(model, xj), -1) == yj))
  return model, acc
