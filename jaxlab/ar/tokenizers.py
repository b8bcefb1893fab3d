"""Continuous tokens of images: pixel patches, PCA-reduced patches, and precomputed VAE latents from a path.

* `PatchTokenizer(patch)`: (B, H, W, C) -> (B, (H/p)(W/p), p*p*C) in raster order (`jaxlab.nn.dit.patchify`) and
  back; lossless.
* `PCATokenizer.fit(images, patch, dims)`: the patches projected on their top `dims` principal directions
  (mean-centred, scaled to unit variance per direction); decoding reconstructs from those directions (lossy
  when dims < p*p*C). Fitted with numpy's SVD on the training patches.
* `load_latents(path)`: an .npz of precomputed latents ("latent" (N, h, w, c), "label" (N,)), e.g. MAR's KL-16
  VAE (LTH14/mar) encodings of ImageNet 256 (16 x 16 x 16); tokens are the latent's positions in raster order.
"""

from __future__ import annotations

import dataclasses
import os

import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError, DataError
from jaxlab.nn import dit


@dataclasses.dataclass(frozen=True)
class PatchTokenizer:
  patch: int
  image_shape: tuple[int, int, int]       # (H, W, C)

  @property
  def grid(self) -> tuple[int, int]:
    h, w, _ = self.image_shape
    return (h // self.patch, w // self.patch)

  @property
  def token_dim(self) -> int:
    return self.patch * self.patch * self.image_shape[2]

  def encode(self, x):
    return dit.patchify(jnp.asarray(x), self.patch)

  def decode(self, tokens):
    return dit.unpatchify(jnp.asarray(tokens), self.patch, self.grid, self.image_shape[2])


@dataclasses.dataclass(frozen=True)
class PCATokenizer:
  """Patches projected on principal directions: token = (patch - mean) @ basis / std."""
  patches: PatchTokenizer
  mean: np.ndarray        # (p*p*C,)
  basis: np.ndarray       # (p*p*C, dims) orthonormal columns
  std: np.ndarray         # (dims,)

  @classmethod
  def fit(cls, images, patch: int, dims: int) -> "PCATokenizer":
    images = np.asarray(images, np.float32)
    pt = PatchTokenizer(int(patch), tuple(images.shape[1:]))
    if not 1 <= dims <= pt.token_dim:
      raise ConfigError(f"PCATokenizer: dims={dims} must be in [1, {pt.token_dim}] (the patch's values)")
    flat = np.asarray(pt.encode(images)).reshape(-1, pt.token_dim).astype(np.float64)
    mean = flat.mean(0)
    _, s, vt = np.linalg.svd(flat - mean, full_matrices=False)
    std = s[:dims] / np.sqrt(max(len(flat) - 1, 1))
    return cls(pt, mean.astype(np.float32), vt[:dims].T.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32))

  @property
  def grid(self):
    return self.patches.grid

  @property
  def token_dim(self) -> int:
    return self.basis.shape[1]

  def encode(self, x):
    return (self.patches.encode(x) - self.mean) @ self.basis / self.std

  def decode(self, tokens):
    return self.patches.decode((jnp.asarray(tokens) * self.std) @ self.basis.T + self.mean)


def load_latents(path: str, scale: float = 1.0) -> dict[str, np.ndarray]:
  """{"tokens": (N, h*w, c) float32 latents * scale in raster order, "label": (N,) int32, "grid": (h, w)}.

  Raises:
    DataError: the file is missing or lacks the arrays (one line saying which).
  """
  if not os.path.exists(path):
    raise DataError(f"latents file {path!r} does not exist (an .npz with 'latent' (N, h, w, c) and 'label' (N,))")
  with np.load(path) as f:
    missing = [k for k in ("latent", "label") if k not in f]
    if missing:
      raise DataError(f"latents file {path!r} lacks {missing}; it needs 'latent' (N, h, w, c) and 'label' (N,)")
    lat, lab = np.asarray(f["latent"], np.float32), np.asarray(f["label"], np.int32)
  if lat.ndim != 4 or len(lat) != len(lab):
    raise DataError(f"latents file {path!r}: 'latent' must be (N, h, w, c) with one label per row, got "
                    f"{lat.shape} and {lab.shape}")
  n, h, w, c = lat.shape
  return {"tokens": lat.reshape(n, h * w, c) * float(scale), "label": lab, "grid": (h, w)}
