"""Tests of jaxlab.audio.synth: determinism, band-limiting, harmonic signatures, re-timbring checked from spectra."""

from __future__ import annotations

import numpy as np
import pytest

from jaxlab.audio import synth
from jaxlab.errors import ConfigError

SR = 8000
N_FFT, HOP = 512, 64


def _stft_power(x):
  """|STFT|^2 with a periodic Hann window, frames (F, n_fft // 2 + 1) centred at `_frame_times`.

  The clip is preceded by n_fft zeros (silence), so a note at t = 0 also enters the frames from outside.
  """
  pad = np.pad(x.astype(np.float64), (N_FFT, N_FFT // 2))
  n = 1 + (len(pad) - N_FFT) // HOP
  idx = np.arange(N_FFT)[None, :] + HOP * np.arange(n)[:, None]
  win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)
  return np.abs(np.fft.rfft(pad[idx] * win, axis=1)) ** 2


def _frame_times(n_frames):
  return (np.arange(n_frames) * HOP - N_FFT // 2) / SR


def _parabolic(y, i):
  """Sub-sample location of the peak of y at index i (parabola through i - 1, i, i + 1)."""
  a, b, c = y[i - 1], y[i], y[i + 1]
  den = a - 2 * b + c
  return i + (0.5 * (a - c) / den if den != 0 else 0.0)


def _onsets(power):
  """Onset times (s): peaks of the positive frame-to-frame rise of the frame energy.

  A step of energy entering a Hann-weighted frame raises the frame energy fastest when it reaches the frame's
  centre, so the rise between frames j - 1 and j peaks at the onset (half-way between their centres).
  """
  energy = power.sum(1)
  rise = np.maximum(np.diff(energy), 0.0)
  thr = 0.1 * rise.max()
  out = []
  for i in range(1, len(rise) - 1):
    if rise[i] > thr and rise[i] >= rise[i - 1] and rise[i] > rise[i + 1]:
      out.append((_parabolic(rise, i) + 0.5) * HOP / SR + _frame_times(1)[0])
  return np.array(out)


def _frame_pitch(p):
  """MIDI pitch of one frame: the lowest local maximum above 20% of the frame's peak, parabolic on log power."""
  logp = np.log(p + 1e-20)
  strong = np.flatnonzero((p[1:-1] > 0.2 * p.max()) & (p[1:-1] >= p[:-2]) & (p[1:-1] > p[2:])) + 1
  k = _parabolic(logp, strong[0])
  return 69 + 12 * np.log2(k * SR / N_FFT / 440.0)


def _note_pitches(power, notes):
  """Median frame pitch over the frames that lie wholly inside each note's sustain part."""
  half = N_FFT / 2 / SR
  out = []
  for n in notes:
    t = _frame_times(len(power))
    inside = (t >= n.onset + half + 0.01) & (t <= n.onset + n.duration - half - 0.05)
    assert inside.sum() >= 3, n
    out.append(np.median([_frame_pitch(power[j]) for j in np.flatnonzero(inside)]))
  return np.array(out)


def _sustained(instrument, pitch):
  x = synth.render_stem(synth.Stem(instrument, (synth.Note(0.0, 1.0, pitch),)), sr=SR, duration=1.0)
  seg = x[int(0.2 * SR):int(0.8 * SR)].astype(np.float64)
  spec = np.abs(np.fft.rfft(seg * np.hanning(len(seg)))) ** 2
  freqs = np.fft.rfftfreq(len(seg), 1 / SR)
  return freqs, spec


def _band(freqs, spec, f, rel=0.06):
  return spec[(freqs > f * (1 - rel)) & (freqs < f * (1 + rel))].sum()


def test_determinism_and_lengths():
  a = synth.sample_clip(7, num_pitched=2, drums_prob=1.0)
  b = synth.sample_clip(np.random.default_rng(7), num_pitched=2, drums_prob=1.0)
  assert a == b and len(a) == 3 and a[-1].instrument == "drums"
  assert a[0].instrument != a[1].instrument
  m1, p1 = synth.render_mixture(a, sr=SR, duration=1.024)
  m2, p2 = synth.render_mixture(b, sr=SR, duration=1.024)
  np.testing.assert_array_equal(m1, m2)
  np.testing.assert_array_equal(p1, p2)
  assert m1.shape == (8192,) and p1.shape == (3, 8192) and m1.dtype == np.float32
  assert synth.render_stem(a[0], sr=16000, duration=0.3).shape == (4800,)
  assert synth.sample_clip(8, num_pitched=2) != a


def test_random_notes_grid_and_registers():
  for seed in range(20):
    clip = synth.sample_clip(seed, num_pitched=2, drums_prob=1.0, midi_range=(48, 84))
    low, high = clip[0], clip[1]
    assert all(48 <= n.pitch <= 65 for n in low.notes) and all(66 <= n.pitch <= 84 for n in high.notes)
    for stem in clip:
      ends = 0.0
      for n in stem.notes:
        assert abs(n.onset * 16 - round(n.onset * 16)) < 1e-9 and n.onset + n.duration <= 1.024 + 1e-9
        assert n.onset >= ends - 1e-9  # monophonic: no overlap
        ends = n.onset + n.duration
        if stem.pitched:
          assert n.duration >= 0.1875 - 1e-9
        else:
          assert n.pitch == 0
  one = synth.sample_clip(3, num_pitched=1, drums_prob=0.0)
  assert len(one) == 1 and one[0].pitched


def test_mixture_is_the_sum_and_stays_in_range():
  mix, stems, specs = synth.batch_render(0, 6, num_pitched=2, drums_prob=1.0)
  assert mix.shape == (6, 8192) and len(stems) == len(specs) == 6
  for m, s in zip(mix, stems):
    np.testing.assert_allclose(m, s.sum(0), atol=1e-6)
    assert np.abs(s).max() <= synth.HEADROOM + 1e-4 and np.abs(m).max() <= 1.0
  mix2, _, specs2 = synth.batch_render([5, 6], num_pitched=1)
  assert mix2.shape == (2, 8192) and specs2[0] == synth.sample_clip(5, num_pitched=1)


def test_every_instrument_peaks_near_one_before_gain():
  for inst in synth.PITCHED:
    x = synth.render_stem(synth.Stem(inst, (synth.Note(0.0, 0.5, 60),), gain=1 / synth.HEADROOM), sr=SR, duration=0.5)
    assert 0.9 < np.abs(x).max() <= 1.0 + 1e-4, inst
  d = synth.render_stem(synth.Stem("drums", (synth.Note(0.1, 0.06, 0),), gain=1 / synth.HEADROOM), sr=SR,
                        duration=0.5)
  assert abs(np.abs(d).max() - 1.0) < 1e-4 and not d[:800].any() and not d[800 + 480:].any()


def test_band_limited_clarinet_and_harmonic_signatures():
  f0 = synth.midi_to_hz(84)  # 1046.5 Hz at sr 8000: partials 1 and 3 only; 5 (5233 Hz) would fold to 2767 Hz
  freqs, spec = _sustained("clarinet", 84)
  assert freqs[np.argmax(spec)] == pytest.approx(f0, abs=3)
  e1 = _band(freqs, spec, f0)
  assert _band(freqs, spec, 2 * f0) < 0.01 * e1
  assert _band(freqs, spec, 3 * f0) > 0.05 * e1
  assert _band(freqs, spec, SR - 5 * f0) < 1e-6 * e1  # no aliased 5th partial
  assert (_band(freqs, spec, f0) + _band(freqs, spec, 3 * f0)) > 0.9999 * spec.sum()
  freqs, spec = _sustained("clarinet", 60)
  f0 = synth.midi_to_hz(60)
  assert _band(freqs, spec, 2 * f0, 0.02) < 0.01 * _band(freqs, spec, f0, 0.02)
  assert _band(freqs, spec, 5 * f0, 0.02) > 0.01 * _band(freqs, spec, f0, 0.02)
  for inst in ("violin", "organ"):
    freqs, spec = _sustained(inst, 60)
    assert _band(freqs, spec, 2 * f0) > 0.1 * _band(freqs, spec, f0), inst
  freqs, spec = _sustained("flute", 60)
  assert np.sqrt(_band(freqs, spec, 2 * f0) / _band(freqs, spec, f0)) == pytest.approx(0.15, abs=0.01)
  assert _band(freqs, spec, 3 * f0) < 1e-6 * _band(freqs, spec, f0)


def test_violin_vibrato_spreads_the_fundamental():
  f0 = synth.midi_to_hz(69)
  freqs, spec = _sustained("violin", 69)
  near = (freqs > f0 * 0.95) & (freqs < f0 * 1.05)
  centroid = (freqs[near] * spec[near]).sum() / spec[near].sum()
  spread = np.sqrt((((freqs[near] - centroid) ** 2) * spec[near]).sum() / spec[near].sum())
  assert centroid == pytest.approx(f0, rel=0.005)
  assert 0.01 * f0 < spread < 0.03 * f0  # a sinusoidal FM of depth 3% has rms deviation 3% / sqrt(2)


@pytest.mark.parametrize("source,target,seed", [("flute", "violin", 1), ("clarinet", "organ", 4)])
def test_retimbre_keeps_onsets_and_pitches_from_the_spectrum(source, target, seed):
  notes = synth.random_notes(seed, duration=1.024, sr=SR, midi_range=(50, 80), max_notes=4)
  assert len(notes) >= 2
  stem = synth.Stem(source, notes, gain=0.8)
  new = synth.retimbre(stem, target)
  assert new.instrument == target and new.notes == stem.notes and new.gain == stem.gain
  truth_on = np.array([n.onset for n in notes])
  truth_pitch = np.array([n.pitch for n in notes])
  for s in (stem, new):
    power = _stft_power(synth.render_stem(s, sr=SR, duration=1.024))
    on = _onsets(power)
    assert len(on) == len(notes), (s.instrument, on, truth_on)
    np.testing.assert_allclose(on, truth_on, atol=1.5 * HOP / SR)
    np.testing.assert_allclose(_note_pitches(power, notes), truth_pitch, atol=0.5)


def test_retimbre_errors():
  stem = synth.Stem("flute", (synth.Note(0.0, 0.5, 60),))
  with pytest.raises(ConfigError, match="cannot re-timbre a pitched 'flute' stem to 'drums'"):
    synth.retimbre(stem, "drums")
  with pytest.raises(ConfigError, match="cannot re-timbre"):
    synth.retimbre(synth.Stem("drums", (synth.Note(0.0, 0.06, 0),)), "organ")
  with pytest.raises(ConfigError, match="unknown instrument 'piano'"):
    synth.retimbre(stem, "piano")
  with pytest.raises(ConfigError, match="velocity"):
    synth.Note(0.0, 0.5, 60, velocity=0.0)


def test_edit_clip_ground_truth_changes_only_the_edited_stem():
  clip = synth.sample_clip(11, num_pitched=2, drums_prob=1.0)
  target = next(i for i in synth.PITCHED if i not in (clip[0].instrument, clip[1].instrument))
  edited = synth.edit_clip(clip, 1, target)
  assert edited[0] == clip[0] and edited[2] == clip[2] and edited[1] == synth.retimbre(clip[1], target)
  mix, stems = synth.render_mixture(clip, sr=SR, duration=1.024)
  mix_e, stems_e = synth.render_mixture(edited, sr=SR, duration=1.024)
  np.testing.assert_array_equal(stems[[0, 2]], stems_e[[0, 2]])
  assert np.abs(stems[1] - stems_e[1]).max() > 0.01
  np.testing.assert_allclose(mix_e - mix, stems_e[1] - stems[1], atol=1e-6)
  with pytest.raises(ConfigError, match="out of range"):
    synth.edit_clip(clip, 3, target)
