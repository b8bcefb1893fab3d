"""Audio quality metrics: log-spectral distance, SDR variants (plain, scale-invariant, BSS-Eval) and FAD.

* `log_spectral_distance`: the root-mean-square difference of two LOG spectrograms (natural-log magnitude or power
  features, `jaxlab.audio.spectral.log_features`) over the time-frequency bins selected by a mask, per example
  (Gray & Markel 1976 define the log-spectral distance as this RMS of log-spectrum differences). JAX.
* `sdr`: the plain signal-to-distortion ratio 10 log10(||s||^2 / ||s - s_hat||^2) in dB. JAX.
* `si_sdr`: the scale-invariant SDR of Le Roux, Wisdom, Erdogan & Hershey (2019), "SDR - half-baked or well
  done?": with (by default) zero-mean signals, alpha = <s_hat, s> / ||s||^2 and
  SI-SDR = 10 log10(||alpha s||^2 / ||alpha s - s_hat||^2). JAX, batched over leading dims.
* `bss_eval_sdr`: the SDR of BSS-Eval v3 (Vincent, Gribonval & Fevotte 2006, "Performance measurement in blind
  audio source separation", the decomposition with a time-invariant distortion filter of L taps, as in the
  BSS_EVAL Matlab toolbox and `mir_eval.separation.bss_eval_sources`) for ONE source: s_target is the orthogonal
  projection of the estimate (zero-padded by L - 1 samples) onto the span of the reference delayed by
  0..L-1 samples (the Gram matrix of the delayed copies is the symmetric Toeplitz matrix of the reference's
  autocorrelation, solved with Levinson recursion, scipy.linalg.solve_toeplitz), and
  SDR = 10 log10(||s_target||^2 / ||s_hat - s_target||^2). With a single reference the interference term of
  BSS-Eval is zero, so this equals mir_eval's SDR of `bss_eval_sources(ref[None], est[None])`; SIR is undefined
  (+inf) and not returned. numpy / scipy on the host, float64.
* `frechet_audio_distance`: FAD (Kilgour et al. 2019, "Frechet Audio Distance"): the Frechet distance between
  Gaussian fits of two embedding sets, computed by `jaxlab.evals.frechet.frechet_from_features`. The embeddings
  come from a judge network: VGGish or CLAP at full scale, a small trained judge (e.g. a mel-spectrogram
  classifier's penultimate layer) at tiny scale; FADs are only comparable under the same judge.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError, DataError
from jaxlab.evals.frechet import frechet_from_features


def log_spectral_distance(a, b, *, mask=None, axis=(-2, -1)) -> jax.Array:
  """RMS difference of two log spectrograms over the masked bins, per example.

  Args:
    a: (..., frames, bins) log features (e.g. `log_features` of mel power).
    b: same shape.
    mask: bool or {0, 1} (or non-negative weights) broadcastable to a's shape; None uses every bin.
    axis: the axes reduced (default the last two: frames and bins).

  Returns:
    float32 sqrt(sum(mask (a - b)^2) / sum(mask)) over `axis`; NaN for an example whose mask is all False.

  Raises:
    DataError: a and b differ in shape, or the mask does not broadcast to them.
  """
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  if a.shape != b.shape:
    raise DataError(f"log_spectral_distance: shapes {a.shape} and {b.shape} differ; pass features of one shape")
  d2 = (a - b) ** 2
  if mask is None:
    return jnp.sqrt(jnp.mean(d2, axis=axis))
  m = jnp.asarray(mask).astype(jnp.float32)
  try:
    m = jnp.broadcast_to(m, d2.shape)
  except ValueError as e:
    raise DataError(f"log_spectral_distance: mask of shape {m.shape} does not broadcast to {d2.shape}; pass a "
                    "mask broadcastable to the features") from e
  return jnp.sqrt(jnp.sum(m * d2, axis=axis) / jnp.sum(m, axis=axis))


def _pair(ref, est, fn: str):
  ref, est = jnp.asarray(ref, jnp.float32), jnp.asarray(est, jnp.float32)
  if ref.shape != est.shape or ref.ndim < 1:
    raise DataError(f"{fn}: reference {ref.shape} and estimate {est.shape} must have one shape (..., T)")
  return ref, est


def sdr(ref, est, *, eps: float = 1e-8) -> jax.Array:
  """Plain SDR in dB, 10 log10(||ref||^2 / (||ref - est||^2 + eps) + eps), over the last axis; float32 (...,).

  Raises:
    DataError: mismatched shapes.
  """
  ref, est = _pair(ref, est, "sdr")
  num = jnp.sum(ref * ref, axis=-1)
  den = jnp.sum((ref - est) ** 2, axis=-1)
  return 10.0 * jnp.log10(num / (den + eps) + eps)


def si_sdr(ref, est, *, eps: float = 1e-8, zero_mean: bool = True) -> jax.Array:
  """Scale-invariant SDR in dB (Le Roux et al. 2019) over the last axis, float32 (...,).

  Args:
    ref: (..., T) reference signals.
    est: (..., T) estimates.
    eps: stabiliser of the ratios (a perfect estimate gives a large finite value).
    zero_mean: subtract each signal's mean first (as in the paper).

  Raises:
    DataError: mismatched shapes.
  """
  ref, est = _pair(ref, est, "si_sdr")
  if zero_mean:
    ref = ref - jnp.mean(ref, axis=-1, keepdims=True)
    est = est - jnp.mean(est, axis=-1, keepdims=True)
  alpha = jnp.sum(est * ref, axis=-1, keepdims=True) / (jnp.sum(ref * ref, axis=-1, keepdims=True) + eps)
  target = alpha * ref
  num = jnp.sum(target * target, axis=-1)
  den = jnp.sum((target - est) ** 2, axis=-1)
  return 10.0 * jnp.log10(num / (den + eps) + eps)


def bss_eval_sdr(ref, est, *, filter_len: int = 512) -> float:
  """BSS-Eval v3 SDR (dB) of one estimate against one reference, with a `filter_len`-tap distortion filter.

  Args:
    ref: (T,) reference source.
    est: (T,) estimate.
    filter_len: taps of the allowed time-invariant filter (512 in BSS_EVAL and mir_eval).

  Returns:
    float SDR in dB (+inf when the estimate is exactly a filtered reference).

  Raises:
    ConfigError: filter_len < 1.
    DataError: not two 1-D signals of one length, non-finite values, or an all-zero reference.
  """
  import scipy.linalg  # pylint: disable=g-import-not-at-top
  if isinstance(filter_len, bool) or not isinstance(filter_len, (int, np.integer)) or filter_len < 1:
    raise ConfigError(f"bss_eval_sdr: filter_len must be a positive integer, got {filter_len!r}")
  s, e = np.asarray(ref, np.float64), np.asarray(est, np.float64)
  if s.ndim != 1 or s.shape != e.shape or s.size == 0:
    raise DataError(f"bss_eval_sdr: reference {s.shape} and estimate {e.shape} must be 1-D of one length (T,)")
  if not (np.isfinite(s).all() and np.isfinite(e).all()):
    raise DataError("bss_eval_sdr: the signals contain NaN or inf")
  if not np.any(s):
    raise DataError("bss_eval_sdr: the reference is all zeros; SDR is undefined for a silent reference")
  n, lf = s.size, int(filter_len)
  m = n + lf - 1
  nfft = 1 << int(np.ceil(np.log2(m)))  # >= n + L - 1: lags 0..L-1 of the linear correlations do not alias
  sf, ef = np.fft.rfft(s, nfft), np.fft.rfft(e, nfft)
  # r[k] = sum_t s[t] s[t + k]: <s delayed by i, s delayed by j> = r[|i - j|] (the delayed copies are kept whole).
  r = np.fft.irfft(np.abs(sf) ** 2, nfft)[:lf]
  # d[k] = sum_t s[t] e[t + k] = <s delayed by k, e>.
  d = np.fft.irfft(np.conj(sf) * ef, nfft)[:lf]
  try:
    coef = scipy.linalg.solve_toeplitz(r, d)
  except np.linalg.LinAlgError:
    gram = scipy.linalg.toeplitz(r)
    coef = np.linalg.lstsq(gram, d, rcond=None)[0]
  target = np.convolve(coef, s)[:m]
  resid = -target
  resid[:n] += e
  num, den = float(np.sum(target ** 2)), float(np.sum(resid ** 2))
  return float("inf") if den == 0.0 else float(10.0 * np.log10(num / den))


def frechet_audio_distance(emb_a, emb_b) -> float:
  """Frechet Audio Distance between two (n, d) embedding sets (`jaxlab.evals.frechet.frechet_from_features`).

  The embeddings come from a judge network (VGGish / CLAP at full scale, a small judge at tiny scale).

  Raises:
    DataError: sets that are not (n >= 2, d), differ in d, or hold non-finite values.
  """
  a, b = np.asarray(emb_a), np.asarray(emb_b)
  if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
    raise DataError(f"frechet_audio_distance: embeddings {a.shape} and {b.shape} must be (n, d) with one d")
  return frechet_from_features(a, b)
