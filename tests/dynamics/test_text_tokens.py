"""Real-text tokenisation: top-k vocabulary + UNK, windows, and clear errors on bad files."""

import numpy as np
import pytest

from jaxlab.dynamics import text


def test_encode_counts_by_hand():
  ids, vocab = text.encode(text.tokenize("The cat, the dog. The END"), 3)
  # the: 3, then ties of count 1 broken by string order ("," < "." < "cat" ...); the rest is UNK (id 2).
  assert vocab == ["the", ",", "<unk>"]
  assert list(ids) == [0, 2, 1, 0, 2, 2, 0, 2]


def test_pydoc_text_is_available_offline():
  toks = text.tokenize(text.pydoc_text())
  assert len(toks) > 50000
  ids, vocab = text.encode(toks, 65)
  w = text.windows(ids, 10, 16, seed=0)
  assert w.shape == (10, 16) and w.max() <= 64 and np.mean(ids == 64) < 0.6


def test_bad_files_are_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="not found"):
    text.read_text(str(tmp_path / "missing.txt"))
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"fine line\nsecond \xff line\n")
  with pytest.raises(ValueError, match="line 2"):
    text.read_text(str(bad))
