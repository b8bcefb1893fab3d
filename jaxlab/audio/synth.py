"""A multi-stem synthesiser with known ground truth: notes, oscillator instruments, mixtures and re-timbred edits.

Text-to-spectrogram diffusion models are trained here on synthetic mixtures whose every stem is known, and the
stem-editing task of Polyphonia (re-timbre ONE stem of a mixture, keep the others) needs the ground-truth edited
mixture: the same notes rendered with another instrument. Everything is numpy and deterministic from a seed.

Instruments (band-limited additive synthesis: a sum of sines, every partial at or above Nyquist sr / 2 dropped, so
nothing folds back):

* flute: a sine plus a weak 2nd harmonic (amplitude 0.15), no breath noise;
* clarinet: odd harmonics 1, 3, 5, ... with amplitudes 1 / k (a band-limited square wave);
* violin: all harmonics with amplitudes 1 / k (a band-limited sawtooth) with a 5.5 Hz vibrato of depth 3% of f0
  (about half a semitone), rendered by phase accumulation (the cumulative sum of the instantaneous frequency);
* organ: partials 1, 2, 4, 8 with amplitudes 1, 0.7, 0.5, 0.35;
* drums: un-pitched band-pass filtered noise bursts (a Butterworth band-pass, scipy.signal) with a ~60 ms
  exponential decay, one per note onset; the noise is drawn from `Stem.seed`, so rendering stays deterministic.

Levels: every pitched note's oscillator is divided by the exact peak of its single-period waveform (computed from
its partials), so each instrument peaks at 1 before the note velocity, the ADSR envelope and the stem gain; a drum
burst is divided by its own peak. `render_stem` then multiplies by `stem.gain * HEADROOM` with HEADROOM = 1/3, so a
stem peaks at most at gain / 3 and ANY three stems with gain <= 1 sum into [-1, 1]. No mixture normalisation is
ever applied: the mixture is exactly the sum of its stems, which the ground-truth edit needs.

Timing: `random_notes` puts onsets (and note ends) on a 1/16-second grid, so onsets are resolvable from STFT
frames, and every envelope releases to zero inside its note, so consecutive notes are separated by an energy
dip. Envelope attacks are short (3 to 10 ms) so the onset seen in the spectrogram is the note's onset.

References: additive synthesis and ADSR envelopes as in J. O. Smith, "Spectral Audio Signal Processing" (CCRMA);
Polyphonia (instrument re-timbring of one stem of a polyphonic mixture with a text-to-spectrogram diffusion
model); MIDI pitch p has frequency 440 * 2 ** ((p - 69) / 12) Hz.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import numpy as np

from jaxlab.errors import ConfigError

INSTRUMENTS = ("flute", "clarinet", "violin", "organ", "drums")
PITCHED = INSTRUMENTS[:4]
HEADROOM = 1.0 / 3.0  # a stem peaks at most at gain * HEADROOM: any three stems with gain <= 1 stay in [-1, 1]
ONSET_GRID = 1.0 / 16.0  # seconds between admissible onsets (and note ends) in `random_notes`

VIBRATO_RATE = 5.5  # Hz (violin)
VIBRATO_DEPTH = 0.03  # fraction of f0 (about half a semitone)
DRUM_DECAY = 0.015  # seconds: time constant of a drum burst's exponential decay
DRUM_LENGTH = 0.06  # seconds: a drum burst fades to zero after this long
DRUM_BAND = (150.0, 3000.0)  # Hz: the band-pass of the drum noise (the upper edge is capped at 0.45 sr)

# (attack s, decay s, sustain level, release s) per pitched instrument; the release happens inside the note.
ENVELOPES = {
    "flute": (0.008, 0.04, 0.8, 0.04),
    "clarinet": (0.005, 0.03, 0.85, 0.04),
    "violin": (0.01, 0.05, 0.85, 0.05),
    "organ": (0.003, 0.0, 1.0, 0.02),
}


def midi_to_hz(pitch: float) -> float:
  """The frequency (Hz) of MIDI pitch `pitch` in 12-tone equal temperament with A4 = 69 = 440 Hz."""
  return 440.0 * 2.0 ** ((float(pitch) - 69.0) / 12.0)


@dataclasses.dataclass(frozen=True)
class Note:
  """One note (or drum hit).

  Attributes:
    onset: start time in seconds (>= 0).
    duration: length in seconds (> 0); the envelope's release ends inside it.
    pitch: MIDI pitch (int, 0..127); 0 for drum hits (ignored there).
    velocity: linear amplitude scale in (0, 1].
  """
  onset: float
  duration: float
  pitch: int
  velocity: float = 1.0

  def __post_init__(self):
    if not (self.onset >= 0 and self.duration > 0):
      raise ConfigError(f"Note needs onset >= 0 and duration > 0 seconds, got onset={self.onset}, "
                        f"duration={self.duration}")
    if int(self.pitch) != self.pitch or not 0 <= self.pitch <= 127:
      raise ConfigError(f"Note pitch must be an integer MIDI pitch in 0..127, got {self.pitch!r}")
    if not 0 < self.velocity <= 1:
      raise ConfigError(f"Note velocity must lie in (0, 1], got {self.velocity}")
    object.__setattr__(self, "pitch", int(self.pitch))


@dataclasses.dataclass(frozen=True)
class Stem:
  """One instrument's part of a clip.

  Attributes:
    instrument: one of INSTRUMENTS.
    notes: the notes (a tuple; lists are converted).
    gain: linear gain (> 0); the rendered stem peaks at most at gain * HEADROOM.
    seed: seed of the drum noise (unused by pitched instruments, kept by `retimbre`).
  """
  instrument: str
  notes: tuple[Note, ...]
  gain: float = 1.0
  seed: int = 0

  def __post_init__(self):
    _check_instrument(self.instrument)
    object.__setattr__(self, "notes", tuple(self.notes))
    if not all(isinstance(n, Note) for n in self.notes):
      raise ConfigError("Stem notes must all be synth.Note instances; build them with Note(onset, duration, pitch)")
    if not self.gain > 0:
      raise ConfigError(f"Stem gain must be > 0, got {self.gain}")

  @property
  def pitched(self) -> bool:
    """Whether the instrument is pitched (not drums)."""
    return self.instrument in PITCHED


def _check_instrument(name: str):
  if name not in INSTRUMENTS:
    raise ConfigError(f"unknown instrument {name!r}; pick one of {', '.join(INSTRUMENTS)}")


def adsr(n_samples: int, sr: float, attack: float, decay: float, sustain: float, release: float) -> np.ndarray:
  """A linear attack-decay-sustain-release envelope that ends (at zero) inside `n_samples`.

  0 -> 1 over `attack` seconds, 1 -> `sustain` over `decay`, hold, then `sustain` -> 0 over the last `release`
  seconds. When the note is shorter than attack + decay + release, the three segments are shrunk proportionally
  (no sustain part).

  Args:
    n_samples: the note's length in samples.
    sr: sample rate (Hz).
    attack, decay, release: segment lengths in seconds (>= 0).
    sustain: sustain level in [0, 1].

  Returns:
    float32 (n_samples,) in [0, 1], zero at the last sample.
  """
  if n_samples < 0 or sr <= 0 or min(attack, decay, release) < 0 or not 0 <= sustain <= 1:
    raise ConfigError(f"adsr needs n_samples >= 0, sr > 0, segment lengths >= 0 and sustain in [0, 1], got "
                      f"n_samples={n_samples}, sr={sr}, a/d/r={attack}/{decay}/{release}, sustain={sustain}")
  seg = np.array([attack, decay, release], np.float64) * sr
  if seg.sum() > n_samples:
    seg *= n_samples / seg.sum()
  a, d, r = (int(round(s)) for s in seg)
  r = min(r, n_samples)
  a = min(a, n_samples - r)
  d = min(d, n_samples - r - a)
  s = n_samples - a - d - r
  t = np.arange(max(a, d, r, 1), dtype=np.float64)
  env = np.concatenate([
      (t[:a] + 1) / a,
      1.0 + (sustain - 1.0) * (t[:d] + 1) / max(d, 1),
      np.full(s, sustain),
      sustain * (1.0 - (t[:r] + 1) / max(r, 1)),
  ])
  return env.astype(np.float32)


def partials(instrument: str, f0: float, sr: float) -> tuple[np.ndarray, np.ndarray]:
  """The harmonic numbers and amplitudes of a pitched instrument, band-limited below Nyquist.

  A partial k is kept when k * f0 * (1 + vibrato depth) < sr / 2 (the vibrato depth counts for the violin only),
  so no partial ever folds back.

  Args:
    instrument: one of PITCHED.
    f0: fundamental frequency (Hz).
    sr: sample rate (Hz).

  Returns:
    (k int64 (K,), amplitude float64 (K,)) before peak normalisation; K >= 1 whenever f0 is below Nyquist.
  """
  if instrument not in PITCHED:
    raise ConfigError(f"partials are defined for the pitched instruments {', '.join(PITCHED)}, got {instrument!r}")
  top = f0 * (1.0 + (VIBRATO_DEPTH if instrument == "violin" else 0.0))
  kmax = int(math.ceil(0.5 * sr / top)) - 1 if top > 0 else 0  # the largest k with k * top < sr / 2
  if instrument == "flute":
    k, amp = np.array([1, 2]), np.array([1.0, 0.15])
  elif instrument == "clarinet":
    k = np.arange(1, max(kmax, 1) + 1, 2)
    amp = 1.0 / k
  elif instrument == "violin":
    k = np.arange(1, max(kmax, 1) + 1)
    amp = 1.0 / k
  else:
    k, amp = np.array([1, 2, 4, 8]), np.array([1.0, 0.7, 0.5, 0.35])
  keep = k <= kmax
  return k[keep].astype(np.int64), amp[keep]


@functools.lru_cache(maxsize=4096)
def _waveform_peak(ks: tuple[int, ...], amps: tuple[float, ...]) -> float:
  """max over one period of |sum_k a_k sin(k theta)| (sampled finely enough for the highest partial)."""
  n = max(4096, 64 * max(ks))
  theta = np.arange(n) * (2 * np.pi / n)
  wave = np.zeros(n)
  for k, a in zip(ks, amps):
    wave += a * np.sin(k * theta)
  return float(np.abs(wave).max())


def _render_pitched(instrument: str, note: Note, sr: float) -> np.ndarray:
  n = int(round(note.duration * sr))
  f0 = midi_to_hz(note.pitch)
  k, amp = partials(instrument, f0, sr)
  if n == 0 or len(k) == 0:
    return np.zeros(n, np.float32)
  t = np.arange(n, dtype=np.float64) / sr
  if instrument == "violin":
    inst_freq = f0 * (1.0 + VIBRATO_DEPTH * np.sin(2 * np.pi * VIBRATO_RATE * t))
    phase = 2 * np.pi * (np.cumsum(inst_freq) - inst_freq[0]) / sr  # phase accumulation, 0 at the onset
  else:
    phase = 2 * np.pi * f0 * t
  wave = np.zeros(n)
  for kk, a in zip(k, amp):
    wave += a * np.sin(kk * phase)
  wave /= _waveform_peak(tuple(int(x) for x in k), tuple(float(x) for x in amp))
  env = adsr(n, sr, *ENVELOPES[instrument])
  return (note.velocity * env * wave).astype(np.float32)


def _render_drum(note: Note, sr: float, seed: int, index: int) -> np.ndarray:
  from scipy import signal
  n = int(round(min(note.duration, DRUM_LENGTH) * sr))
  if n == 0:
    return np.zeros(0, np.float32)
  rng = np.random.default_rng((int(seed), int(index)))
  lo, hi = DRUM_BAND[0], min(DRUM_BAND[1], 0.45 * sr)
  sos = signal.butter(2, [lo, hi], btype="bandpass", fs=sr, output="sos")
  warm = int(round(0.02 * sr))  # filter the noise past its start-up transient
  noise = signal.sosfilt(sos, rng.standard_normal(n + warm))[warm:]
  t = np.arange(n, dtype=np.float64) / sr
  burst = noise * np.exp(-t / DRUM_DECAY) * (1.0 - np.arange(n) / n)  # exponential decay, faded to zero
  burst /= max(float(np.abs(burst).max()), 1e-12)
  return (note.velocity * burst).astype(np.float32)


def _check_clip(sr: float, duration: float):
  if not (sr > 0 and duration > 0):
    raise ConfigError(f"sr and duration must be > 0, got sr={sr}, duration={duration}")


def render_stem(stem: Stem, *, sr: float, duration: float) -> np.ndarray:
  """Renders one stem: the sum of its notes times `stem.gain * HEADROOM`.

  A note that runs past the clip's end is rendered in full and cut (its release is then lost); a note starting at
  or after the end is silent.

  Args:
    stem: the stem.
    sr: sample rate (Hz).
    duration: clip length in seconds.

  Returns:
    float32 (T,) with T = round(duration * sr), peak <= stem.gain * HEADROOM for monophonic stems.
  """
  _check_clip(sr, duration)
  total = int(round(duration * sr))
  out = np.zeros(total, np.float64)
  for i, note in enumerate(stem.notes):
    start = int(round(note.onset * sr))
    if start >= total:
      continue
    if stem.pitched:
      wave = _render_pitched(stem.instrument, note, sr)
    else:
      wave = _render_drum(note, sr, stem.seed, i)
    wave = wave[:total - start]
    out[start:start + len(wave)] += wave
  return (out * (stem.gain * HEADROOM)).astype(np.float32)


def render_mixture(stems: Sequence[Stem], *, sr: float, duration: float) -> tuple[np.ndarray, np.ndarray]:
  """Renders every stem and their sum (no normalisation: the mixture is exactly additive).

  Returns:
    (mix float32 (T,), stems float32 (S, T)).
  """
  _check_clip(sr, duration)
  total = int(round(duration * sr))
  per = np.stack([render_stem(s, sr=sr, duration=duration) for s in stems]) if len(stems) else \
      np.zeros((0, total), np.float32)
  return per.sum(0, dtype=np.float32), per


def retimbre(stem: Stem, instrument: str) -> Stem:
  """The same notes, gain and seed played by another instrument (pitched -> pitched or drums -> drums only).

  Raises:
    ConfigError: the instrument is unknown, or one side is drums and the other pitched.
  """
  _check_instrument(instrument)
  if (instrument in PITCHED) != stem.pitched:
    kind, choices = ("pitched", ", ".join(PITCHED)) if stem.pitched else ("un-pitched", "drums")
    raise ConfigError(f"cannot re-timbre a {kind} {stem.instrument!r} stem to {instrument!r}: drums and pitched "
                      f"instruments do not share notes; pick one of {choices}")
  return dataclasses.replace(stem, instrument=instrument)


def edit_clip(stems: Sequence[Stem], index: int, instrument: str) -> tuple[Stem, ...]:
  """The clip with stem `index` re-timbred to `instrument` and every other stem unchanged.

  The ground-truth edited mixture is `render_mixture(edit_clip(stems, index, instrument), ...)`.
  """
  stems = tuple(stems)
  if not -len(stems) <= index < len(stems):
    raise ConfigError(f"edit_clip index {index} is out of range for a clip of {len(stems)} stems")
  out = list(stems)
  out[index] = retimbre(stems[index], instrument)
  return tuple(out)


def random_notes(rng: np.random.Generator | int, *, duration: float, sr: float,
                 midi_range: tuple[int, int] = (48, 84), max_notes: int = 4, min_len: float = 0.15,
                 drums: bool = False, velocity_range: tuple[float, float] = (0.6, 1.0)) -> tuple[Note, ...]:
  """A random monophonic melody (or drum pattern) on the ONSET_GRID (1/16 s) grid.

  Melody: 1..max_notes non-overlapping notes (fewer when they cannot fit), each at least `min_len` long rounded
  up to the grid, with onsets and ends on the grid; the free grid cells are spread at random over the gaps and the
  note lengths (a multinomial over a flat Dirichlet), so the notes cover a random portion of the clip. Pitches are
  uniform on the inclusive `midi_range`. Drums (`drums=True`): 1..max_notes hits on distinct grid onsets, pitch 0,
  each DRUM_LENGTH long (cut at the clip's end). Onsets are rounded to whole samples.

  Args:
    rng: numpy generator or seed.
    duration: clip length in seconds.
    sr: sample rate (Hz).
    midi_range: inclusive (lo, hi) MIDI pitches.
    max_notes: maximum number of notes (or hits).
    min_len: minimum note length in seconds.
    drums: draw drum hits instead of a melody.
    velocity_range: velocities are uniform in it.

  Returns:
    Notes sorted by onset.
  """
  rng = np.random.default_rng(rng)
  _check_clip(sr, duration)
  lo, hi = (int(v) for v in midi_range)
  if not 0 <= lo <= hi <= 127 or max_notes < 1 or min_len <= 0 or not 0 < velocity_range[0] <= velocity_range[1] <= 1:
    raise ConfigError(f"random_notes needs 0 <= midi_range lo <= hi <= 127, max_notes >= 1, min_len > 0 and "
                      f"0 < velocity lo <= hi <= 1, got midi_range={midi_range}, max_notes={max_notes}, "
                      f"min_len={min_len}, velocity_range={velocity_range}")
  cells = int(math.floor(duration / ONSET_GRID + 1e-9))

  def sec(c):
    return round(c * ONSET_GRID * sr) / sr

  if drums:
    n = int(rng.integers(1, max_notes + 1))
    starts = np.sort(rng.choice(max(cells, 1), size=min(n, max(cells, 1)), replace=False))
    vel = rng.uniform(*velocity_range, size=len(starts))
    return tuple(Note(sec(c), min(DRUM_LENGTH, duration - sec(c)), 0, float(v)) for c, v in zip(starts, vel))
  m = max(1, int(math.ceil(min_len / ONSET_GRID - 1e-9)))
  if cells < m:
    raise ConfigError(f"a {duration} s clip cannot hold a note of min_len={min_len} s on the {ONSET_GRID} s grid; "
                      f"lengthen the clip or lower min_len")
  n = min(int(rng.integers(1, max_notes + 1)), cells // m)
  extra = rng.multinomial(cells - n * m, rng.dirichlet(np.ones(2 * n + 1)))
  lengths, gaps = m + extra[:n], extra[n:]
  pitches = rng.integers(lo, hi + 1, size=n)
  vel = rng.uniform(*velocity_range, size=n)
  notes, c = [], 0
  for i in range(n):
    c += int(gaps[i])
    notes.append(Note(sec(c), sec(c + int(lengths[i])) - sec(c), int(pitches[i]), float(vel[i])))
    c += int(lengths[i])
  return tuple(notes)


def register_bands(midi_range: tuple[int, int], n: int) -> list[tuple[int, int]]:
  """Splits the inclusive `midi_range` into `n` adjacent, non-overlapping inclusive bands, lowest first."""
  lo, hi = (int(v) for v in midi_range)
  width = hi - lo + 1
  if n < 1 or width < n:
    raise ConfigError(f"cannot split midi_range {midi_range} into {n} registers; widen it or use fewer stems")
  edges = [lo + round(i * width / n) for i in range(n + 1)]
  return [(edges[i], edges[i + 1] - 1) for i in range(n)]


def sample_clip(rng: np.random.Generator | int, *, num_pitched: int = 1, drums_prob: float = 0.5, sr: float = 8000,
                duration: float = 1.024, pitched: Sequence[str] = PITCHED,
                gain_range: tuple[float, float] = (0.3, 1.0), midi_range: tuple[int, int] = (48, 84),
                max_notes: int = 4, min_len: float = 0.15, max_hits: int = 8) -> tuple[Stem, ...]:
  """A random clip spec: `num_pitched` pitched stems with distinct instruments, plus drums with `drums_prob`.

  With several pitched stems, `midi_range` is split into that many registers (`register_bands`) and the i-th
  stem plays in the i-th band from the bottom (with 2: the lower and the upper half), so their pitches never
  collide. The instruments are drawn without replacement from `pitched` in random order. Gains are uniform in
  `gain_range`; with HEADROOM = 1/3 any three stems with gain <= 1 sum into [-1, 1].

  Args:
    rng: numpy generator or seed.
    num_pitched: number of pitched stems (1..len(pitched)).
    drums_prob: probability of adding a drum stem (always last).
    sr, duration: sample rate (Hz) and clip length (s) the notes are placed for.
    pitched: the pitched instruments to draw from.
    gain_range: (lo, hi) of the stem gains, 0 < lo <= hi.
    midi_range: inclusive pitch range shared out among the pitched stems.
    max_notes, min_len: passed to `random_notes` for each pitched stem.
    max_hits: maximum drum hits.

  Returns:
    The stems: pitched ones first (lowest register first), then drums if drawn.
  """
  rng = np.random.default_rng(rng)
  pitched = tuple(pitched)
  for name in pitched:
    if name not in PITCHED:
      raise ConfigError(f"sample_clip pitched instruments must come from {', '.join(PITCHED)}, got {name!r}")
  if len(set(pitched)) != len(pitched) or not 1 <= num_pitched <= len(pitched):
    raise ConfigError(f"sample_clip needs 1 <= num_pitched <= {len(set(pitched))} distinct pitched instruments, got "
                      f"num_pitched={num_pitched} from {pitched}")
  if not 0 <= drums_prob <= 1 or not 0 < gain_range[0] <= gain_range[1]:
    raise ConfigError(f"sample_clip needs drums_prob in [0, 1] and 0 < gain lo <= hi, got drums_prob={drums_prob}, "
                      f"gain_range={gain_range}")
  names = [pitched[i] for i in rng.permutation(len(pitched))[:num_pitched]]
  stems = []
  for name, band in zip(names, register_bands(midi_range, num_pitched)):
    notes = random_notes(rng, duration=duration, sr=sr, midi_range=band, max_notes=max_notes, min_len=min_len)
    stems.append(Stem(name, notes, float(rng.uniform(*gain_range)), int(rng.integers(2 ** 31))))
  if rng.random() < drums_prob:
    notes = random_notes(rng, duration=duration, sr=sr, max_notes=max_hits, drums=True)
    stems.append(Stem("drums", notes, float(rng.uniform(*gain_range)), int(rng.integers(2 ** 31))))
  return tuple(stems)


def batch_render(seeds_or_rng: np.random.Generator | int | Sequence[int], n: int | None = None, *, sr: float = 8000,
                 duration: float = 1.024, **clip_kwargs) -> tuple[np.ndarray, list[np.ndarray], list[tuple[Stem, ...]]]:
  """Samples and renders `n` clips.

  Args:
    seeds_or_rng: a generator or int seed (clips drawn one after another from it), or a sequence of seeds (one
      clip per seed, `n` then defaults to its length).
    n: number of clips.
    sr, duration: sample rate (Hz) and clip length (s).
    **clip_kwargs: passed to `sample_clip` (num_pitched, drums_prob, gain_range, ...).

  Returns:
    (mixtures float32 (n, T), per-clip stems [float32 (S_i, T)], per-clip specs [tuple of Stem]).
  """
  if isinstance(seeds_or_rng, (list, tuple, np.ndarray)):
    rngs = [np.random.default_rng(int(s)) for s in seeds_or_rng]
    if n is not None and n != len(rngs):
      raise ConfigError(f"batch_render got {len(rngs)} seeds but n={n}; pass n=None or as many seeds as clips")
  else:
    if n is None or n < 0:
      raise ConfigError(f"batch_render needs a clip count n >= 0 with a generator or a single seed, got n={n}")
    rng = np.random.default_rng(seeds_or_rng)
    rngs = [rng] * n
  specs = [sample_clip(r, sr=sr, duration=duration, **clip_kwargs) for r in rngs]
  rendered = [render_mixture(s, sr=sr, duration=duration) for s in specs]
  total = int(round(duration * sr))
  mix = np.stack([m for m, _ in rendered]) if rendered else np.zeros((0, total), np.float32)
  return mix, [p for _, p in rendered], specs
