"""A small semantic encoder trained in-process: a two-conv classifier whose stride-2 feature map is the latent.

At digits scale it plays DINOv2's part in Latent Forcing: a frozen network whose features carry the class
(semantics) on a coarse spatial grid. Trained once with softmax cross-entropy on the training images, then
frozen; `encode` returns the ReLU feature map of the second convolution (before pooling).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.errors import DataError
from jaxlab.train.classifier import train_classifier


LATENTS = ("relu", "layernorm")


class TinySemanticEncoder(nnx.Module):
  """conv 3x3 (width) -> ReLU -> [depth - 2 x (conv 3x3 stride 2 (width) -> ReLU)] -> conv 3x3 stride `stride`
  (channels) -> ReLU -> mean -> linear (the classifier); the latent is the last convolution's map, average-pooled by `pool`, either after its ReLU ("relu") or
  before it with a LayerNorm over the channels without affine weights ("layernorm": dense, token-normalised
  features, the way the official RAE wrapper takes DINOv2's last layer).

  Args:
    in_channels: image channels.
    channels: latent channels.
    num_classes: classifier outputs (only used for training).
    width: the hidden convolutions' width.
    stride: the last convolution's stride.
    depth: convolutions (>= 2); each one between the first and the last halves the grid (a deeper, more
      abstract latent with a wider receptive field).
    pool: the average pooling of the latent (the latent grid is the image size / (stride pool)).
    latent: "relu" or "layernorm" (see above).
  """

  def __init__(self, in_channels: int, channels: int, num_classes: int, *, width: int = 32, stride: int = 2,
               depth: int = 2, pool: int = 1, latent: str = "relu", rngs: nnx.Rngs):
    if latent not in LATENTS:
      raise DataError(f"TinySemanticEncoder: latent={latent!r} is not one of {LATENTS}")
    if depth < 2:
      raise DataError(f"TinySemanticEncoder: depth={depth} must be >= 2")
    self.pool, self.latent = int(pool), latent
    with nnx.use_eager_sharding(False):
      self.conv1 = nnx.Conv(in_channels, width, (3, 3), padding="SAME", rngs=rngs)
      self.mid = nnx.List([nnx.Conv(width, width, (3, 3), strides=(2, 2), padding="SAME", rngs=rngs)
                           for _ in range(depth - 2)])
      self.conv2 = nnx.Conv(width, channels, (3, 3), strides=(stride, stride), padding="SAME", rngs=rngs)
      self.head = nnx.Linear(channels, num_classes, rngs=rngs)

  def features(self, x: jax.Array) -> jax.Array:
    """The last convolution's map before its ReLU: (B, H / (2^(depth-2) stride), ..., channels)."""
    h = jax.nn.relu(self.conv1(jnp.asarray(x, jnp.float32)))
    for conv in self.mid:
      h = jax.nn.relu(conv(h))
    return self.conv2(h)

  def encode(self, x: jax.Array) -> jax.Array:
    """(B, H, W, C) in [-1, 1] -> (B, H / (2^(depth-2) stride pool), ..., channels)."""
    h = self.features(x)
    if self.latent == "relu":
      h = jax.nn.relu(h)
    if self.pool > 1:
      b, gh, gw, c = h.shape
      p = self.pool
      if gh % p or gw % p:
        raise DataError(f"TinySemanticEncoder: pool {p} does not divide the feature map {gh}x{gw}")
      h = h.reshape(b, gh // p, p, gw // p, p, c).mean(axis=(2, 4))
    if self.latent == "layernorm":
      mu = h.mean(-1, keepdims=True)
      h = (h - mu) * jax.lax.rsqrt(jnp.mean(jnp.square(h - mu), -1, keepdims=True) + 1e-6)
    return h

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.head(jax.nn.relu(self.features(x)).mean(axis=(1, 2)))


def train_semantic_encoder(images, labels, *, channels: int = 8, num_classes: int | None = None, width: int = 32,
                           stride: int = 2, depth: int = 2, pool: int = 1, latent: str = "relu", steps: int = 1500,
                           batch_size: int = 128, learning_rate: float = 2e-3, seed: int = 0) -> tuple[TinySemanticEncoder, float]:
  """Trains a `TinySemanticEncoder` classifier (AdamW, minibatches drawn with numpy's `seed`); deterministic.

  Returns:
    (the frozen encoder, its final training accuracy over all images).
  """
  x, y = np.asarray(images, np.float32), np.asarray(labels, np.int32)
  if x.ndim != 4 or len(x) != len(y) or len(x) < 2:
    raise DataError(f"train_semantic_encoder: need images (N, H, W, C) and N labels, got {x.shape}, {y.shape}")
  nc = int(num_classes or y.max() + 1)
  model = TinySemanticEncoder(x.shape[-1], channels, nc, width=width, stride=stride, depth=depth,
                              pool=pool, latent=latent, rngs=nnx.Rngs(seed))
  train_classifier(model, x, y, steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                   weight_decay=1e-4, seed=seed)
  xj, yj = jnp.asarray(x), jnp.asarray(y)
  acc = float(jnp.mean(jnp.argmax(nnx.jit(lambda m, v: m(v))(model, xj), -1) == yj))
  return model, acc
