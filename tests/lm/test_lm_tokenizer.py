"""Tokenizers: byte-level round trips, offline BPE training, HF tokenizer.json loading and its errors."""

import json
import os
import sys

import numpy as np
import pytest

from jaxlab.errors import DataError, MissingDependencyError
from jaxlab.lm import tokenizer as tok_lib


def random_texts(n, seed=0, max_len=40):
  """Random strings over ASCII, Latin, CJK, emoji and other planes (no lone surrogates)."""
  rng = np.random.default_rng(seed)
  ranges = [(0x20, 0x7f), (0x0, 0x20), (0xa0, 0x2ff), (0x370, 0x52f), (0x4e00, 0x9fff), (0x1f300, 0x1faff),
            (0xe000, 0xf8ff), (0x10000, 0x10ffff)]
  out = []
  for _ in range(n):
    chars = []
    for _ in range(int(rng.integers(0, max_len))):
      lo, hi = ranges[int(rng.integers(len(ranges)))]
      chars.append(chr(int(rng.integers(lo, hi))))
    out.append("".join(chars))
  return out


def corpus():
  from pydoc_data import topics  # ships with CPython: ~460 kB of English technical text
  return list(topics.topics.values())


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
  pytest.importorskip("tokenizers")
  path = str(tmp_path_factory.mktemp("bpe"))
  tok_lib.train_bpe(corpus(), 600, path)
  return path


# ------------------------------------------------------------------------------------------------- bytes

def test_byte_round_trip_random_unicode():
  tok = tok_lib.ByteTokenizer()
  for text in random_texts(300) + ["", "héllo wörld", "日本語\n\t", "😀👍🏽", "\x00\x7f"]:
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    with_specials = tok.encode(text, add_bos=True, add_eos=True)
    assert with_specials[0] == tok.bos_id and with_specials[-1] == tok.eos_id
    assert tok.decode(with_specials, skip_special=True) == text
    assert tok.decode(with_specials) == tok_lib.BOS + text + tok_lib.EOS
  assert all(0 <= i < tok.vocab_size for t in random_texts(20, seed=1) for i in tok.encode(t))


def test_byte_specials_layout_and_parsing():
  tok = tok_lib.ByteTokenizer(["<tool>", "</tool>", "<tool_result>"])
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (256, 257, 258)
  assert tok.vocab_size == 262 and tok.special_ids["<tool_result>"] == 261
  assert isinstance(tok, tok_lib.Tokenizer)
  text = "a<tool>f(x)</tool><tool_result>3<|eos|>"
  ids = tok.encode(text)
  assert ids == [97, 259, *b"f(x)", 260, 261, 51, 258]  # longest special name wins
  assert tok.decode(ids) == text  # still lossless
  assert tok.decode(ids, skip_special=True) == "af(x)3"
  raw = tok_lib.ByteTokenizer(["<tool>"], parse_specials=False)
  assert raw.encode("<tool>") == list(b"<tool>")
  with pytest.raises(DataError, match="distinct"):
    tok_lib.ByteTokenizer(["<|eos|>"])


def test_byte_decode_bad_input():
  tok = tok_lib.ByteTokenizer()
  assert tok.decode([104, 0xe6, 0x97]) == "h\ufffd"  # a cut multi-byte character
  assert tok.decode(np.array([104, 105], np.int32)) == "hi"
  with pytest.raises(DataError, match="outside"):
    tok.decode([tok.vocab_size])


# --------------------------------------------------------------------------------------------------- BPE

def test_train_bpe_round_trip_and_reload(bpe_dir):
  tok = tok_lib.HFTokenizer.from_file(bpe_dir)
  assert tok.vocab_size == 600
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  assert isinstance(tok, tok_lib.Tokenizer)
  texts = corpus()[:5] + random_texts(100, seed=2) + ["", "  leading and trailing spaces  ", "a<|eos|>b"]
  for text in texts:
    ids = tok.encode(text)
    assert tok.decode(ids) == text, text
    assert all(0 <= i < tok.vocab_size for i in ids)
  assert tok.encode("x<|eos|>")[-1] == tok.eos_id  # special names parse
  ids = tok.encode("hello", add_bos=True, add_eos=True)
  assert ids[0] == 1 and ids[-1] == 2 and tok.decode(ids, skip_special=True) == "hello"
  # BPE actually merges: English text needs far fewer tokens than bytes.
  sample = corpus()[7][:2000]
  assert len(tok.encode(sample)) < 0.6 * len(sample.encode())
  # The file path and the folder load the same tokenizer; load_tokenizer dispatches paths.
  same = tok_lib.HFTokenizer.from_file(os.path.join(bpe_dir, "tokenizer.json"))
  assert same.encode(sample) == tok.encode(sample)
  assert tok_lib.load_tokenizer(bpe_dir).encode(sample) == tok.encode(sample)


def test_hf_special_token_config(bpe_dir, tmp_path):
  with open(os.path.join(bpe_dir, "tokenizer.json")) as f:
    data = f.read()
  # special_tokens_map.json with {"content": ...} entries; no pad -> falls back to EOS.
  d1 = tmp_path / "map"
  d1.mkdir()
  (d1 / "tokenizer.json").write_text(data)
  (d1 / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": "<|pad|>"},
                                                          "eos_token": "<|bos|>"}))
  t1 = tok_lib.HFTokenizer.from_file(str(d1))
  assert (t1.bos_id, t1.eos_id, t1.pad_id) == (0, 1, 1)
  # tokenizer_config.json wins over special_tokens_map.json; bos may be null.
  (d1 / "tokenizer_config.json").write_text(json.dumps({"bos_token": None, "eos_token": "<|eos|>"}))
  t2 = tok_lib.HFTokenizer.from_file(str(d1))
  assert t2.bos_id is None and t2.eos_id == 2
  with pytest.raises(DataError, match="no BOS"):
    t2.encode("x", add_bos=True)
  # No config files: roles from well-known names.
  d2 = tmp_path / "bare"
  d2.mkdir()
  (d2 / "tokenizer.json").write_text(data)
  t3 = tok_lib.HFTokenizer.from_file(str(d2))
  assert (t3.pad_id, t3.bos_id, t3.eos_id) == (0, 1, 2)
  # A config naming a token the vocabulary lacks.
  (d2 / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
  with pytest.raises(DataError, match="'</s>' is not in the tokenizer's vocabulary"):
    tok_lib.HFTokenizer.from_file(str(d2))


def test_hf_file_errors_are_one_line(tmp_path):
  pytest.importorskip("tokenizers")
  with pytest.raises(DataError, match="does not exist") as e:
    tok_lib.load_tokenizer(str(tmp_path / "missing.json"))
  assert "\n" not in str(e.value)
  bad = tmp_path / "tokenizer.json"
  bad.write_text("{not json")
  with pytest.raises(DataError, match="cannot read tokenizer file") as e:
    tok_lib.HFTokenizer.from_file(str(tmp_path))
  assert "\n" not in str(e.value)
  bad.write_text(json.dumps({"model": {"type": "Nope"}}))
  with pytest.raises(DataError, match="cannot read tokenizer file"):
    tok_lib.HFTokenizer.from_file(str(bad))


def test_missing_tokenizers_package(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "tokenizers", None)  # import now raises ImportError
  with pytest.raises(MissingDependencyError, match=r"jaxlab\[tokenizers\]"):
    tok_lib.HFTokenizer.from_file(str(tmp_path))
  with pytest.raises(MissingDependencyError):
    tok_lib.train_bpe(["abc"], 300)


def test_load_tokenizer_specs():
  assert isinstance(tok_lib.load_tokenizer("byte"), tok_lib.ByteTokenizer)
  t = tok_lib.load_tokenizer("byte:<tool>,</tool>", extra_specials=["<obs>"])
  assert list(t.special_ids)[3:] == ["<tool>", "</tool>", "<obs>"]
  with pytest.raises(DataError, match="only apply to the byte tokenizer"):
    tok_lib.load_tokenizer("some/dir", extra_specials=["<x>"])


def test_train_bpe_validates_sizes():
  pytest.importorskip("tokenizers")
  with pytest.raises(DataError, match="too small"):
    tok_lib.train_bpe(["abc"], 100)
