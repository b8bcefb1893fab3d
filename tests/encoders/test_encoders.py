"""Latent encoders: the pixel-downsample control against a brute-force loop, the normaliser's statistics and
pixel-norm matching, the semantic encoder learns its classes, precomputed latents by row."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import encoders
from jaxlab.data import synthetic
from jaxlab.errors import ConfigError, DataError


def test_pixel_downsample_matches_a_loop():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 16, 16, 3)).astype(np.float32)
  enc = encoders.PixelDownsample(factor=2, grid=(4, 4))
  z = np.asarray(enc.encode(jnp.asarray(x)))
  assert z.shape == (2, 4, 4, enc.channels(3, (16, 16))) == (2, 4, 4, 12)
  pooled = x.reshape(2, 8, 2, 8, 2, 3).mean(axis=(2, 4))
  for b in range(2):
    for i in range(4):
      for j in range(4):
        patch = pooled[b, 2 * i:2 * i + 2, 2 * j:2 * j + 2]     # (2, 2, 3), row-major then channels
        np.testing.assert_allclose(z[b, i, j], patch.reshape(-1), rtol=1e-6, atol=1e-6)   # float32 means
  with pytest.raises(ConfigError, match="must divide"):
    encoders.PixelDownsample(factor=3, grid=(4, 4)).encode(jnp.asarray(x))


def test_normalizer_standardises_and_matches_the_pixel_norm():
  rng = np.random.default_rng(1)
  z = rng.standard_normal((64, 4, 4, 5)) * np.arange(1, 6) + np.arange(5)
  pixels = rng.uniform(-1, 1, (64, 8, 8, 1))
  norm = encoders.LatentNormalizer.fit(z, pixels)
  assert norm.scale == pytest.approx(np.sqrt(np.mean(pixels ** 2)))
  out = np.asarray(norm(jnp.asarray(z, jnp.float32)))
  np.testing.assert_allclose(out.reshape(-1, 5).mean(0), 0, atol=1e-5)
  np.testing.assert_allclose(out.reshape(-1, 5).std(0), norm.scale, rtol=1e-4)
  np.testing.assert_allclose(np.asarray(norm.invert(jnp.asarray(out))), z, rtol=1e-4, atol=1e-4)
  assert encoders.match_pixel_norm(np.full((3, 3), -0.5)) == pytest.approx(0.5)
  with pytest.raises(DataError, match="NaN"):
    encoders.LatentNormalizer.fit(np.full((4, 2), np.nan))


def test_semantic_encoder_learns_the_digit_classes():
  tr = synthetic.digits("train", value_range=(-1, 1))
  enc, acc = encoders.train_semantic_encoder(tr["image"], tr["label"], channels=8, steps=800, seed=0)
  assert acc > 0.9
  z = encoders.encode_batched(enc.encode, tr["image"][:300], batch_size=128)
  assert z.shape == (300, 4, 4, 8) and np.all(z >= 0)
  a, _ = encoders.train_semantic_encoder(tr["image"], tr["label"], channels=8, steps=20, seed=3)
  b, _ = encoders.train_semantic_encoder(tr["image"], tr["label"], channels=8, steps=20, seed=3)
  x = jnp.asarray(tr["image"][:8])
  np.testing.assert_array_equal(np.asarray(a.encode(x)), np.asarray(b.encode(x)))   # deterministic given the seed


def test_precomputed_latents_by_row(tmp_path):
  z = np.arange(5 * 2 * 2 * 3, dtype=np.float32).reshape(5, 2, 2, 3)
  np.savez(tmp_path / "lat.npz", latents=z, mean=np.zeros(3), std=np.ones(3))
  src = encoders.PrecomputedLatents(str(tmp_path / "lat.npz"))
  assert len(src) == 5 and src.normalizer is not None
  np.testing.assert_array_equal(src[[4, 0]], z[[4, 0]])
  with pytest.raises(DataError, match="outside"):
    src[[5]]
  with pytest.raises(DataError, match="nothing is downloaded"):
    encoders.PrecomputedLatents(str(tmp_path / "missing.npz"))
  np.savez(tmp_path / "bad.npz", x=z)
  with pytest.raises(DataError, match="expected 'latents'"):
    encoders.PrecomputedLatents(str(tmp_path / "bad.npz"))


def test_semantic_encoder_pooled_and_layernorm_latents():
  tr = synthetic.digits("train", value_range=(-1, 1))
  kw = dict(channels=8, steps=30, seed=1)
  relu, _ = encoders.train_semantic_encoder(tr["image"], tr["label"], **kw)
  pooled, _ = encoders.train_semantic_encoder(tr["image"], tr["label"], pool=2, **kw)
  ln, _ = encoders.train_semantic_encoder(tr["image"], tr["label"], pool=4, latent="layernorm", **kw)
  x = jnp.asarray(tr["image"][:16])
  z = np.asarray(relu.encode(x))
  zp = np.asarray(pooled.encode(x))                       # same weights (same seed and data): the 2 x 2 means
  assert zp.shape == (16, 2, 2, 8)
  np.testing.assert_allclose(zp, z.reshape(16, 2, 2, 2, 2, 8).mean(axis=(2, 4)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(pooled(x)), np.asarray(relu(x)), rtol=1e-5, atol=1e-6)  # same classifier
  h = np.asarray(ln.features(x)).mean(axis=(1, 2), keepdims=True)                    # pre-ReLU, pooled to 1 x 1
  want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(np.asarray(ln.encode(x)), want, rtol=1e-4, atol=1e-5)
  with pytest.raises(DataError, match="latent='gelu'"):
    encoders.TinySemanticEncoder(1, 4, 10, latent="gelu", rngs=__import__("flax").nnx.Rngs(0))
