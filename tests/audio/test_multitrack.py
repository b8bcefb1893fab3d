"""Tests of jaxlab.audio.multitrack on tiny fake MUSDB18-HQ and MoisesDB trees written into tmp_path."""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy.io import wavfile

from jaxlab.audio import multitrack
from jaxlab.errors import ConfigError, DataError

FILE_SR, SR = 16000, 8000
FREQS = {"vocals": 440.0, "drums": 300.0, "bass": 110.0, "other": 660.0}


def _tone(freq, seconds=0.5, amp=0.25, sr=FILE_SR):
  t = np.arange(int(seconds * sr)) / sr
  return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _write(path, x, kind="float32"):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  if kind == "int16":
    x = np.round(x * 32767).astype(np.int16)
  wavfile.write(path, FILE_SR, x)


def _peak_hz(x, sr=SR):
  spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
  return np.fft.rfftfreq(len(x), 1 / sr)[np.argmax(spec)]


@pytest.fixture
def musdb(tmp_path):
  root = tmp_path / "musdb"
  for split, songs in (("train", ("B song", "A song")), ("test", ("C song",))):
    for song in songs:
      folder = root / split / song
      stems = {k: _tone(f) for k, f in FREQS.items()}
      for k, x in stems.items():
        _write(str(folder / f"{k}.wav"), x, "int16" if k in ("drums", "bass") else "float32")
      _write(str(folder / "mixture.wav"), np.stack([sum(stems.values())] * 2, axis=1))  # stereo mixture
  return str(root)


@pytest.fixture
def moises(tmp_path):
  root = tmp_path / "moises"
  for song in ("uuid-2", "uuid-1"):
    _write(str(root / song / "vocals" / "a.wav"), _tone(440.0), "int16")
    _write(str(root / song / "guitar" / "a.wav"), _tone(220.0, amp=0.2))
    _write(str(root / song / "guitar" / "b.wav"), _tone(880.0, amp=0.1))  # two files: summed into one stem
    (root / song / "data.json").write_text("{}")
  _write(str(root / "uuid-1" / "piano" / "p.wav"), _tone(330.0, amp=0.1))  # a stem only uuid-1 has
  return str(root)


def test_musdb_listing_and_loading(musdb):
  assert multitrack.detect_layout(musdb) == "musdb"
  songs = multitrack.list_songs(musdb)
  assert [s.name for s in songs] == ["A song", "B song", "C song"]
  assert [s.split for s in songs] == ["train", "train", "test"]
  assert [s.name for s in multitrack.list_songs(musdb, split="test")] == ["C song"]
  song = songs[0]
  assert sorted(song.stems) == sorted(FREQS) and song.mixture.endswith("mixture.wav")
  mix, stems = multitrack.load_song(song, sr=SR)
  assert mix.shape == (4000,) and mix.dtype == np.float32 and set(stems) == set(FREQS)
  for k, x in stems.items():
    assert x.shape == (4000,) and _peak_hz(x) == pytest.approx(FREQS[k], abs=2.5), k  # resampled 16k -> 8k
    assert np.abs(x).max() == pytest.approx(0.25, abs=0.01)  # int16 and float32 both scaled to [-1, 1]
  np.testing.assert_allclose(mix, sum(stems.values()), atol=2e-3)  # the stereo mixture averaged to mono
  mix2, only = multitrack.load_song(song, sr=SR, stems=["vocals"], max_seconds=0.25)
  assert list(only) == ["vocals"] and mix2.shape == only["vocals"].shape == (2000,)
  stereo, st = multitrack.load_song(song, sr=FILE_SR, mono=False)
  assert stereo.shape == (2, 8000) and st["vocals"].shape == (2, 8000)


def test_moisesdb_sums_stem_files_and_builds_the_mixture(moises):
  assert multitrack.detect_layout(moises) == "moisesdb"
  songs = multitrack.list_songs(moises)
  assert [s.name for s in songs] == ["uuid-1", "uuid-2"] and songs[0].mixture is None
  assert len(songs[1].stems["guitar"]) == 2 and sorted(songs[0].stems) == ["guitar", "piano", "vocals"]
  mix, stems = multitrack.load_song(songs[1], sr=SR, stems=["guitar", "vocals", "piano"])
  guitar = stems["guitar"]
  expect = 0.2 * np.sin(2 * np.pi * 220 * np.arange(4000) / SR) + 0.1 * np.sin(2 * np.pi * 880 * np.arange(4000) / SR)
  np.testing.assert_allclose(guitar[100:-100], expect[100:-100], atol=5e-3)
  assert not stems["piano"].any()  # a stem the song lacks is silence
  np.testing.assert_allclose(mix, stems["guitar"] + stems["vocals"], atol=1e-6)
  assert _peak_hz(stems["vocals"]) == pytest.approx(440.0, abs=2.5)
  mix1, _ = multitrack.load_song(songs[0], sr=SR, stems=["vocals"])  # the mixture sums ALL stems, piano included
  _, all1 = multitrack.load_song(songs[0], sr=SR)
  np.testing.assert_allclose(mix1, all1["guitar"] + all1["vocals"] + all1["piano"], atol=1e-6)
  assert _peak_hz(all1["piano"]) == pytest.approx(330.0, abs=2.5)


def test_layout_errors(tmp_path, musdb):
  (tmp_path / "empty" / "x").mkdir(parents=True)
  with pytest.raises(DataError, match=r"expected <root>/train/<song>/vocals.wav"):
    multitrack.list_songs(str(tmp_path / "empty"))
  with pytest.raises(DataError, match="is not a folder"):
    multitrack.list_songs(str(tmp_path / "missing"))
  with pytest.raises(DataError, match="no moisesdb songs"):
    multitrack.list_songs(musdb + "/train/A song", layout="moisesdb")
  with pytest.raises(ConfigError, match="unknown multitrack layout"):
    multitrack.list_songs(musdb, layout="slakh")
  with pytest.raises(ConfigError, match="split must be"):
    multitrack.list_songs(musdb, split="valid")


def test_process_slice_partitions():
  items = list(range(11))
  parts = [multitrack.process_slice(items, process_index=i, process_count=3) for i in range(3)]
  assert sorted(x for p in parts for x in p) == items and sum(map(len, parts)) == len(items)
  assert parts[1] == [1, 4, 7, 10]
  assert multitrack.process_slice(items) == items  # one process by default
  with pytest.raises(ConfigError, match="process_index"):
    multitrack.process_slice(items, process_index=3, process_count=3)


def test_clips_drop_silent_windows():
  sr = 100
  mix = np.concatenate([np.ones(100), np.zeros(100), np.ones(100)]).astype(np.float32)
  stems = {"a": 0.5 * mix, "b": 0.5 * mix}
  m, s = multitrack.clips((mix, stems), sr=sr, clip_seconds=1.0, hop_seconds=0.5)
  # windows start at 0, 50, 100, 150, 200; the one at 100 is silent
  assert m.shape == (4, 100) and s["a"].shape == (4, 100)
  np.testing.assert_array_equal(m[:, 0], [1, 1, 0, 1])
  np.testing.assert_array_equal(s["b"], 0.5 * m)
  m0, s0 = multitrack.clips((mix[:50], {"a": mix[:50]}), sr=sr, clip_seconds=1.0, hop_seconds=0.5)
  assert m0.shape == (0, 100) and s0["a"].shape == (0, 100)
  with pytest.raises(DataError, match="shape"):
    multitrack.clips((mix, {"a": mix[:10]}), sr=sr, clip_seconds=1.0, hop_seconds=0.5)


def test_iterate_features_batches(moises, musdb):
  songs = multitrack.list_songs(moises)
  batches = list(multitrack.iterate_features(songs, sr=SR, clip_seconds=0.2, hop_seconds=0.1,
                                             features_fn=lambda x: x[..., ::100], batch_size=3))
  # each 0.5 s song gives 4 windows of 0.2 s at 0.1 s steps -> 8 clips -> batches of 3, 3, 2
  assert [b["mix"].shape for b in batches] == [(3, 16), (3, 16), (2, 16)]
  assert set(batches[0]) == {"mix", "guitar", "piano", "vocals"}
  assert not batches[-1]["piano"].any() and batches[0]["piano"].any()  # uuid-2 (last) has no piano
  kept = list(multitrack.iterate_features(multitrack.list_songs(musdb, split="train"), sr=SR, clip_seconds=0.2,
                                          hop_seconds=0.1, features_fn=None, batch_size=3, stems=["bass"],
                                          drop_remainder=True))
  assert len(kept) == 2 and kept[0]["bass"].shape == (3, 1600) and set(kept[0]) == {"mix", "bass"}
