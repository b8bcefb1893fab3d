"""Stem priors (`jaxlab.audio.separation`) and the paired guidance layout of `jaxlab.audio.model`.

The Gaussian blur against scipy.ndimage, the imperfect separator's stages (threshold, flip rate, softening), the
Demucs wrapper's errors (and a real separation where the optional `demucs` extra is installed), and
`paired_guided_denoiser`: without a controller each half equals `guided_denoiser` on that half; a calibration
with a prior of ones and gamma 0 leaves the target half as the plain target edit; the controller sees source
branches in its first half."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import ndimage

from jaxlab.audio import features, separation, synth
from jaxlab.audio import model as model_lib
from jaxlab.diffusion import controllers as ctl
from jaxlab.errors import ConfigError, DataError

from test_audio_model import CFG, batch, random_model


@pytest.mark.parametrize("sigma", [0.7, 1.0, 1.5])
def test_gaussian_blur_matches_scipy(sigma):
  m = np.random.default_rng(0).uniform(size=(3, 12, 9)).astype(np.float32)
  ours = np.asarray(separation.gaussian_blur(m, sigma))
  ref = np.stack([ndimage.gaussian_filter(x, sigma, mode="mirror", truncate=3.0) for x in m])
  np.testing.assert_allclose(ours, ref, atol=1e-5)
  assert separation.gaussian_blur(m, 0.0) is not None
  np.testing.assert_array_equal(np.asarray(separation.gaussian_blur(m, 0.0)), m)


def test_imperfect_mask_stages():
  irm = np.random.default_rng(1).uniform(size=(64, 32, 16)).astype(np.float32)
  key = jax.random.key(0)
  exact = np.asarray(separation.imperfect_mask(key, irm, blur=0.0, flip=0.0, soften=0.0))
  np.testing.assert_array_equal(exact, (irm >= 0.5).astype(np.float32))
  flipped = np.asarray(separation.imperfect_mask(key, irm, blur=0.0, flip=0.1, soften=0.0))
  rate = np.mean(flipped != exact)
  assert abs(rate - 0.1) < 4 * np.sqrt(0.1 * 0.9 / irm.size)
  soft = np.asarray(separation.imperfect_mask(key, irm, blur=1.0, flip=0.1, soften=1.0))
  assert soft.min() >= 0 and soft.max() <= 1 and 0 < np.mean((soft > 0) & (soft < 1))
  with pytest.raises(ConfigError, match="0 <= flip <= 1"):
    separation.imperfect_mask(key, irm, flip=1.5)
  with pytest.raises(DataError, match="freq, time"):
    separation.imperfect_mask(key, irm[0, 0])


def test_imperfect_mask_of_a_rendered_stem_overlaps_the_oracle():
  f = features.LogMel(n_fft=1024, hop=512, n_mels=32, frames=16, fmin=100.0, fmax=4000.0, scale="log")
  stems = synth.sample_clip(5, num_pitched=1, drums_prob=1.0)
  mix, per = synth.render_mixture(stems, sr=f.sr, duration=f.clip_seconds)
  irm = np.asarray(f.stem_mask(per[0], mix - per[0]))
  m = np.asarray(separation.imperfect_mask(jax.random.key(0), irm[None], flip=0.1))[0]
  iou = np.sum((m >= 0.5) & (irm >= 0.5)) / np.sum((m >= 0.5) | (irm >= 0.5))
  assert 0.5 < iou < 1.0


@pytest.mark.skipif(separation.demucs_available(), reason="checks the message shown when demucs is missing")
def test_demucs_missing_is_a_clear_error(tmp_path):
  with pytest.raises(ConfigError, match=r"jaxlab\[demucs\]"):
    separation.demucs_separate(str(tmp_path / "mix.wav"), str(tmp_path), stem="vocals")


@pytest.mark.skipif(not separation.demucs_available(), reason="the optional `demucs` extra (torch) is not installed")
def test_demucs_prior_on_a_rendered_mixture(tmp_path):
  f = features.LogMel(sr=16000, clip_seconds=2.048, n_fft=1024, hop=512, n_mels=32, frames=32)
  stems = synth.sample_clip(3, num_pitched=1, drums_prob=1.0, sr=f.sr, duration=f.clip_seconds)
  mix, _ = synth.render_mixture(stems, sr=f.sr, duration=f.clip_seconds)
  m = separation.demucs_prior(f, mix, str(tmp_path), stem="drums")
  assert m.shape == (32, 32) and np.all((m >= 0) & (m <= 1))
  assert os.path.isfile(tmp_path / "mix.wav")


def test_paired_guided_denoiser_halves_equal_guided_denoiser():
  m = random_model()
  x, tokens = batch(4)
  src, tgt = tokens[:2], jnp.roll(tokens[:2], 1, axis=1).at[:, 1].set(-1).at[:, 0].set(jnp.asarray([2, 3]))
  both = jnp.concatenate([src, tgt])
  xx = jnp.concatenate([x[:2], x[:2]])
  t = jnp.full((4,), 40, jnp.int32)
  scale = jnp.asarray([1.0, 1.0, 3.0, 3.0])
  ctx = {"prior": jnp.ones((2, CFG.grid[0] * CFG.grid[1])), "target": jnp.zeros((2,), jnp.int32)}
  seen = []

  def spy(lg, layer, step, c):
    seen.append((lg.shape[0], c["prior"].shape[0]))
    return lg

  @jax.jit
  def run(xx, t):
    """Every denoiser call below in one compiled program (eagerly, each batch shape compiles every op anew)."""
    return (model_lib.paired_guided_denoiser(m, both, scale)(xx, t),
            model_lib.guided_denoiser(m, src, 1.0)(xx[:2], t[:2]),
            model_lib.guided_denoiser(m, tgt, 3.0)(xx[:2], t[:2]),
            # Calibration with M = 1 and gamma = 0 is the plain target logits: the target half is unchanged.
            model_lib.paired_guided_denoiser(m, both, scale, controller=ctl.calibrate(gamma=0.0), ctx=ctx)(xx, t),
            model_lib.paired_guided_denoiser(m, both, scale, controller=spy, ctx=ctx)(xx, t))

  paired, plain_src, plain_tgt, calibrated, spied = run(xx, t)
  np.testing.assert_allclose(paired[:2], plain_src, atol=2e-5)
  np.testing.assert_allclose(paired[2:], plain_tgt, atol=2e-5)
  np.testing.assert_allclose(calibrated, paired, atol=2e-5)
  np.testing.assert_array_equal(spied, paired)           # the spy only looks
  assert seen == [(8, 4)] * CFG.depth        # [src cond; src uncond; tgt cond; tgt uncond], prior per branch
