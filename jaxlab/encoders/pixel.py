"""The non-semantic control latent: area-downsampled pixels folded onto the token grid."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxlab.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class PixelDownsample:
  """Area-pool the image by `factor`, then space-to-depth onto a (gh, gw) grid.

  Latent Forcing's `PixelDownsampleEncoder` at ImageNet 256: factor 4 (256 -> 64), grid 16 x 16, so each latent
  token holds a 4 x 4 x 3 = 48-channel patch of the 64 x 64 image. On 8 x 8 digits with a 4 x 4 token grid,
  factor 2 gives a 4 x 4 x 1 latent (the 4 x 4 area-pooled image).

  Attributes:
    factor: the area-pooling factor (divides H and W).
    grid: (gh, gw) latent grid (divides the pooled size).
  """
  factor: int
  grid: tuple[int, int]

  def channels(self, image_channels: int, image_size: tuple[int, int]) -> int:
    h, w = image_size
    return (h // self.factor // self.grid[0]) * (w // self.factor // self.grid[1]) * image_channels

  def encode(self, x: jax.Array) -> jax.Array:
    b, h, w, c = x.shape
    f, (gh, gw) = self.factor, self.grid
    if h % f or w % f or (h // f) % gh or (w // f) % gw:
      raise ConfigError(f"PixelDownsample: factor {f} and grid {self.grid} must divide the image {h}x{w}")
    pooled = x.reshape(b, h // f, f, w // f, f, c).mean(axis=(2, 4))
    ph, pw = h // f // gh, w // f // gw
    tiles = pooled.reshape(b, gh, ph, gw, pw, c).transpose(0, 1, 3, 2, 4, 5)
    return tiles.reshape(b, gh, gw, ph * pw * c).astype(jnp.float32)
