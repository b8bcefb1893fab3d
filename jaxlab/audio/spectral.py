"""Spectral front end for audio models: STFT / inverse STFT, mel filterbanks, log features, masks, Griffin-Lim.

Everything that touches signals is pure JAX (float32 / complex64), jit-able and batched over any leading dims; the
filterbank and window constructors return numpy float32 constants. Conventions:

* `hann(n)`: the periodic Hann window w[k] = 0.5 - 0.5 cos(2 pi k / n), k = 0..n-1 (scipy.signal.get_window("hann",
  n), i.e. fftbins=True), whose squared shifted copies sum to a constant for hop = n / 4 and n / 2.
* `stft`: frames of n_fft samples every `hop` samples, multiplied by the window, then a one-sided frame-local DFT
  (`jnp.fft.rfft`, the phase is relative to each frame's first sample, as scipy.signal.ShortTimeFFT with
  phase_shift=None). With center=True the signal is first padded by n_fft // 2 samples on both sides by REFLECTION
  (without repeating the edge sample: numpy's "reflect", scipy's "even" extension), the convention of librosa and
  torch.stft, so frame p is centred on sample p * hop and there are 1 + T // hop frames (even n_fft); with
  center=False there are 1 + (T - n_fft) // hop frames, the first starting at sample 0. Output (..., frames,
  n_fft // 2 + 1).
* `istft`: the least-squares (weighted overlap-add) inverse of Griffin & Lim (1984): y = sum_p w * frame_p /
  sum_p w^2 where the denominator exceeds the smallest normal float32, then the centre padding is trimmed and the
  result cut / zero-padded to `length`. stft -> istft reproduces the signal (to float32 round-off) for any window
  whose squared overlap-add has no zeros inside the signal (Hann with hop <= n_fft / 2).
* `mel_filterbank`: triangular filters equally spaced on the mel scale between fmin and fmax, the construction of
  Slaney's Auditory Toolbox as implemented by librosa.filters.mel: n_mels + 2 mel-spaced edge frequencies
  f_0 < ... < f_{n_mels+1}; filter m rises linearly from f_m to f_{m+1} and falls to f_{m+2} (evaluated at the
  rfft bin frequencies k sr / n_fft); norm="slaney" scales it by 2 / (f_{m+2} - f_m) (constant area), norm=None
  leaves peak 1. The mel scale is Slaney's (linear 3 bins / 200 Hz below 1 kHz, then logarithmic with 27 bins per
  factor 6.4) or, with htk=True, the HTK formula mel = 2595 log10(1 + f / 700) (Young et al., the HTK Book).
* `log_features`: natural log(s + eps), the "log-magnitude" features models are trained on; `amplitude_to_db` is
  20 log10 for plots (librosa's amplitude_to_db convention, with a floor `amin` and an optional dynamic range).
* `ideal_ratio_mask`: |T|^p / (|T|^p + |R|^p + eps) (Narayanan & Wang 2013; Wang, Narayanan & Wang 2014).
* `griffin_lim`: the fast Griffin-Lim algorithm of Perraudin, Balazs & Sondergaard (2013), "A fast Griffin-Lim
  algorithm": t_n = P_C1(P_C2(c_{n-1})), c_n = t_n + alpha (t_n - t_{n-1}), with P_C2 the projection on the given
  magnitude (keep the phase) and P_C1 = stft(istft(.)) the projection on consistent spectrograms; alpha = 0 is the
  original Griffin & Lim (1984) iteration.
* `mel_to_linear`: a non-negative pseudo-inverse of the mel filterbank, max(mel @ pinv(fb), 0), for listening to
  mel spectrograms (through Griffin-Lim); `write_wav`: 16-bit PCM files (scipy.io.wavfile) written atomically.
"""

from __future__ import annotations

import functools
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError, DataError

_TINY = float(np.finfo(np.float32).tiny)

# Slaney's mel scale: linear below 1 kHz (f_sp Hz per mel), logarithmic above (27 mels per factor 6.4).
_F_SP = 200.0 / 3.0
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def hann(n: int) -> np.ndarray:
  """The periodic Hann window of length n: 0.5 - 0.5 cos(2 pi k / n), k = 0..n-1 (numpy float32; [1] for n = 1).

  Raises:
    ConfigError: n < 1.
  """
  n = _positive_int(n, "hann: n")
  if n == 1:
    return np.ones(1, np.float32)  # as scipy: a one-sample window is 1
  return (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)).astype(np.float32)


def _positive_int(v, name: str) -> int:
  if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
    raise ConfigError(f"{name} must be a positive integer, got {v!r}")
  return int(v)


def _check_fft(n_fft, hop, fn: str) -> tuple[int, int]:
  n_fft = _positive_int(n_fft, f"{fn}: n_fft")
  hop = _positive_int(hop, f"{fn}: hop")
  if hop > n_fft:
    raise ConfigError(f"{fn}: hop {hop} is larger than n_fft {n_fft}; samples would be skipped, use hop <= n_fft")
  return n_fft, hop


def _window(window, n_fft: int, fn: str) -> jax.Array:
  if window is None:
    return jnp.asarray(hann(n_fft))
  w = jnp.asarray(window, jnp.float32)
  if w.shape != (n_fft,):
    raise ConfigError(f"{fn}: window has shape {w.shape}; pass a 1-D window of n_fft = {n_fft} samples")
  return w


def _frame_index(n_frames: int, n_fft: int, hop: int) -> np.ndarray:
  return hop * np.arange(n_frames)[:, None] + np.arange(n_fft)[None, :]


def stft(x, n_fft: int, hop: int, *, window=None, center: bool = True) -> jax.Array:
  """Short-time Fourier transform (one-sided, frame-local phase).

  Args:
    x: (..., T) real signal.
    n_fft: frame (and DFT) length.
    hop: frame step in samples.
    window: (n_fft,) analysis window; default the periodic Hann window.
    center: pad n_fft // 2 samples on both sides by reflection so frame p is centred on sample p * hop.

  Returns:
    complex64 (..., frames, n_fft // 2 + 1); frames = 1 + (T + 2 (n_fft // 2) - n_fft) // hop when centred (1 + T // hop
    for even n_fft), 1 + (T - n_fft) // hop otherwise.

  Raises:
    ConfigError: bad n_fft / hop / window.
    DataError: a complex or too short signal.
  """
  n_fft, hop = _check_fft(n_fft, hop, "stft")
  w = _window(window, n_fft, "stft")
  if jnp.iscomplexobj(x):
    raise DataError("stft: the signal is complex; pass a real waveform (..., T)")
  x = jnp.asarray(x, jnp.float32)
  if x.ndim < 1:
    raise DataError("stft: the signal is a scalar; pass a waveform of shape (..., T)")
  t = x.shape[-1]
  if center:
    pad = n_fft // 2
    if t <= pad:
      raise DataError(f"stft: a signal of {t} samples is too short to reflect-pad by n_fft // 2 = {pad}; "
                      "use a longer signal or a smaller n_fft")
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
  elif t < n_fft:
    raise DataError(f"stft: a signal of {t} samples is shorter than n_fft = {n_fft} with center=False; "
                    "use center=True or a smaller n_fft")
  n_frames = 1 + (x.shape[-1] - n_fft) // hop
  frames = x[..., _frame_index(n_frames, n_fft, hop)]
  return jnp.fft.rfft(frames * w, n=n_fft, axis=-1).astype(jnp.complex64)


def istft(spec, n_fft: int, hop: int, *, window=None, center: bool = True, length: int | None = None) -> jax.Array:
  """Inverse STFT by weighted overlap-add (the least-squares inverse of Griffin & Lim 1984).

  Args:
    spec: complex (..., frames, n_fft // 2 + 1) one-sided STFT (as from `stft` with the same settings).
    n_fft: frame length.
    hop: frame step.
    window: (n_fft,) window; default the periodic Hann window.
    center: trim the n_fft // 2 samples of centre padding at the start (and at the end when length is None).
    length: output length in samples (cut or zero-padded); None keeps all the samples covered by the frames.

  Returns:
    float32 (..., length) waveform.

  Raises:
    ConfigError: bad n_fft / hop / window / length.
    DataError: spec's last axis is not n_fft // 2 + 1 or there are no frames.
  """
  n_fft, hop = _check_fft(n_fft, hop, "istft")
  w = _window(window, n_fft, "istft")
  spec = jnp.asarray(spec)
  if spec.ndim < 2 or spec.shape[-1] != n_fft // 2 + 1 or spec.shape[-2] < 1:
    raise DataError(f"istft: spec has shape {spec.shape}; expected (..., frames >= 1, n_fft // 2 + 1 = "
                    f"{n_fft // 2 + 1})")
  if length is not None:
    length = _positive_int(length, "istft: length")
  n_frames = spec.shape[-2]
  idx = _frame_index(n_frames, n_fft, hop)
  total = n_fft + hop * (n_frames - 1)
  frames = jnp.fft.irfft(spec.astype(jnp.complex64), n=n_fft, axis=-1).astype(jnp.float32) * w
  y = jnp.zeros(spec.shape[:-2] + (total,), jnp.float32).at[..., idx].add(frames)
  wsum = jnp.zeros((total,), jnp.float32).at[idx].add(jnp.broadcast_to(w * w, idx.shape))
  y = jnp.where(wsum > _TINY, y / jnp.where(wsum > _TINY, wsum, 1.0), y)
  start = n_fft // 2 if center else 0
  if length is None:
    stop = total - n_fft // 2 if center else total
    return y[..., start:stop]
  y = y[..., start:start + length]
  if y.shape[-1] < length:
    y = jnp.pad(y, [(0, 0)] * (y.ndim - 1) + [(0, length - y.shape[-1])])
  return y


def hz_to_mel(f, htk: bool = False):
  """Hz -> mel (numpy float64): Slaney's scale (1000 Hz -> 15 mel) or, with htk, 2595 log10(1 + f / 700)."""
  f = np.asarray(f, np.float64)
  if htk:
    return 2595.0 * np.log10(1.0 + f / 700.0)
  lin = f / _F_SP
  log = _MIN_LOG_MEL + np.log(np.maximum(f, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
  return np.where(f >= _MIN_LOG_HZ, log, lin)


def mel_to_hz(m, htk: bool = False):
  """mel -> Hz (numpy float64), the inverse of `hz_to_mel` with the same `htk`."""
  m = np.asarray(m, np.float64)
  if htk:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
  lin = m * _F_SP
  log = _MIN_LOG_HZ * np.exp(_LOGSTEP * (np.maximum(m, _MIN_LOG_MEL) - _MIN_LOG_MEL))
  return np.where(m >= _MIN_LOG_MEL, log, lin)


def mel_filterbank(sr: float, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None, *,
                   htk: bool = False, norm: str | None = "slaney") -> np.ndarray:
  """Triangular mel filterbank (n_fft // 2 + 1, n_mels), numpy float32 (librosa.filters.mel(...).T).

  Args:
    sr: sample rate in Hz.
    n_fft: DFT length (the filters are evaluated at the rfft bin frequencies k sr / n_fft).
    n_mels: number of filters.
    fmin: lowest edge frequency in Hz.
    fmax: highest edge frequency in Hz; default sr / 2.
    htk: use the HTK mel formula instead of Slaney's.
    norm: "slaney" (each triangle times 2 / its bandwidth in Hz) or None (peak 1).

  Returns:
    float32 (n_fft // 2 + 1, n_mels); `power_spec @ fb` gives mel energies.

  Raises:
    ConfigError: non-positive sizes, fmin / fmax outside [0, sr / 2] or fmin >= fmax, unknown norm.
  """
  n_fft = _positive_int(n_fft, "mel_filterbank: n_fft")
  n_mels = _positive_int(n_mels, "mel_filterbank: n_mels")
  if not (isinstance(sr, (int, float, np.integer, np.floating)) and sr > 0):
    raise ConfigError(f"mel_filterbank: sr must be a positive number, got {sr!r}")
  fmax = sr / 2.0 if fmax is None else float(fmax)
  if not 0.0 <= fmin < fmax <= sr / 2.0 + 1e-9:
    raise ConfigError(f"mel_filterbank: need 0 <= fmin < fmax <= sr / 2 = {sr / 2}, got fmin={fmin}, fmax={fmax}")
  if norm not in ("slaney", None):
    raise ConfigError(f"mel_filterbank: norm must be 'slaney' or None, got {norm!r}")
  edges = mel_to_hz(np.linspace(hz_to_mel(fmin, htk), hz_to_mel(fmax, htk), n_mels + 2), htk)
  return _triangles(sr, n_fft, edges, norm)


def log_filterbank(sr: float, n_fft: int, n_bands: int, fmin: float, fmax: float | None = None, *,
                   norm: str | None = None) -> np.ndarray:
  """Triangular filters equally spaced in log-frequency (a constant-Q-like filterbank), (n_fft // 2 + 1, n_bands).

  The n_bands + 2 edges are geometric between fmin > 0 and fmax, so a harmonic series k f0 sits at the same band
  offsets for every f0 (a pitch change is a shift). Filters narrower than the DFT bin spacing sr / n_fft pick up
  only one bin or none: use n_fft >= sr / (fmin (2^(o / (n_bands + 1)) - 1)) for o octaves. Same triangles and
  norms as `mel_filterbank`."""
  n_fft = _positive_int(n_fft, "log_filterbank: n_fft")
  n_bands = _positive_int(n_bands, "log_filterbank: n_bands")
  fmax = sr / 2.0 if fmax is None else float(fmax)
  if not 0.0 < fmin < fmax <= sr / 2.0 + 1e-9:
    raise ConfigError(f"log_filterbank: need 0 < fmin < fmax <= sr / 2 = {sr / 2}, got fmin={fmin}, fmax={fmax}")
  if norm not in ("slaney", None):
    raise ConfigError(f"log_filterbank: norm must be 'slaney' or None, got {norm!r}")
  return _triangles(sr, n_fft, np.geomspace(fmin, fmax, n_bands + 2), norm)


def _triangles(sr: float, n_fft: int, edges: np.ndarray, norm: str | None) -> np.ndarray:
  """Filter m rises from edges[m] to edges[m + 1] and falls to edges[m + 2], evaluated at the rfft bins."""
  bins = np.arange(n_fft // 2 + 1) * (float(sr) / n_fft)
  lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
  rise = (bins[None, :] - lo) / (mid - lo)
  fall = (hi - bins[None, :]) / (hi - mid)
  fb = np.maximum(0.0, np.minimum(rise, fall))
  if norm == "slaney":
    fb = fb * (2.0 / (hi - lo))
  return fb.T.astype(np.float32)


def mel_spectrogram(x, sr: float, n_fft: int, hop: int, n_mels: int, *, fmin: float = 0.0,
                    fmax: float | None = None, power: float = 2.0, center: bool = True) -> jax.Array:
  """Mel spectrogram |stft(x)|^power @ mel_filterbank (Slaney scale and norm), float32 (..., frames, n_mels).

  Raises:
    ConfigError: bad STFT / filterbank settings or power <= 0.
    DataError: a signal `stft` rejects.
  """
  if not power > 0:
    raise ConfigError(f"mel_spectrogram: power must be > 0 (1 = magnitude, 2 = power), got {power}")
  fb = jnp.asarray(mel_filterbank(sr, n_fft, n_mels, fmin, fmax))
  mag = jnp.abs(stft(x, n_fft, hop, center=center))
  spec = mag * mag if power == 2.0 else mag ** power
  return spec @ fb


def log_features(s, *, eps: float = 1e-5) -> jax.Array:
  """Natural log(s + eps) of a non-negative (mel) magnitude or power spectrogram: the log-magnitude features."""
  if not eps > 0:
    raise ConfigError(f"log_features: eps must be > 0, got {eps}")
  return jnp.log(jnp.asarray(s, jnp.float32) + eps)


def amplitude_to_db(s, *, ref: float = 1.0, amin: float = 1e-10, top_db: float | None = None) -> jax.Array:
  """Decibels of a magnitude spectrogram for plots: 20 log10(max(|s|, amin)) - 20 log10(max(ref, amin)).

  Args:
    s: magnitudes (real or complex; the absolute value is used).
    ref: reference amplitude (0 dB).
    amin: floor on magnitudes (and on ref) before the log.
    top_db: if set, values below the maximum minus top_db are raised to it; the maximum is taken per
      spectrogram (over the last two axes) for inputs with >= 2 dims, over the whole array otherwise.

  Raises:
    ConfigError: amin <= 0, ref <= 0 or top_db < 0.
  """
  if not amin > 0 or not ref > 0:
    raise ConfigError(f"amplitude_to_db: amin and ref must be > 0, got amin={amin}, ref={ref}")
  mag = jnp.abs(jnp.asarray(s)).astype(jnp.float32)
  db = 20.0 * jnp.log10(jnp.maximum(mag, amin)) - 20.0 * np.log10(max(ref, amin))
  if top_db is not None:
    if not top_db >= 0:
      raise ConfigError(f"amplitude_to_db: top_db must be >= 0 or None, got {top_db}")
    axes = (-2, -1) if db.ndim >= 2 else None
    db = jnp.maximum(db, jnp.max(db, axis=axes, keepdims=True) - top_db)
  return db


def ideal_ratio_mask(target, rest, *, power: float = 2.0, eps: float = 1e-8) -> jax.Array:
  """Ideal ratio mask |T|^p / (|T|^p + |R|^p + eps) of a target against the rest of the mixture, in [0, 1].

  Args:
    target: STFT (complex) or magnitudes of the target source.
    rest: same shape, the other sources (mixture minus target).
    power: exponent p (2: energy ratio, 1: magnitude ratio).
    eps: keeps all-silent bins at 0.

  Raises:
    ConfigError: power <= 0 or eps < 0.
    DataError: mismatched shapes.
  """
  if not power > 0 or not eps >= 0:
    raise ConfigError(f"ideal_ratio_mask: need power > 0 and eps >= 0, got power={power}, eps={eps}")
  t, r = jnp.abs(jnp.asarray(target)).astype(jnp.float32), jnp.abs(jnp.asarray(rest)).astype(jnp.float32)
  if t.shape != r.shape:
    raise DataError(f"ideal_ratio_mask: target {t.shape} and rest {r.shape} differ; pass spectrograms of one shape")
  tp, rp = t ** power, r ** power
  return tp / (tp + rp + eps)


def _unit_phase(c):
  a = jnp.abs(c)
  return jnp.where(a > _TINY, c / jnp.where(a > _TINY, a, 1.0), jnp.ones_like(c))


@functools.partial(jax.jit, static_argnames=("n_fft", "hop", "n_iter", "length"))
def _griffin_lim(mag, phase0, window, momentum, *, n_fft, hop, n_iter, length):
  t_len = hop * (mag.shape[-2] - 1)  # stft of t_len samples (center=True) has exactly mag.shape[-2] frames

  def project(c):
    y = istft(mag * _unit_phase(c), n_fft, hop, window=window, length=t_len)
    return stft(y, n_fft, hop, window=window)

  def body(_, carry):
    c, t_prev = carry
    t = project(c)
    return t + momentum * (t - t_prev), t

  c0 = mag * phase0
  c, _ = jax.lax.fori_loop(0, n_iter, body, (c0, c0))
  return istft(mag * _unit_phase(c), n_fft, hop, window=window, length=length or t_len)


def griffin_lim(mag, n_fft: int, hop: int, *, n_iter: int = 32, window=None, length: int | None = None,
                momentum: float = 0.99, key=None) -> jax.Array:
  """Fast Griffin-Lim phase reconstruction (Perraudin et al. 2013) from an STFT magnitude to a waveform.

  The spectrogram is assumed to come from `stft(..., center=True)` with the same n_fft, hop and window.

  Args:
    mag: (..., frames, n_fft // 2 + 1) non-negative magnitudes.
    n_fft: frame length.
    hop: frame step.
    n_iter: iterations (0 returns the inverse of the initial phase).
    window: (n_fft,) window; default periodic Hann.
    length: output length; default hop * (frames - 1).
    momentum: alpha of the accelerated update (0: the original Griffin-Lim; Perraudin et al. suggest 0.99).
    key: jax PRNG key for a uniformly random initial phase; None starts from zero phase.

  Returns:
    float32 (..., length) waveform.

  Raises:
    ConfigError: bad sizes, n_iter < 0 or momentum outside [0, 1).
    DataError: mag with the wrong last axis or too few frames.
  """
  n_fft, hop = _check_fft(n_fft, hop, "griffin_lim")
  if isinstance(n_iter, bool) or not isinstance(n_iter, (int, np.integer)) or n_iter < 0:
    raise ConfigError(f"griffin_lim: n_iter must be an integer >= 0, got {n_iter!r}")
  if not 0.0 <= momentum < 1.0:
    raise ConfigError(f"griffin_lim: momentum must be in [0, 1), got {momentum}")
  if length is not None:
    length = _positive_int(length, "griffin_lim: length")
  w = _window(window, n_fft, "griffin_lim")
  mag = jnp.asarray(mag, jnp.float32)
  if mag.ndim < 2 or mag.shape[-1] != n_fft // 2 + 1:
    raise DataError(f"griffin_lim: mag has shape {mag.shape}; expected (..., frames, n_fft // 2 + 1 = "
                    f"{n_fft // 2 + 1})")
  if hop * (mag.shape[-2] - 1) <= n_fft // 2:
    raise DataError(f"griffin_lim: {mag.shape[-2]} frames of hop {hop} are too few for n_fft {n_fft}; need "
                    f"hop * (frames - 1) > n_fft // 2")
  if key is None:
    phase0 = jnp.ones(mag.shape, jnp.complex64)
  else:
    phase0 = jnp.exp(1j * jax.random.uniform(key, mag.shape, jnp.float32, 0.0, 2.0 * np.pi)).astype(jnp.complex64)
  return _griffin_lim(mag, phase0, w, jnp.float32(momentum), n_fft=n_fft, hop=hop, n_iter=int(n_iter),
                      length=length)


def mel_to_linear(mel_power, fb) -> jax.Array:
  """Approximate linear-frequency power from mel power: max(mel @ pinv(fb), 0), float32 (..., frames, n_freqs).

  Args:
    mel_power: (..., frames, n_mels) mel power (or magnitude) spectrogram.
    fb: (n_freqs, n_mels) filterbank that made it (`mel_filterbank`).

  Raises:
    DataError: fb not 2-D or mel_power's last axis is not fb's n_mels.
  """
  fb = jnp.asarray(fb, jnp.float32)
  mel_power = jnp.asarray(mel_power, jnp.float32)
  if fb.ndim != 2 or mel_power.ndim < 1 or mel_power.shape[-1] != fb.shape[1]:
    raise DataError(f"mel_to_linear: mel_power {mel_power.shape} does not match filterbank {fb.shape}; pass "
                    "(..., n_mels) with the (n_freqs, n_mels) filterbank that produced it")
  return jnp.maximum(mel_power @ jnp.linalg.pinv(fb), 0.0)


def write_wav(path: str, x, sr: int) -> str:
  """Writes a float waveform as 16-bit PCM WAV (scipy.io.wavfile), atomically; returns the path.

  Args:
    path: output file; its folder is created if missing.
    x: (T,) mono or (T, channels) waveform in [-1, 1]; if its peak exceeds 1 it is divided by the peak (and
      clipped to [-1, 1] against round-off).
    sr: sample rate in Hz.

  Raises:
    ConfigError: sr not a positive integer.
    DataError: empty, non-finite or more than 2-D audio.
  """
  from scipy.io import wavfile  # pylint: disable=g-import-not-at-top
  sr = _positive_int(sr, "write_wav: sr")
  a = np.asarray(x, np.float64)
  if a.ndim not in (1, 2) or a.size == 0:
    raise DataError(f"write_wav: audio has shape {a.shape}; pass (T,) mono or (T, channels) samples")
  if not np.isfinite(a).all():
    raise DataError("write_wav: the audio contains NaN or inf; fix the signal before writing it")
  peak = np.abs(a).max()
  if peak > 1.0:
    a = a / peak
  pcm = np.round(np.clip(a, -1.0, 1.0) * 32767.0).astype(np.int16)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_", suffix=".wav")
  try:
    with os.fdopen(fd, "wb") as f:
      wavfile.write(f, sr, pcm)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return path
