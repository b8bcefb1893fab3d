"""A small timbre classifier on harmonic features of a (log) spectrogram, for target-timbre accuracy.

`harmonic_features` turns a log-magnitude spectrogram (F bins with known centre frequencies, T frames), optionally
restricted to a region (a (F, T) weight map such as a stem's ideal ratio mask), into a pitch-independent vector:

* per frame with energy (>= `active_db` below the clip's loudest frame), the fundamental is the lowest bin that is
  a local maximum within `peak_db` of the frame's peak; the log-magnitude at the bins nearest k f0 (k = 2 .. 8,
  linear interpolation on the bins' centre frequencies) minus the value at f0 is the harmonic profile (k f0
  above the top bin gets the floor), and the levels half-way between harmonics (k + 1/2) f0 (noise, vibrato
  smear);
* averaged over active frames, with their standard deviation over frames (vibrato and drum bursts move it);
* plus the spectral flatness and the fraction of active frames.

`TimbreClassifier` standardises the features and fits scikit-learn's multinomial logistic regression. The spec of
the reference experiments (Polyphonia, arXiv 2605.10203, reconstructed: target-timbre accuracy from a logistic
regression on harmonic-ratio features) is what this follows; the feature set is ours.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxlab.errors import DataError

HARMONICS = tuple(range(2, 9))


def _interp_rows(x, centres, f):
  """x (N, F, T) sampled at frequencies f (N, T) by linear interpolation over the bin centres -> (N, T)."""
  idx = np.clip(np.searchsorted(centres, f) - 1, 0, len(centres) - 2)
  lo, hi = centres[idx], centres[idx + 1]
  w = np.clip((f - lo) / np.maximum(hi - lo, 1e-9), 0.0, 1.0)
  a = np.take_along_axis(x, idx[:, None, :], axis=1)[:, 0]
  b = np.take_along_axis(x, (idx + 1)[:, None, :], axis=1)[:, 0]
  return (1 - w) * a + w * b


def harmonic_features(logspec, centres_hz, mask=None, *, peak_db: float = 12.0, active_db: float = 40.0,
                      floor: float | None = None) -> np.ndarray:
  """(N, D) features of log-magnitude spectrograms (N, F, T) (natural log) with bin centres `centres_hz` (F,).

  Args:
    logspec: (N, F, T) or (F, T) natural-log magnitudes.
    centres_hz: (F,) increasing centre frequency of each bin (mel bands: their centre frequencies).
    mask: optional (N, F, T) weights in [0, 1]: bins are kept where mask >= 0.5 (others set to the floor).
    peak_db: a fundamental candidate is within this many dB of the frame's peak.
    active_db: frames quieter than the loudest frame by more than this are ignored.
    floor: the log value of "nothing" (default: the minimum of `logspec`).
  """
  x = np.asarray(logspec, np.float64)
  if x.ndim == 2:
    x = x[None]
  centres = np.asarray(centres_hz, np.float64)
  if x.ndim != 3 or x.shape[1] != len(centres) or np.any(np.diff(centres) <= 0):
    raise DataError(f"harmonic_features: logspec must be (N, F, T) with F = len(centres_hz) = {len(centres)} "
                    f"increasing centres, got {x.shape}")
  fl = float(np.min(x)) if floor is None else float(floor)
  if mask is not None:
    m = np.asarray(mask, np.float64)
    m = m[None] if m.ndim == 2 else m
    if m.shape != x.shape:
      raise DataError(f"harmonic_features: mask {m.shape} must match logspec {x.shape}")
    x = np.where(m >= 0.5, x, fl)
  n, f, t = x.shape
  db = 20.0 / np.log(10.0)
  frame_peak = x.max(axis=1)                                                 # (N, T)
  active = frame_peak >= frame_peak.max(axis=1, keepdims=True) - active_db / db
  active &= frame_peak > fl + 1e-6
  left = np.concatenate([np.full((n, 1, t), -np.inf), x[:, :-1]], axis=1)
  right = np.concatenate([x[:, 1:], np.full((n, 1, t), -np.inf)], axis=1)
  cand = (x >= left) & (x >= right) & (x >= frame_peak[:, None] - peak_db / db)
  f0_bin = np.argmax(cand, axis=1)                                           # the lowest candidate
  f0 = centres[f0_bin]
  base = np.take_along_axis(x, f0_bin[:, None, :], axis=1)[:, 0]
  rows = []
  for k in HARMONICS:
    for mult in (k, k - 0.5):
      fk = f0 * mult
      v = np.where(fk <= centres[-1], _interp_rows(x, centres, fk), fl) - base
      rows.append(v)
  prof = np.stack(rows, axis=-1)                                             # (N, T, 2 * len(HARMONICS))
  w = active.astype(np.float64)[..., None]
  cnt = np.maximum(w.sum(axis=1), 1.0)
  mean = (prof * w).sum(axis=1) / cnt
  std = np.sqrt(np.maximum((np.square(prof - mean[:, None]) * w).sum(axis=1) / cnt, 0.0))
  lin = np.exp(x - x.max(axis=(1, 2), keepdims=True))
  flat = np.exp(np.mean(np.log(lin + 1e-9), axis=1)) / (np.mean(lin, axis=1) + 1e-9)   # (N, T)
  flatness = (flat * w[..., 0]).sum(axis=1) / cnt[:, 0]
  f0_jitter = np.abs(np.diff(np.log(f0), axis=1))
  aw = (active[:, 1:] & active[:, :-1]).astype(np.float64)
  jitter = (f0_jitter * aw).sum(axis=1) / np.maximum(aw.sum(axis=1), 1.0)
  extra = np.stack([flatness, active.mean(axis=1), jitter], axis=-1)
  return np.concatenate([mean, std, extra], axis=-1).astype(np.float32)


@dataclasses.dataclass
class TimbreClassifier:
  """Standardised harmonic features -> multinomial logistic regression (scikit-learn).

  Attributes:
    classes: the instrument names, in label order.
    centres_hz: the bin centre frequencies of the spectrograms it is used on.
    c: inverse regularisation strength of the logistic regression.
  """
  classes: Sequence[str]
  centres_hz: np.ndarray
  c: float = 1.0
  model: object = None

  def features(self, logspec, mask=None) -> np.ndarray:
    return harmonic_features(logspec, self.centres_hz, mask)

  def fit(self, logspec, labels, mask=None) -> "TimbreClassifier":
    from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top
    from sklearn.pipeline import make_pipeline  # pylint: disable=g-import-not-at-top
    from sklearn.preprocessing import StandardScaler  # pylint: disable=g-import-not-at-top
    y = np.asarray(labels)
    if y.ndim != 1 or len(y) != np.asarray(logspec).shape[0] or len(np.unique(y)) < 2:
      raise DataError(f"TimbreClassifier.fit: need one label per spectrogram and >= 2 classes, got {y.shape}")
    self.model = make_pipeline(StandardScaler(), LogisticRegression(C=float(self.c), max_iter=2000))
    self.model.fit(self.features(logspec, mask), y)
    return self

  def predict_proba(self, logspec, mask=None) -> np.ndarray:
    """(N, len(classes)) class probabilities."""
    if self.model is None:
      raise DataError("TimbreClassifier: call fit first")
    p = np.zeros((np.asarray(logspec).shape[0] if np.asarray(logspec).ndim == 3 else 1, len(self.classes)))
    p[:, self.model.classes_] = self.model.predict_proba(self.features(logspec, mask))
    return p

  def predict(self, logspec, mask=None) -> np.ndarray:
    return np.argmax(self.predict_proba(logspec, mask), axis=-1)

  def accuracy(self, logspec, labels, mask=None) -> float:
    return float(np.mean(self.predict(logspec, mask) == np.asarray(labels)))
