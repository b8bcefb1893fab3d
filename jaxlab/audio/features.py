"""The log-mel features the audio models run on, their bin frequencies, and the way back to a waveform.

`LogMel` is one frozen spec: `x = log(|STFT(wave)| @ fb + eps)` with a periodic Hann window, centred frames
(`jaxlab.audio.spectral.stft`), a triangular mel filterbank (HTK scale, peak-1 triangles by default, so a
harmonic's level does not depend on its band's width) and the first `frames` frames kept; laid out (..., n_mels,
frames), frequency first, as the models' (F, T) images. `centres_hz` are the bands' centre frequencies (for
`jaxlab.audio.timbre`), `stems_mask` the ideal ratio mask of a stem on the same grid, `to_audio` a listening
waveform (mel -> linear by the filterbank's non-negative pseudo-inverse, then fast Griffin-Lim).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.audio import spectral
from jaxlab.errors import ConfigError, DataError


@dataclasses.dataclass(frozen=True)
class LogMel:
  """Log-mel magnitude features (frozen, hashable).

  Attributes:
    sr: sample rate (Hz); clip_seconds: clip length (the waveform has round(sr clip_seconds) samples).
    n_fft, hop: STFT frame and step; n_mels: bands; frames: frames kept (<= 1 + samples // hop).
    fmin, fmax: filterbank edges (Hz); eps: added before the log.
    scale: "htk" (HTK mel), "slaney" (Slaney mel) or "log" (`spectral.log_filterbank`: equal steps in
      log-frequency, so a harmonic series has the same band offsets at every pitch); norm: the filters' norm.
  """
  sr: int = 8000
  clip_seconds: float = 1.024
  n_fft: int = 512
  hop: int = 256
  n_mels: int = 32
  frames: int = 32
  fmin: float = 60.0
  fmax: float = 4000.0
  eps: float = 1e-2
  scale: str = "htk"
  norm: str | None = None

  def __post_init__(self):
    if self.scale not in ("htk", "slaney", "log"):
      raise ConfigError(f"LogMel: scale={self.scale!r}: use htk, slaney or log")
    if self.frames > 1 + self.samples // self.hop or self.frames < 1:
      raise ConfigError(f"LogMel: frames={self.frames} must be in [1, {1 + self.samples // self.hop}] for "
                        f"{self.samples} samples at hop {self.hop}")

  @classmethod
  def from_config(cls, c) -> "LogMel":
    """From a config section with sr, clip_seconds, n_fft, hop, n_mels, frames, fmin, fmax, eps."""
    return cls(sr=int(c.sr), clip_seconds=float(c.clip_seconds), n_fft=int(c.n_fft), hop=int(c.hop),
               n_mels=int(c.n_mels), frames=int(c.frames), fmin=float(c.fmin), fmax=float(c.fmax), eps=float(c.eps),
               scale=str(c.get("scale", "htk")))

  @property
  def samples(self) -> int:
    return int(round(self.sr * self.clip_seconds))

  @functools.cached_property
  def filterbank(self) -> np.ndarray:
    if self.scale == "log":
      return spectral.log_filterbank(self.sr, self.n_fft, self.n_mels, self.fmin, self.fmax, norm=self.norm)
    return spectral.mel_filterbank(self.sr, self.n_fft, self.n_mels, self.fmin, self.fmax,
                                   htk=self.scale == "htk", norm=self.norm)

  @property
  def centres_hz(self) -> np.ndarray:
    """(n_mels,) centre frequency of each band."""
    if self.scale == "log":
      return np.geomspace(self.fmin, self.fmax, self.n_mels + 2)[1:-1]
    htk = self.scale == "htk"
    m = np.linspace(spectral.hz_to_mel(self.fmin, htk), spectral.hz_to_mel(self.fmax, htk), self.n_mels + 2)
    return spectral.mel_to_hz(m, htk)[1:-1]

  def magnitude(self, wave) -> jax.Array:
    """(..., n_mels, frames) mel magnitudes of waveforms (..., samples)."""
    wave = jnp.asarray(wave, jnp.float32)
    if wave.shape[-1] != self.samples:
      raise DataError(f"LogMel: waveforms must have {self.samples} samples ({self.clip_seconds} s at {self.sr} Hz), "
                      f"got {wave.shape[-1]}")
    mag = jnp.abs(spectral.stft(wave, self.n_fft, self.hop))[..., :self.frames, :]
    return jnp.swapaxes(mag @ jnp.asarray(self.filterbank), -1, -2)

  def __call__(self, wave) -> jax.Array:
    """(..., n_mels, frames) log-mel features."""
    return jnp.log(self.magnitude(wave) + self.eps)

  def batched(self, waves, batch: int = 512) -> np.ndarray:
    """Features of many waveforms in jitted chunks (host numpy float32)."""
    fn = jax.jit(self.__call__)
    return np.concatenate([np.asarray(fn(waves[i:i + batch])) for i in range(0, len(waves), batch)]) \
        if len(waves) else np.zeros((0, self.n_mels, self.frames), np.float32)

  def stem_mask(self, target, rest) -> jax.Array:
    """Ideal ratio mask (power) of a target stem against the rest on the feature grid: (..., n_mels, frames)."""
    return spectral.ideal_ratio_mask(self.magnitude(target), self.magnitude(rest))

  def to_audio(self, logmel, *, n_iter: int = 64, key=None) -> jax.Array:
    """A listening waveform (..., samples) from log-mel features (Griffin-Lim on the pseudo-inverted mel)."""
    mel = jnp.maximum(jnp.exp(jnp.asarray(logmel, jnp.float32)) - self.eps, 0.0)
    lin = spectral.mel_to_linear(jnp.swapaxes(mel, -1, -2), self.filterbank)        # (..., frames, n_freqs)
    total = 1 + self.samples // self.hop
    if lin.shape[-2] < total:
      pad = [(0, 0)] * (lin.ndim - 2) + [(0, total - lin.shape[-2]), (0, 0)]
      lin = jnp.pad(lin, pad)
    return spectral.griffin_lim(lin, self.n_fft, self.hop, n_iter=n_iter, length=self.samples, key=key)
