"""Multitrack song folders (MUSDB18-HQ and MoisesDB layouts): listing, WAV loading, host slicing, clips, features.

Layouts (detected automatically, or named with `layout=`):

* MUSDB18-HQ (Rafii et al. 2019, "MUSDB18-HQ - an uncompressed version of MUSDB18"): `root/{train,test}/<song>/`
  holding `mixture.wav` and one WAV per stem (`vocals`, `drums`, `bass`, `other`).
* MoisesDB (Pereira et al. 2023, "MoisesDB: A Dataset for Source Separation Beyond 4-Stems"):
  `root/<song-uuid>/<stem-name>/*.wav`, one or more WAV files per stem folder (summed into the stem) and a
  `data.json` per song (ignored). There is no mixture file: the mixture is the sum of all stems.

WAVs are read with scipy.io.wavfile (PCM int16 / int32 / 24-bit-in-int32 / uint8 and float32 / float64) and mapped
to float32 in [-1, 1], resampled with scipy.signal.resample_poly when the file's rate differs from the requested
one, and averaged over channels for mono. Songs are listed sorted by name, so every host sees the same list and
`process_slice` gives each host a disjoint share (items i with i % process_count == process_index).
`iterate_features` cuts songs into fixed-length clips (silent clips dropped) and applies a caller-supplied
feature function (e.g. a jitted log-mel) to batches of clips on the host.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from jaxlab.errors import ConfigError, DataError

LAYOUTS = ("musdb", "moisesdb")
MUSDB_SPLITS = ("train", "test")
MIXTURE = "mixture"


@dataclasses.dataclass(frozen=True)
class Song:
  """One song of a multitrack folder.

  Attributes:
    name: the song folder's name (MUSDB18-HQ: "Artist - Title"; MoisesDB: the song's uuid).
    stems: {stem name: sorted WAV paths}; the files of one stem are summed.
    mixture: path of the mixture WAV, or None (MoisesDB): the mixture is then the sum of all stems.
    split: "train" / "test" for MUSDB18-HQ, None for MoisesDB.
  """
  name: str
  stems: dict[str, list[str]]
  mixture: str | None = None
  split: str | None = None


def _wavs(folder: str) -> list[str]:
  try:
    names = sorted(os.listdir(folder))
  except OSError:
    return []
  return [os.path.join(folder, n) for n in names
          if n.lower().endswith(".wav") and not n.startswith(".") and os.path.isfile(os.path.join(folder, n))]


def _subdirs(folder: str) -> list[str]:
  try:
    names = sorted(os.listdir(folder))
  except OSError:
    return []
  return [n for n in names if not n.startswith(".") and os.path.isdir(os.path.join(folder, n))]


def _musdb_song(folder: str, name: str, split: str) -> Song | None:
  stems, mixture = {}, None
  for path in _wavs(folder):
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem == MIXTURE:
      mixture = path
    else:
      stems[stem] = [path]
  return Song(name, stems, mixture, split) if stems else None


def _moises_song(folder: str, name: str) -> Song | None:
  stems = {}
  for stem in _subdirs(folder):
    files = _wavs(os.path.join(folder, stem))
    if files:
      stems[stem] = files
  return Song(name, stems, None, None) if stems else None


def detect_layout(root: str) -> str:
  """"musdb" or "moisesdb" from the folder structure under `root`.

  Raises:
    DataError: `root` is not a folder or matches neither layout.
  """
  if not os.path.isdir(root):
    raise DataError(f"multitrack root {root!r} is not a folder; pass the folder holding train/ and test/ "
                    f"(MUSDB18-HQ) or the song folders (MoisesDB)")
  for split in MUSDB_SPLITS:
    if any(_wavs(os.path.join(root, split, song)) for song in _subdirs(os.path.join(root, split))):
      return "musdb"
  for song in _subdirs(root):
    if song not in MUSDB_SPLITS and any(_wavs(os.path.join(root, song, s)) for s in _subdirs(os.path.join(root, song))):
      return "moisesdb"
  raise DataError(f"{root!r} matches no multitrack layout: expected <root>/train/<song>/vocals.wav (MUSDB18-HQ) or "
                  f"<root>/<song>/<stem>/<file>.wav (MoisesDB)")


def list_songs(root: str, *, split: str | None = None, layout: str | None = None) -> list[Song]:
  """The songs under `root`, sorted by name (then split), the same on every host.

  Args:
    root: the dataset folder.
    split: MUSDB18-HQ only: "train" or "test"; None lists both. MoisesDB has no split folders (split=None).
    layout: "musdb", "moisesdb", or None to detect it.

  Returns:
    Songs with at least one stem WAV.

  Raises:
    ConfigError: unknown layout or split; DataError: no songs found in that layout.
  """
  if layout is None:
    layout = detect_layout(root)
  if layout not in LAYOUTS:
    raise ConfigError(f"unknown multitrack layout {layout!r}; pass one of {', '.join(LAYOUTS)} or None to detect it")
  if layout == "musdb":
    if split is not None and split not in MUSDB_SPLITS:
      raise ConfigError(f"MUSDB18-HQ split must be 'train', 'test' or None (both), got {split!r}")
    songs = [s for sp in ((split,) if split else MUSDB_SPLITS) for name in _subdirs(os.path.join(root, sp))
             if (s := _musdb_song(os.path.join(root, sp, name), name, sp)) is not None]
    example = f"{root}/{split or 'train'}/<song>/vocals.wav"
  else:
    if split is not None:
      raise ConfigError(f"split={split!r} applies to MUSDB18-HQ only; MoisesDB has no split folders: pass split=None "
                        f"and split the song list yourself")
    songs = [s for name in _subdirs(root) if (s := _moises_song(os.path.join(root, name), name)) is not None]
    example = f"{root}/<song>/<stem>/<file>.wav"
  if not songs:
    raise DataError(f"no {layout} songs under {root!r}: expected files like {example}")
  return sorted(songs, key=lambda s: (s.name, s.split or ""))


def read_wav(path: str, *, sr: int | None = None, mono: bool = True, max_seconds: float | None = None) -> np.ndarray:
  """One WAV as float32 in [-1, 1], optionally truncated, resampled and averaged to mono.

  Args:
    path: the WAV file.
    sr: target rate (Hz); None keeps the file's rate.
    mono: average the channels.
    max_seconds: keep at most this many seconds.

  Returns:
    float32 (T,) when mono, else (C, T).

  Raises:
    DataError: the file is unreadable or has an unsupported sample type.
  """
  from scipy import signal
  from scipy.io import wavfile
  try:
    try:
      rate, data = wavfile.read(path, mmap=True)  # only the kept part is read from disk
    except (ValueError, TypeError):
      rate, data = wavfile.read(path)  # formats mmap cannot map (e.g. 24-bit)
  except (OSError, ValueError) as e:
    raise DataError(f"cannot read WAV {path!r} ({e}); re-encode it as PCM or float WAV") from e
  if max_seconds is not None:
    data = data[:int(math.ceil(max_seconds * rate)) + 1]
  if data.dtype == np.uint8:
    x = (data.astype(np.float32) - 128.0) / 128.0
  elif data.dtype.kind == "i":
    x = data.astype(np.float32) / float(2 ** (8 * data.dtype.itemsize - 1))
  elif data.dtype.kind == "f":
    x = np.asarray(data, np.float32)
  else:
    raise DataError(f"WAV {path!r} has unsupported samples of type {data.dtype}; re-encode it as int16 or float32")
  x = x[:, None] if x.ndim == 1 else x
  x = x.mean(1) if mono else x.T
  if sr is not None and int(sr) != int(rate):
    g = math.gcd(int(sr), int(rate))
    x = signal.resample_poly(x, int(sr) // g, int(rate) // g, axis=-1).astype(np.float32)
  if max_seconds is not None:
    x = x[..., :int(round(max_seconds * (sr or rate)))]
  return np.ascontiguousarray(x, np.float32)


def _fit(x: np.ndarray, length: int) -> np.ndarray:
  if x.shape[-1] >= length:
    return x[..., :length]
  return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, length - x.shape[-1])])


def _sum(arrays: Sequence[np.ndarray], what: str) -> np.ndarray:
  length = max(a.shape[-1] for a in arrays)
  lead = (max(a.shape[0] for a in arrays),) if arrays[0].ndim > 1 else ()
  out = np.zeros(lead + (length,), np.float32)
  for a in arrays:
    if a.ndim > 1 and a.shape[0] not in (1, lead[0]):
      raise DataError(f"{what}: files with {a.shape[0]} and {lead[0]} channels cannot be summed; use mono=True")
    out[..., :a.shape[-1]] += a
  return out


def load_song(song: Song, *, sr: int, mono: bool = True, stems: Sequence[str] | None = None,
              max_seconds: float | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """Reads a song's mixture and stems at rate `sr`.

  The files of one stem are summed. Without a mixture file, the mixture is the sum of ALL the song's stems (not
  only the requested ones). Every returned array has the mixture's length (stems are cut or zero-padded to it).
  A requested stem the song does not have (MoisesDB songs differ in their stems) is returned as silence.

  Args:
    song: from `list_songs`.
    sr: target sample rate (Hz).
    mono: average channels (arrays (T,)); otherwise arrays (C, T) (mono files broadcast to the others' channels).
    stems: stem names to return; None returns all of the song's stems.
    max_seconds: read at most this many seconds.

  Returns:
    (mixture float32, {stem: float32}).
  """
  if not sr or sr <= 0:
    raise ConfigError(f"load_song needs a sample rate sr > 0, got {sr!r}")
  names = sorted(song.stems) if stems is None else list(stems)
  need = sorted(song.stems) if song.mixture is None else [n for n in names if n in song.stems]
  audio = {n: _sum([read_wav(p, sr=sr, mono=mono, max_seconds=max_seconds) for p in song.stems[n]],
                   f"stem {n!r} of {song.name!r}") for n in need}
  if song.mixture is not None:
    mix = read_wav(song.mixture, sr=sr, mono=mono, max_seconds=max_seconds)
  else:
    mix = _sum(list(audio.values()), f"mixture of {song.name!r}")
  length = mix.shape[-1]
  if not mono:  # mono files broadcast to the channel count of the others
    channels = max([mix.shape[0]] + [x.shape[0] for x in audio.values()])
    for what, x in [("the mixture", mix)] + [(f"stem {n!r}", x) for n, x in audio.items()]:
      if x.shape[0] not in (1, channels):
        raise DataError(f"{what} of {song.name!r} has {x.shape[0]} channels, another file {channels}; use mono=True")
    mix = np.broadcast_to(mix, (channels, length)).copy()
  out = {n: np.broadcast_to(_fit(audio[n], length), mix.shape).copy() if n in audio else np.zeros_like(mix)
         for n in names}
  return mix, out


def process_slice(items: Sequence[Any], *, process_index: int | None = None,
                  process_count: int | None = None) -> list[Any]:
  """This host's share of `items`: items[i] for i % process_count == process_index.

  Defaults come from jax.process_index() / jax.process_count(); the shares of all hosts are disjoint and cover
  `items` (given the same order on every host, e.g. `list_songs`'s).
  """
  if process_index is None or process_count is None:
    import jax
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ConfigError(f"process_slice needs 0 <= process_index < process_count, got process_index={process_index}, "
                      f"process_count={process_count}")
  return [x for i, x in enumerate(items) if i % process_count == process_index]


def clips(song_arrays: tuple[np.ndarray, dict[str, np.ndarray]], *, sr: int, clip_seconds: float,
          hop_seconds: float, silence_rms: float = 1e-4) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """Fixed-length windows over a song's mixture and stems, silent ones dropped.

  Windows start at 0, hop, 2 hop, ... and lie wholly inside the song (a song shorter than one clip gives none).
  A window whose mixture rms is below `silence_rms` is dropped from every array.

  Args:
    song_arrays: (mixture (..., T), {stem: (..., T)}) as from `load_song`.
    sr: their sample rate (Hz).
    clip_seconds, hop_seconds: window length and step in seconds.
    silence_rms: rms threshold of the mixture below which a window is dropped.

  Returns:
    (mixture (n_clips, ..., L), {stem: (n_clips, ..., L)}) float32 with L = round(clip_seconds * sr).
  """
  mix, stems = song_arrays
  size, hop = int(round(clip_seconds * sr)), int(round(hop_seconds * sr))
  if size < 1 or hop < 1:
    raise ConfigError(f"clips needs clip_seconds and hop_seconds of at least one sample at sr={sr}, got "
                      f"clip_seconds={clip_seconds}, hop_seconds={hop_seconds}")
  for name, x in stems.items():
    if x.shape != mix.shape:
      raise DataError(f"stem {name!r} has shape {x.shape} but the mixture {mix.shape}; load them with load_song")
  total = mix.shape[-1]
  starts = np.arange(0, total - size + 1, hop) if total >= size else np.zeros(0, int)

  def cut(x):
    if not len(starts):
      return np.zeros((0,) + x.shape[:-1] + (size,), np.float32)
    return np.stack([x[..., s:s + size] for s in starts]).astype(np.float32)

  mix_c = cut(mix)
  rms = np.sqrt(np.mean(np.square(mix_c, dtype=np.float64), axis=tuple(range(1, mix_c.ndim))))
  keep = rms >= silence_rms
  return mix_c[keep], {n: cut(x)[keep] for n, x in stems.items()}


def iterate_features(songs: Sequence[Song], *, sr: int, clip_seconds: float, hop_seconds: float,
                     features_fn: Callable[[np.ndarray], Any] | None, batch_size: int,
                     stems: Sequence[str] | None = None, mono: bool = True, max_seconds: float | None = None,
                     silence_rms: float = 1e-4, drop_remainder: bool = False) -> Iterator[dict[str, Any]]:
  """Batches of per-clip features of songs' mixtures and stems, computed on the host.

  Songs are read in order (pass `process_slice(songs)` for this host's share), cut with `clips`, and collected
  into batches of `batch_size` clips across song boundaries; `features_fn` is applied to each (batch, L) array.

  Args:
    songs: from `list_songs`.
    sr, clip_seconds, hop_seconds, silence_rms: as in `load_song` / `clips`.
    features_fn: maps a float32 (batch, ..., L) waveform array to features (e.g. a jitted log-mel); None keeps
      waveforms.
    batch_size: clips per batch.
    stems: stem names of every batch; None: the union of the songs' stems (a song lacking one gives silence).
    mono, max_seconds: passed to `load_song`.
    drop_remainder: drop the last, smaller batch (keeps shapes fixed for jitted consumers).

  Yields:
    {"mix": features, "<stem>": features, ...} with a leading batch axis.
  """
  if batch_size < 1:
    raise ConfigError(f"iterate_features needs batch_size >= 1, got {batch_size}")
  names = sorted({n for s in songs for n in s.stems}) if stems is None else list(stems)
  if "mix" in names:
    raise ConfigError("a stem named 'mix' collides with the mixture's key in iterate_features; rename the stem")
  fn = features_fn if features_fn is not None else (lambda x: x)
  keys = ["mix"] + names
  pending: dict[str, list[np.ndarray]] = {k: [] for k in keys}
  count = 0
  for song in songs:
    arrays = load_song(song, sr=sr, mono=mono, stems=names, max_seconds=max_seconds)
    mix, per = clips(arrays, sr=sr, clip_seconds=clip_seconds, hop_seconds=hop_seconds, silence_rms=silence_rms)
    for k, v in zip(keys, [mix] + [per[n] for n in names]):
      pending[k].append(v)
    count += len(mix)
    if count < batch_size:
      continue
    cat = {k: np.concatenate(v) for k, v in pending.items()}
    full = count - count % batch_size
    for i in range(0, full, batch_size):
      yield {k: fn(v[i:i + batch_size]) for k, v in cat.items()}
    pending = {k: [v[full:]] for k, v in cat.items()}
    count -= full
  if count and not drop_remainder:
    yield {k: fn(np.concatenate(v)) for k, v in pending.items()}
