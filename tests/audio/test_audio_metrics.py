"""Tests of jaxlab.audio.metrics: hand-computed LSD / SDR / SI-SDR values, BSS-Eval SDR against mir_eval (when
installed) and FAD through the repo's Frechet distance."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.audio import metrics
from jaxlab.errors import ConfigError, DataError
from jaxlab.evals.frechet import frechet_from_features


def test_log_spectral_distance_hand_values():
  a = jnp.array([[[0.0, 1.0], [2.0, 3.0]], [[1.0, 1.0], [1.0, 1.0]]])  # (2 examples, 2 frames, 2 bins)
  b = jnp.zeros_like(a)
  np.testing.assert_allclose(metrics.log_spectral_distance(a, b), [math.sqrt(14.0 / 4.0), 1.0], rtol=1e-6)
  mask = jnp.array([[True, False], [True, True]])  # broadcast over examples
  np.testing.assert_allclose(metrics.log_spectral_distance(a, b, mask=mask), [math.sqrt(13.0 / 3.0), 1.0],
                             rtol=1e-6)
  weights = jnp.array([[[1, 1], [0, 0]], [[0, 0], [0, 0]]])  # {0, 1} weights, the 2nd example fully masked out
  out = np.asarray(metrics.log_spectral_distance(a, b, mask=weights))
  assert out[0] == pytest.approx(math.sqrt(0.5)) and np.isnan(out[1])
  np.testing.assert_allclose(metrics.log_spectral_distance(a, b, axis=-1), [[1.0 / math.sqrt(2.0), math.sqrt(6.5)],
                                                                            [1.0, 1.0]], rtol=1e-6)
  assert float(metrics.log_spectral_distance(a, a).max()) == 0.0
  with pytest.raises(DataError):
    metrics.log_spectral_distance(a, b[:1])
  with pytest.raises(DataError):
    metrics.log_spectral_distance(a, b, mask=jnp.ones(3, bool))


def test_sdr_hand_values():
  ref = jnp.array([[1.0, 0.0, 0.0], [1.0, 2.0, 2.0]])
  est = jnp.array([[0.5, 0.0, 0.0], [1.0, 2.0, 1.0]])
  np.testing.assert_allclose(metrics.sdr(ref, est), [10 * math.log10(1 / 0.25), 10 * math.log10(9.0)], rtol=1e-5)
  assert float(metrics.sdr(ref, ref)[0]) > 70.0  # perfect: 10 log10(||ref||^2 / eps), large and finite


def test_si_sdr_hand_values_and_invariances():
  ref = jnp.array([1.0, -1.0, 1.0, -1.0])  # zero mean
  noise = jnp.array([1.0, 1.0, -1.0, -1.0])  # zero mean and orthogonal to ref
  est = 2.0 * ref + noise
  want = 10 * math.log10(16.0 / 4.0)  # alpha = 2: ||2 ref||^2 = 16, ||2 ref - est||^2 = ||noise||^2 = 4
  assert float(metrics.si_sdr(ref, est)) == pytest.approx(want, rel=1e-5)
  assert float(metrics.si_sdr(ref, 3.0 * est)) == pytest.approx(want, rel=1e-5)  # scale invariance
  assert float(metrics.si_sdr(ref, est + 5.0)) == pytest.approx(want, rel=1e-5)  # mean removed
  assert float(metrics.si_sdr(ref, est + 5.0, zero_mean=False)) < want - 3.0
  assert float(metrics.si_sdr(ref, est, zero_mean=False)) == pytest.approx(want, rel=1e-5)
  batch = metrics.si_sdr(jnp.stack([ref, ref]), jnp.stack([est, -est]))
  assert batch.shape == (2,) and float(batch[0]) == pytest.approx(want, rel=1e-5)
  with pytest.raises(DataError):
    metrics.si_sdr(ref, est[:3])


def _signals(t, seed):
  rng = np.random.default_rng(seed)
  ref = rng.normal(size=t)
  filt = np.convolve(ref, [0.6, 0.25, -0.3, 0.1])[:t]
  return ref, filt, rng.normal(size=t)


def test_bss_eval_sdr_without_mir_eval():
  ref, filt, noise = _signals(1500, 0)
  # One tap: the projection is alpha * ref, so the SDR is the SI-SDR without mean removal.
  est = filt + 0.3 * noise
  si = float(metrics.si_sdr(ref, est, zero_mean=False))
  assert metrics.bss_eval_sdr(ref, est, filter_len=1) == pytest.approx(si, abs=1e-3)
  # A filter of <= filter_len taps is fully allowed: only the added noise counts, so SDR rises with filter_len.
  assert metrics.bss_eval_sdr(ref, est, filter_len=8) > metrics.bss_eval_sdr(ref, est, filter_len=1) + 3.0
  ref[-10:] = 0.0  # so the filtered copy is not truncated at the end
  exact = np.convolve(ref, [0.6, 0.25, -0.3, 0.1])[:1500]
  assert metrics.bss_eval_sdr(ref, exact, filter_len=16) > 100.0
  with pytest.raises(DataError):
    metrics.bss_eval_sdr(np.zeros(10), np.ones(10))
  with pytest.raises(DataError):
    metrics.bss_eval_sdr(ref[None], est[None])
  with pytest.raises(ConfigError):
    metrics.bss_eval_sdr(ref, est, filter_len=0)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # mir_eval 0.8 deprecates bss_eval_sources (kept through 0.8.x)
@pytest.mark.parametrize("seed,t", [(1, 2000), (2, 3001)])
def test_bss_eval_sdr_matches_mir_eval(seed, t):
  mir_eval = pytest.importorskip("mir_eval")
  ref, filt, noise = _signals(t, seed)
  for est in (filt + 0.5 * noise, 0.2 * ref + noise, np.roll(ref, 7) + 0.1 * noise):
    want = mir_eval.separation.bss_eval_sources(ref[None], est[None])[0][0]
    assert metrics.bss_eval_sdr(ref, est) == pytest.approx(want, abs=1e-2)


def test_frechet_audio_distance():
  rng = np.random.default_rng(0)
  a = rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6))
  b = rng.normal(size=(150, 6)) + 0.5
  assert metrics.frechet_audio_distance(a, b) == frechet_from_features(a, b)
  assert metrics.frechet_audio_distance(a, a) == pytest.approx(0.0, abs=1e-6)
  shift = np.array([1.0, -2.0, 0.5, 0.0, 3.0, 1.0])
  # Same covariance, means differing by shift: FD = ||shift||^2 (the trace term vanishes).
  assert metrics.frechet_audio_distance(a, a + shift) == pytest.approx(float(shift @ shift), rel=1e-5, abs=1e-5)
  with pytest.raises(DataError):
    metrics.frechet_audio_distance(a, b[:, :5])
