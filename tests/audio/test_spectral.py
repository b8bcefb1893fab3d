"""Tests of jaxlab.audio.spectral against scipy.signal.ShortTimeFFT, a brute-force DFT, librosa's mel filterbank (when
installed) and hand-computed values."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.io.wavfile
import scipy.signal

from jaxlab.audio import spectral
from jaxlab.errors import ConfigError, DataError


def _noise(shape, seed=0):
  return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape).astype(np.float32)


def _tone(sr=8000, t=4096, f0=220.0, partials=5):
  time = np.arange(t) / sr
  return (0.3 * sum(np.sin(2 * np.pi * f0 * k * time + k) / k for k in range(1, partials + 1))).astype(np.float32)


def test_hann_is_scipys_periodic_hann():
  for n in (1, 2, 7, 64, 400):
    np.testing.assert_allclose(spectral.hann(n), scipy.signal.get_window("hann", n, fftbins=True), atol=1e-7)
  assert spectral.hann(8).dtype == np.float32


@pytest.mark.parametrize("n_fft,hop", [(64, 16), (64, 32), (128, 48)])
def test_stft_matches_scipy_short_time_fft(n_fft, hop):
  """Index mapping to scipy's ShortTimeFFT (win of even length n_fft, so m_num_mid = n_fft // 2).

  scipy's slice p covers x[p * hop - n_fft // 2 : p * hop + n_fft // 2] (centred on sample p * hop; samples outside
  the signal come from `padding`), and column q of `ShortTimeFFT.stft(x)` is slice p = q + p_min (p_min <= 0). Our
  centred frame p covers the reflect-padded signal xp[p * hop : p * hop + n_fft] = x[p * hop - n_fft // 2 : ...],
  the same slice, so OUR frame p is scipy's column p - p_min. With phase_shift=None scipy's DFT is frame-local (the
  phase refers to the slice's first sample), as our rfft of the windowed frame, so the complex values agree.

  1. padding="even" is numpy's "reflect" (mirror without repeating the edge sample): all frames agree.
  2. default zero padding: frames whose window lies inside the signal agree; they are scipy's slices
     lower_border_end[1] <= p < upper_border_begin(T)[1] (both are slice indices p, not columns).
  """
  t = 700
  x = _noise((t,)).astype(np.float64)
  sft = scipy.signal.ShortTimeFFT(win=scipy.signal.get_window("hann", n_fft), hop=hop, fs=1, fft_mode="onesided",
                                  mfft=n_fft, scale_to=None, phase_shift=None)
  assert sft.m_num_mid == n_fft // 2 and sft.p_min <= 0
  ours = np.asarray(spectral.stft(x.astype(np.float32), n_fft, hop)).T  # (freqs, frames), as scipy
  frames = 1 + t // hop
  assert ours.shape == (n_fft // 2 + 1, frames)
  q0 = -sft.p_min  # scipy column of slice p = 0

  reflected = sft.stft(x, padding="even")
  np.testing.assert_allclose(ours, reflected[:, q0:q0 + frames], atol=1e-4)

  zero_padded = sft.stft(x)
  p_lo, p_hi = sft.lower_border_end[1], sft.upper_border_begin(t)[1]
  assert 0 < p_lo < p_hi <= frames
  for p in range(p_lo, p_hi):
    assert p * hop - n_fft // 2 >= 0 and p * hop + n_fft // 2 <= t  # the slice lies fully inside x
  np.testing.assert_allclose(ours[:, p_lo:p_hi], zero_padded[:, p_lo - sft.p_min:p_hi - sft.p_min], atol=1e-4)
  assert np.abs(ours[:, 0] - zero_padded[:, q0]).max() > 1e-2  # the edge frames differ: reflect vs zeros


def test_stft_brute_force_dft_and_center_false():
  n_fft, hop = 8, 3
  x = _noise((2, 3, 20), seed=1)
  w = spectral.hann(n_fft).astype(np.float64)
  k = np.arange(n_fft // 2 + 1)[:, None]
  n = np.arange(n_fft)[None, :]
  dft = np.exp(-2j * np.pi * k * n / n_fft)  # (freqs, n_fft)

  ours = np.asarray(spectral.stft(x, n_fft, hop, center=False))
  frames = 1 + (20 - n_fft) // hop
  assert ours.shape == (2, 3, frames, n_fft // 2 + 1) and ours.dtype == np.complex64
  for p in range(frames):
    want = (x[..., p * hop:p * hop + n_fft] * w) @ dft.T
    np.testing.assert_allclose(ours[..., p, :], want, atol=1e-5)

  centred = np.asarray(spectral.stft(x, n_fft, hop))
  assert centred.shape == (2, 3, 1 + 20 // hop, n_fft // 2 + 1)
  xp = np.pad(x, [(0, 0), (0, 0), (4, 4)], mode="reflect")
  for p in range(centred.shape[-2]):
    np.testing.assert_allclose(centred[..., p, :], (xp[..., p * hop:p * hop + n_fft] * w) @ dft.T, atol=1e-5)


@pytest.mark.parametrize("n_fft,hop", [(64, 16), (64, 32), (256, 64), (256, 128)])
def test_istft_round_trip(n_fft, hop):
  t = 1000  # not a multiple of hop: the last samples sit near the edge of the last frames
  x = _noise((2, t), seed=n_fft + hop)
  y = jax.jit(lambda v: spectral.istft(spectral.stft(v, n_fft, hop), n_fft, hop, length=t))(x)
  assert y.shape == x.shape and y.dtype == jnp.float32
  assert float(jnp.max(jnp.abs(y - x))) < 1e-5


def test_istft_default_length_and_center_false():
  n_fft, hop, t = 64, 16, 1000
  x = _noise((t,), seed=3)
  y = spectral.istft(spectral.stft(x, n_fft, hop), n_fft, hop)
  assert y.shape == (hop * (t // hop),)  # frames cover hop * (frames - 1) samples once the padding is trimmed
  np.testing.assert_allclose(y, x[:y.shape[0]], atol=1e-5)
  y = spectral.istft(spectral.stft(x, n_fft, hop, center=False), n_fft, hop, center=False, length=t + 20)
  inner = slice(1, n_fft + hop * ((t - n_fft) // hop) - 1)  # w[0] = 0: the very first sample is not covered
  np.testing.assert_allclose(y[inner], x[inner], atol=1e-5)
  assert y.shape == (t + 20,) and float(jnp.abs(y[-20:]).max()) == 0.0


def test_stft_istft_jit():
  x = _noise((3, 512), seed=4)
  f = jax.jit(lambda v: spectral.istft(spectral.stft(v, 64, 16), 64, 16, length=512))
  np.testing.assert_allclose(f(x), x, atol=1e-5)


def test_mel_scale_hand_values():
  assert spectral.hz_to_mel(1000.0) == pytest.approx(15.0)
  assert spectral.hz_to_mel(200.0) == pytest.approx(3.0)  # 200 / (200 / 3)
  assert spectral.hz_to_mel(6400.0) == pytest.approx(15.0 + 27.0)  # 27 mels per factor 6.4 above 1 kHz
  assert spectral.hz_to_mel(1000.0, htk=True) == pytest.approx(2595.0 * np.log10(1.0 + 1000.0 / 700.0))
  assert spectral.hz_to_mel(1000.0, htk=True) == pytest.approx(1000.0, abs=0.1)
  f = np.array([0.0, 55.0, 999.0, 1000.0, 4321.0, 11025.0])
  for htk in (False, True):
    np.testing.assert_allclose(spectral.mel_to_hz(spectral.hz_to_mel(f, htk), htk), f, rtol=1e-12, atol=1e-9)


def test_mel_filterbank_properties():
  sr, n_fft, n_mels = 8000, 256, 24
  fb = spectral.mel_filterbank(sr, n_fft, n_mels, norm=None)
  assert fb.shape == (n_fft // 2 + 1, n_mels) and fb.dtype == np.float32
  assert fb.min() >= 0.0 and fb.max() <= 1.0 + 1e-6
  np.testing.assert_array_less(0.8, fb.max(axis=0))  # every triangle reaches near its peak on the bin grid
  edges = spectral.mel_to_hz(np.linspace(0.0, spectral.hz_to_mel(sr / 2), n_mels + 2))
  slaney = spectral.mel_filterbank(sr, n_fft, n_mels)
  np.testing.assert_allclose(slaney, fb * (2.0 / (edges[2:] - edges[:-2])), rtol=1e-5)
  peaks = np.argmax(fb, axis=0)
  assert np.all(np.diff(peaks) >= 0)  # the filters go up in frequency


_LIBROSA_CASES = [
    dict(sr=22050, n_fft=2048, n_mels=128),
    dict(sr=16000, n_fft=512, n_mels=40, fmin=20.0, fmax=7600.0, htk=True, norm=None),
    dict(sr=8000, n_fft=256, n_mels=32, fmin=50.0),
    dict(sr=16000, n_fft=400, n_mels=80, htk=True),
]


@pytest.mark.parametrize("kw", _LIBROSA_CASES)
def test_mel_filterbank_matches_librosa(kw):
  librosa = pytest.importorskip("librosa")
  ours = spectral.mel_filterbank(kw["sr"], kw["n_fft"], kw["n_mels"], kw.get("fmin", 0.0), kw.get("fmax"),
                                 htk=kw.get("htk", False), norm=kw.get("norm", "slaney"))
  ref = librosa.filters.mel(sr=kw["sr"], n_fft=kw["n_fft"], n_mels=kw["n_mels"], fmin=kw.get("fmin", 0.0),
                            fmax=kw.get("fmax"), htk=kw.get("htk", False), norm=kw.get("norm", "slaney")).T
  assert ours.shape == ref.shape
  assert np.abs(ours - ref).max() <= 1e-4 * np.abs(ref).max()


def test_mel_spectrogram_and_log_features():
  sr, n_fft, hop, n_mels = 8000, 256, 64, 32
  x = _noise((2, 2048), seed=5)
  mel = spectral.mel_spectrogram(x, sr, n_fft, hop, n_mels)
  want = np.abs(np.asarray(spectral.stft(x, n_fft, hop))) ** 2 @ spectral.mel_filterbank(sr, n_fft, n_mels)
  assert mel.shape == (2, 1 + 2048 // hop, n_mels)
  np.testing.assert_allclose(mel, want, rtol=1e-4, atol=1e-6)
  mag = spectral.mel_spectrogram(x, sr, n_fft, hop, n_mels, power=1.0)
  np.testing.assert_allclose(mag, np.abs(np.asarray(spectral.stft(x, n_fft, hop))) @ spectral.mel_filterbank(
      sr, n_fft, n_mels), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(spectral.log_features(jnp.array([0.0, 1.0, np.e - 1e-5])), [np.log(1e-5), 1e-5, 1.0],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(spectral.log_features(jnp.array([0.0]), eps=1.0), [0.0])


def test_amplitude_to_db():
  s = jnp.array([[1.0, 0.1, 1e-3], [10.0, 0.0, -2.0]])
  np.testing.assert_allclose(spectral.amplitude_to_db(s), [[0.0, -20.0, -60.0], [20.0, -200.0, 20 * np.log10(2)]],
                             rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(spectral.amplitude_to_db(s, ref=10.0)[0], [-20.0, -40.0, -80.0], atol=1e-4)
  clipped = spectral.amplitude_to_db(s, top_db=50.0)
  np.testing.assert_allclose(clipped, [[0.0, -20.0, -30.0], [20.0, -30.0, 20 * np.log10(2)]], atol=1e-4)
  np.testing.assert_allclose(spectral.amplitude_to_db(jnp.array([3j])), [20 * np.log10(3)], atol=1e-4)


def test_ideal_ratio_mask():
  t = jnp.array([3.0, 0.0, 1.0, 0.0]) * jnp.exp(1j * jnp.array([0.3, 1.0, -2.0, 0.0]))
  r = jnp.array([4.0, 2.0, 0.0, 0.0])
  m = spectral.ideal_ratio_mask(t, r)
  np.testing.assert_allclose(m, [9.0 / 25.0, 0.0, 1.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(spectral.ideal_ratio_mask(t, r, power=1.0), [3.0 / 7.0, 0.0, 1.0, 0.0], atol=1e-6)
  big = spectral.ideal_ratio_mask(_noise((3, 5, 7), 1), _noise((3, 5, 7), 2))
  assert float(big.min()) >= 0.0 and float(big.max()) <= 1.0


def _spectral_convergence(y, mag, n_fft, hop):
  return float(jnp.linalg.norm(jnp.abs(spectral.stft(y, n_fft, hop)) - mag) / jnp.linalg.norm(mag))


def test_griffin_lim_converges_on_a_harmonic_tone():
  n_fft, hop, t = 256, 64, 4096
  mag = jnp.abs(spectral.stft(_tone(t=t), n_fft, hop))
  y0 = spectral.griffin_lim(mag, n_fft, hop, n_iter=0, length=t)
  y = spectral.griffin_lim(mag, n_fft, hop, n_iter=32, length=t)
  assert y.shape == (t,) and y.dtype == jnp.float32
  sc0, sc = _spectral_convergence(y0, mag, n_fft, hop), _spectral_convergence(y, mag, n_fft, hop)
  assert sc < 0.1 and sc < 0.5 * sc0, (sc, sc0)
  batched = spectral.griffin_lim(jnp.stack([mag, 2 * mag]), n_fft, hop, n_iter=4, key=jax.random.PRNGKey(0))
  assert batched.shape == (2, hop * (mag.shape[0] - 1)) and bool(jnp.all(jnp.isfinite(batched)))


def test_mel_to_linear():
  sr, n_fft, n_mels = 8000, 256, 32
  fb = spectral.mel_filterbank(sr, n_fft, n_mels)
  lin = np.abs(_noise((2, 10, n_fft // 2 + 1), 6)) ** 2
  mel = lin @ fb
  out = spectral.mel_to_linear(mel, fb)
  assert out.shape == lin.shape and float(out.min()) >= 0.0
  want = np.maximum(mel.astype(np.float64) @ np.linalg.pinv(fb.astype(np.float64)), 0.0)
  np.testing.assert_allclose(out, want, atol=1e-3 * want.max())
  # Before clipping the pseudo-inverse reproduces the mel energies (fb has full column rank).
  np.testing.assert_allclose(mel @ np.linalg.pinv(fb.astype(np.float64)) @ fb, mel, rtol=1e-3, atol=1e-4)


def test_write_wav(tmp_path):
  sr = 8000
  x = np.sin(2 * np.pi * 440 * np.arange(800) / sr) * 0.5
  path = spectral.write_wav(str(tmp_path / "new" / "dir" / "a.wav"), x, sr)
  assert path == str(tmp_path / "new" / "dir" / "a.wav")
  rate, data = scipy.io.wavfile.read(path)
  assert rate == sr and data.dtype == np.int16 and data.shape == (800,)
  np.testing.assert_allclose(data / 32767.0, x, atol=1.0 / 32767)
  loud = np.array([0.0, 2.0, -4.0, 1.0])
  rate, data = scipy.io.wavfile.read(spectral.write_wav(str(tmp_path / "b.wav"), loud, sr))
  np.testing.assert_array_equal(data, np.round(loud / 4.0 * 32767).astype(np.int16))
  stereo = np.stack([x, -x], axis=1)
  assert scipy.io.wavfile.read(spectral.write_wav(str(tmp_path / "c.wav"), stereo, sr))[1].shape == (800, 2)
  assert sorted(os.listdir(tmp_path)) == ["b.wav", "c.wav", "new"]  # no temporary files left behind
  with pytest.raises(DataError):
    spectral.write_wav(str(tmp_path / "d.wav"), np.array([0.0, np.nan]), sr)
  with pytest.raises(ConfigError):
    spectral.write_wav(str(tmp_path / "d.wav"), x, 0)
  assert not (tmp_path / "d.wav").exists()


def test_errors():
  x = _noise((100,))
  with pytest.raises(ConfigError):
    spectral.stft(x, 0, 16)
  with pytest.raises(ConfigError):
    spectral.stft(x, 32, 64)
  with pytest.raises(ConfigError):
    spectral.stft(x, 32, 8, window=np.ones(31))
  with pytest.raises(DataError):
    spectral.stft(x[:10], 32, 8)
  with pytest.raises(DataError):
    spectral.stft(x[:20], 32, 8, center=False)
  with pytest.raises(DataError):
    spectral.stft(x.astype(np.complex64), 32, 8)
  with pytest.raises(DataError):
    spectral.istft(jnp.zeros((5, 16), jnp.complex64), 32, 8)
  with pytest.raises(ConfigError):
    spectral.mel_filterbank(8000, 256, 16, fmax=5000.0)
  with pytest.raises(ConfigError):
    spectral.mel_filterbank(8000, 256, 16, norm="l2")
  with pytest.raises(DataError):
    spectral.ideal_ratio_mask(jnp.ones(3), jnp.ones(4))
  with pytest.raises(ConfigError):
    spectral.griffin_lim(jnp.ones((10, 17)), 32, 8, momentum=1.0)
  with pytest.raises(DataError):
    spectral.griffin_lim(jnp.ones((10, 16)), 32, 8)
  with pytest.raises(DataError):
    spectral.mel_to_linear(jnp.ones((4, 5)), np.ones((17, 6)))


def test_log_filterbank_is_geometric_and_shift_invariant():
  from jaxlab.audio import features
  fb = spectral.log_filterbank(8000, 1024, 32, 100.0, 4000.0)
  edges = np.geomspace(100.0, 4000.0, 34)
  bins = np.arange(513) * 8000 / 1024
  assert fb.shape == (513, 32) and np.all(fb.max(axis=0) > 0.5)
  for m in (3, 17, 30):                 # each filter peaks at the bin nearest its centre edge
    assert abs(bins[np.argmax(fb[:, m])] - edges[m + 1]) <= 8000 / 1024
  f = features.LogMel(scale="log", n_fft=1024, hop=512, frames=16, fmin=100.0)
  np.testing.assert_allclose(f.centres_hz, edges[1:-1])
  ratio = np.log(f.centres_hz[1:] / f.centres_hz[:-1])
  np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)           # equal steps in log-frequency
  with pytest.raises(ConfigError, match="0 < fmin"):
    spectral.log_filterbank(8000, 1024, 32, 0.0, 4000.0)
