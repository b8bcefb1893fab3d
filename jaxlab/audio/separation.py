"""Stem priors for attention calibration: the oracle ideal ratio mask, an imperfect separator that degrades it,
and Demucs (a real blind separator) in a subprocess.

Polyphonia (Li et al., ICML 2026, arXiv 2605.10203) calibrates cross-attention with a "probabilistic acoustic
prior": the target stem's share of each time-frequency cell, estimated by a blind source separator on the source
mixture. On synthetic mixtures the oracle mask is known; `imperfect_mask` stands in for a separator's errors as
the reference experiment's spec describes (the oracle blurred, thresholded and corrupted by random flips, then
softened), and the oracle is the upper bound. At full scale `demucs_prior` runs the PyPI `demucs` package
(torch; the optional extra `jaxlab[demucs]`) on the user's mixture in a subprocess and returns the mask of its
estimate of the stem against the rest.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError, DataError


def gaussian_blur(m, sigma: float) -> jax.Array:
  """Separable Gaussian blur of (..., F, T) maps over both axes (sigma in bins; edges reflected; 0: no blur)."""
  m = jnp.asarray(m, jnp.float32)
  if sigma <= 0:
    return m
  r = max(1, int(3.0 * sigma + 0.5))          # scipy.ndimage's radius at truncate=3
  k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
  k = jnp.asarray(k / k.sum(), jnp.float32)
  for axis in (-2, -1):
    n = m.shape[axis]
    pad = [(0, 0)] * m.ndim
    pad[axis] = (r, r)
    x = jnp.pad(m, pad, mode="reflect" if n > r else "edge")
    x = jnp.moveaxis(x, axis, -1)
    windows = jnp.stack([x[..., i:i + n] for i in range(2 * r + 1)], axis=-1)
    m = jnp.moveaxis(windows @ k, -1, axis)
  return m


def imperfect_mask(key, irm, *, blur: float = 1.0, threshold: float = 0.5, flip: float = 0.1,
                   soften: float = 1.0) -> jax.Array:
  """A separator's imperfect version of the oracle mask (..., F, T) in [0, 1]: Gaussian blur (`blur` bins),
  binarised at `threshold`, a fraction `flip` of the cells flipped at random, then blurred by `soften` bins (a
  soft prior with coarse boundaries; 0 keeps it binary)."""
  if not 0 <= flip <= 1 or not 0 < threshold < 1 or blur < 0 or soften < 0:
    raise ConfigError(f"imperfect_mask: need 0 <= flip <= 1, 0 < threshold < 1 and blur, soften >= 0; got flip={flip}, "
                      f"threshold={threshold}, blur={blur}, soften={soften}")
  irm = jnp.asarray(irm, jnp.float32)
  if irm.ndim < 2:
    raise DataError(f"imperfect_mask: irm must be (..., freq, time), got shape {irm.shape}")
  hard = gaussian_blur(irm, blur) >= threshold
  hard = jnp.where(jax.random.uniform(key, irm.shape) < flip, ~hard, hard)
  return jnp.clip(gaussian_blur(hard.astype(jnp.float32), soften), 0.0, 1.0)


def demucs_available() -> bool:
  return importlib.util.find_spec("demucs") is not None


def demucs_separate(mix_path: str, out_dir: str, *, stem: str, model: str = "htdemucs", timeout: float = 3600,
                    python: str = sys.executable) -> tuple[str, str]:
  """Runs `python -m demucs --two-stems <stem>` on a WAV in a subprocess; returns the (stem, rest) WAV paths.

  Raises:
    ConfigError: demucs is not installed (pip install "jaxlab[demucs]").
    DataError: the file does not exist, or demucs failed (its last output lines are in the message)."""
  if not demucs_available():
    raise ConfigError("demucs_separate: the `demucs` package is not installed; pip install 'jaxlab[demucs]' (torch)")
  if not os.path.isfile(mix_path):
    raise DataError(f"demucs_separate: no such file {mix_path!r}")
  cmd = [python, "-m", "demucs", "-n", model, "--two-stems", stem, "-o", out_dir, mix_path]
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
  name = os.path.splitext(os.path.basename(mix_path))[0]
  target = os.path.join(out_dir, model, name, f"{stem}.wav")
  rest = os.path.join(out_dir, model, name, f"no_{stem}.wav")
  if res.returncode or not (os.path.isfile(target) and os.path.isfile(rest)):
    tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-5:])
    raise DataError(f"demucs_separate: `{' '.join(cmd)}` failed (exit {res.returncode}):\n{tail}")
  return target, rest


def demucs_prior(features, mix, workdir: str, *, stem: str, model: str = "htdemucs") -> np.ndarray:
  """The prior M (n_mels, frames) of `stem` in a mixture waveform on the features' grid (`features` a
  `jaxlab.audio.features.LogMel`): the mixture written as a WAV (at the features' rate), separated by Demucs,
  and the ideal ratio mask of its stem estimate against its rest. Demucs works at 44.1 kHz internally and writes
  the input's rate."""
  from scipy.io import wavfile  # pylint: disable=g-import-not-at-top
  from jaxlab.audio import spectral  # pylint: disable=g-import-not-at-top
  os.makedirs(workdir, exist_ok=True)
  path = spectral.write_wav(os.path.join(workdir, "mix.wav"), np.asarray(mix, np.float32), int(features.sr))
  target, rest = demucs_separate(path, os.path.join(workdir, "separated"), stem=stem, model=model)
  waves = []
  for p in (target, rest):
    sr, raw = wavfile.read(p)
    w = np.asarray(raw, np.float32) / (32768.0 if np.issubdtype(raw.dtype, np.integer) else 1.0)
    if w.ndim == 2:
      w = w.mean(axis=1)
    if sr != int(features.sr):
      raise DataError(f"demucs_prior: {p} is at {sr} Hz, expected {features.sr}")
    waves.append(np.pad(w, (0, max(0, features.samples - len(w))))[:features.samples])
  return np.asarray(features.stem_mask(waves[0], waves[1]))
