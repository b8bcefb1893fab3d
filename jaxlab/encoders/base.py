"""The encoder interface, the latent normaliser (per-channel standardisation + pixel-norm matching), and
precomputed latents read from a file."""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import DataError


class Encoder(Protocol):
  """Images (B, H, W, C) in [-1, 1] -> latent grid (B, h, w, c), frozen (no parameters are trained through it)."""

  def encode(self, x: jax.Array) -> jax.Array:
    ...


def match_pixel_norm(pixels) -> float:
  """The RMS of the pixels over every element: the scale a unit-variance latent is multiplied by so its norm per
  element matches the pixels' (the official code's constant 0.485 is this number for ImageNet in [-1, 1])."""
  p = np.asarray(pixels, np.float64)
  return float(np.sqrt(np.mean(np.square(p))))


@dataclasses.dataclass(frozen=True)
class LatentNormalizer:
  """z -> (z - mean) / std * scale per channel (the last axis); `invert` undoes it.

  Attributes:
    mean, std: (c,) per-channel statistics of the raw latents (std floored at `eps`).
    scale: the target RMS (`match_pixel_norm` of the training pixels; 1 keeps the standardised latent).
  """
  mean: np.ndarray
  std: np.ndarray
  scale: float = 1.0

  @classmethod
  def fit(cls, latents, pixels=None, *, scale: float | None = None, eps: float = 1e-6) -> "LatentNormalizer":
    """Statistics of (N, h, w, c) raw latents; scale = match_pixel_norm(pixels) when pixels are given, else
    `scale` (default 1)."""
    z = np.asarray(latents, np.float64)
    if z.ndim < 2 or z.shape[0] < 2:
      raise DataError(f"LatentNormalizer.fit: need (N >= 2, ..., channels) latents, got shape {z.shape}")
    flat = z.reshape(-1, z.shape[-1])
    if not np.isfinite(flat).all():
      raise DataError("LatentNormalizer.fit: the latents contain NaN or inf")
    if pixels is not None and scale is not None:
      raise ValueError("LatentNormalizer.fit: give pixels or scale, not both")
    s = match_pixel_norm(pixels) if pixels is not None else (1.0 if scale is None else float(scale))
    return cls(mean=flat.mean(0).astype(np.float32), std=np.maximum(flat.std(0), eps).astype(np.float32), scale=s)

  def __call__(self, z):
    return (z - jnp.asarray(self.mean)) / jnp.asarray(self.std) * self.scale

  def invert(self, z):
    return z / self.scale * jnp.asarray(self.std) + jnp.asarray(self.mean)


def encode_batched(encode: Callable[[jax.Array], jax.Array], images, batch_size: int = 512) -> np.ndarray:
  """`encode` over (N, H, W, C) images in batches (jitted once per batch shape): (N, h, w, c) numpy."""
  fn = jax.jit(encode)
  x = np.asarray(images)
  out = [np.asarray(fn(jnp.asarray(x[i:i + batch_size]))) for i in range(0, len(x), batch_size)]
  if not out:
    raise DataError("encode_batched: no images")
  return np.concatenate(out)


class PrecomputedLatents:
  """Latents computed once (e.g. DINOv2 patch tokens of every training image) and read back by row.

  The file is a local .npz with "latents" (N, h, w, c) and optionally "mean" / "std" (c,) statistics; rows
  follow the dataset's order, so `self[indices]` gives the latents of the images at those indices.

  Args:
    path: the .npz file (nothing is downloaded).
    mmap: memory-map the latents (np.load mmap_mode="r"; needs an uncompressed .npz).
  """

  def __init__(self, path: str, mmap: bool = True):
    if not os.path.exists(path):
      raise DataError(f"no precomputed latents at {path}: compute them once with the encoder and save them "
                      "with np.savez(path, latents=...) (nothing is downloaded)")
    self._file = np.load(path, mmap_mode="r" if mmap else None)
    if "latents" not in self._file.files:
      raise DataError(f"{path} holds {self._file.files}; expected 'latents' (N, h, w, c)")
    self.latents = self._file["latents"]
    if self.latents.ndim != 4:
      raise DataError(f"{path}: latents must be (N, h, w, c), got shape {self.latents.shape}")
    self.normalizer = None
    if "mean" in self._file.files and "std" in self._file.files:
      self.normalizer = LatentNormalizer(np.asarray(self._file["mean"], np.float32),
                                         np.asarray(self._file["std"], np.float32))

  def __len__(self) -> int:
    return int(self.latents.shape[0])

  def __getitem__(self, indices) -> np.ndarray:
    idx = np.asarray(indices)
    if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
      raise DataError(f"precomputed latents: rows {idx.min()}..{idx.max()} outside [0, {len(self)})")
    return np.asarray(self.latents[idx], np.float32)
