"""Word- or character-level token windows from real text, with a top-k vocabulary plus UNK.

Sources: CPython's `pydoc_data.topics` (ships with Python, offline: ~0.7 MB of English documentation), any
local UTF-8 text file (e.g. a TinyStories or WikiText dump), or tfds `wikitext` (loaded through
`jaxlab.data.tfds` on the user side; never at test time).
"""

from __future__ import annotations

import collections
import os
import re

import numpy as np

_WORD = re.compile(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]")


def pydoc_text() -> str:
  """All of CPython's `pydoc_data.topics` help texts, concatenated in key order (str)."""
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  return "\n".join(topics.topics[k] for k in sorted(topics.topics))


def read_text(path: str) -> str:
  """Reads a UTF-8 text file; a clear error if it is missing, empty or not text."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"text file {path!r} not found; pass a local UTF-8 .txt file (e.g. a TinyStories dump)")
  with open(path, "rb") as f:
    raw = f.read()
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    line = raw[:e.start].count(b"\n") + 1
    raise ValueError(f"{path}: line {line}: not valid UTF-8 ({e.reason}); convert the file to UTF-8 text") from None
  if not text.strip():
    raise ValueError(f"{path}: the file is empty")
  return text


def tokenize(text: str, level: str = "word") -> list[str]:
  """Lower-cased words / punctuation marks (level="word") or characters (level="char")."""
  if level == "word":
    return _WORD.findall(text.lower())
  if level == "char":
    return list(text)
  raise ValueError(f"level must be 'word' or 'char', got {level!r}")


def encode(tokens: list[str], vocab: int) -> tuple[np.ndarray, list[str]]:
  """Ids over the (vocab - 1) most frequent tokens plus UNK (id vocab - 1).

  Returns:
    ((n,) int32 ids, the vocabulary list: frequent tokens by decreasing count, then "<unk>").
  """
  if vocab < 2:
    raise ValueError(f"vocab must be >= 2 (top tokens + UNK), got {vocab}")
  counts = collections.Counter(tokens)
  words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab - 1]]
  index = {w: i for i, w in enumerate(words)}
  unk = len(words)
  ids = np.array([index.get(t, unk) for t in tokens], np.int32)
  return ids, words + ["<unk>"]


def windows(ids: np.ndarray, n: int, length: int, seed: int = 0) -> np.ndarray:
  """n random windows of `length` consecutive ids (without replacement when possible), (n, length) int32."""
  if len(ids) < length:
    raise ValueError(f"text has {len(ids)} tokens, fewer than the window length {length}")
  starts = np.random.default_rng(seed).choice(len(ids) - length + 1, size=n, replace=n > len(ids) - length + 1)
  return np.stack([ids[s:s + length] for s in np.sort(starts)]).astype(np.int32)
