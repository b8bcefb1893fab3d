"""Tokenizers for the language-model stack: a file-free byte tokenizer and Hugging Face `tokenizers` files.

Both implement the `Tokenizer` protocol:

* `encode(text, *, add_bos=False, add_eos=False) -> list[int]` never adds special tokens on its own (the HF
  post-processor is bypassed), so callers such as `jaxlab.lm.sft` decide where BOS/EOS go. The NAMES of
  special tokens that occur in the text (e.g. "<|eos|>" or a tool marker registered as a special) encode to
  their single id.
* `decode(ids, *, skip_special=False) -> str`.
* `vocab_size`, `bos_id`, `eos_id`, `pad_id` (ints; `bos_id` may be None for tokenizers without one) and
  `special_ids` ({token string: id}).

`ByteTokenizer` maps each UTF-8 byte to its own id (0..255) and puts the specials after the bytes (pad 256,
bos 257, eos 258, then any extra specials such as tool/observation markers), so any text round-trips
losslessly. `HFTokenizer.from_file(path)` wraps a local `tokenizer.json` (the `tokenizers` package, extra
`jaxlab[tokenizers]`) and reads BOS/EOS/PAD from `tokenizer_config.json` / `special_tokens_map.json` next to
it. `train_bpe` trains a small byte-level BPE offline (tests, tiny experiments); `load_tokenizer(spec)` turns
a config string ("byte", "byte:<tool>,</tool>" or a path) into a tokenizer.

Example:
  >>> tok = ByteTokenizer()
  >>> tok.decode(tok.encode("12+3=", add_bos=True)[1:])
  '12+3='
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterable, Mapping, Protocol, Sequence, runtime_checkable

from jaxlab.errors import DataError, require

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
DEFAULT_SPECIALS = (PAD, BOS, EOS)

# Names other libraries use for the same roles, tried in order when a tokenizer file has no config.
_BOS_NAMES = (BOS, "<s>", "<bos>", "<|begin_of_text|>", "[BOS]", "<|startoftext|>")
_EOS_NAMES = (EOS, "</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "[EOS]", "<|eot_id|>")
_PAD_NAMES = (PAD, "<pad>", "[PAD]", "<|finetune_right_pad_id|>")


@runtime_checkable
class Tokenizer(Protocol):
  """What the LM code needs from a tokenizer (see the module docstring for the semantics)."""

  vocab_size: int
  bos_id: int | None
  eos_id: int
  pad_id: int
  special_ids: Mapping[str, int]

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...

  def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str: ...


def _special_pattern(names: Iterable[str]) -> re.Pattern | None:
  names = sorted(set(names), key=len, reverse=True)  # longest first: "<tool_result>" before "<tool>"
  return re.compile("(" + "|".join(re.escape(n) for n in names) + ")") if names else None


class ByteTokenizer:
  """UTF-8 bytes as tokens; needs no files.

  Ids 0..255 are the bytes; then `<|pad|>` (256), `<|bos|>` (257), `<|eos|>` (258) and the extra specials in
  the given order (259, ...). `vocab_size = 259 + len(extra_specials)`.

  Args:
    extra_specials: further special tokens, e.g. ("<tool>", "</tool>", "<obs>", "</obs>"); each becomes one
      id, and its name in a text encodes to that id.
    parse_specials: encode the names of ALL specials (including pad/bos/eos) found in a text to their ids
      (default). With False only raw bytes are produced and specials are added by `add_bos`/`add_eos` only.
  """

  def __init__(self, extra_specials: Sequence[str] = (), *, parse_specials: bool = True):
    names = list(DEFAULT_SPECIALS) + list(extra_specials)
    if len(set(names)) != len(names) or any(not n for n in names):
      raise DataError(f"special tokens must be distinct non-empty strings, got {names}")
    self.special_ids = {name: 256 + i for i, name in enumerate(names)}
    self._id_to_special = {i: n for n, i in self.special_ids.items()}
    self.pad_id, self.bos_id, self.eos_id = (self.special_ids[n] for n in DEFAULT_SPECIALS)
    self.vocab_size = 256 + len(names)
    self.parse_specials = parse_specials
    self._pattern = _special_pattern(names) if parse_specials else None

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Encodes `text` as its UTF-8 bytes (and special-token names as their ids).

    Args:
      text: any Python string (lone surrogates are encoded with `surrogatepass`).
      add_bos: prepend `bos_id`.
      add_eos: append `eos_id`.

    Returns:
      list of int ids in [0, vocab_size).
    """
    ids = [self.bos_id] if add_bos else []
    pieces = self._pattern.split(text) if self._pattern is not None else [text]
    for i, piece in enumerate(pieces):
      if i % 2:  # a special's name (odd entries of a capturing split)
        ids.append(self.special_ids[piece])
      elif piece:
        ids.extend(piece.encode("utf-8", "surrogatepass"))
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
    """Decodes ids back to text; invalid UTF-8 (e.g. a cut multi-byte char) becomes U+FFFD.

    Args:
      ids: token ids (ints or a 1-D integer array).
      skip_special: drop special tokens instead of writing their names.

    Raises:
      DataError: for an id outside [0, vocab_size).
    """
    out, buf = [], bytearray()
    for i in ids:
      i = int(i)
      if 0 <= i < 256:
        buf.append(i)
        continue
      if i not in self._id_to_special:
        raise DataError(f"token id {i} is outside the byte tokenizer's vocabulary [0, {self.vocab_size})")
      if buf:
        out.append(buf.decode("utf-8", "surrogatepass" if _valid(buf) else "replace"))
        buf = bytearray()
      if not skip_special:
        out.append(self._id_to_special[i])
    if buf:
      out.append(buf.decode("utf-8", "surrogatepass" if _valid(buf) else "replace"))
    return "".join(out)

  def __repr__(self) -> str:
    return f"ByteTokenizer(vocab_size={self.vocab_size}, specials={list(self.special_ids)})"


def _valid(buf: bytes) -> bool:
  try:
    buf.decode("utf-8", "surrogatepass")
    return True
  except UnicodeDecodeError:
    return False


class HFTokenizer:
  """A Hugging Face `tokenizers` tokenizer (a local `tokenizer.json`) behind the `Tokenizer` protocol.

  Build it with `HFTokenizer.from_file(path)` or `train_bpe(...)`. `encode` never applies the file's
  post-processor (no automatic BOS/EOS); pass `add_bos`/`add_eos` instead.

  Args:
    tok: a `tokenizers.Tokenizer`.
    bos: BOS token string or None.
    eos: EOS token string (required).
    pad: PAD token string; None falls back to the EOS token (the usual choice for decoder LMs).
    source: where it was loaded from (for error messages).
  """

  def __init__(self, tok, *, bos: str | None, eos: str | None, pad: str | None, source: str = "<memory>"):
    self._tok, self.source = tok, source

    def tid(name, role):
      if name is None:
        return None
      i = tok.token_to_id(name)
      if i is None:
        raise DataError(f"{source}: {role} token {name!r} is not in the tokenizer's vocabulary; fix "
                        "tokenizer_config.json or add the token")
      return i
    if eos is None:
      raise DataError(f"{source}: no EOS token found; set 'eos_token' in tokenizer_config.json next to "
                      f"tokenizer.json (or add one of {list(_EOS_NAMES)} as a special token)")
    self.bos_id = tid(bos, "bos")
    self.eos_id = tid(eos, "eos")
    self.pad_id = tid(pad, "pad") if pad is not None else self.eos_id
    self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
    self.special_ids = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    self.bos_token, self.eos_token, self.pad_token = bos, eos, pad if pad is not None else eos

  @property
  def backend(self):
    """The wrapped `tokenizers.Tokenizer`."""
    return self._tok

  @classmethod
  def from_file(cls, path: str) -> "HFTokenizer":
    """Loads a local `tokenizer.json` (a file path, or a directory containing one).

    BOS/EOS/PAD come from `tokenizer_config.json` (keys `bos_token`, `eos_token`, `pad_token`; strings or
    {"content": ...} dicts; it wins) or `special_tokens_map.json` in the same directory; a role missing
    there has no token (PAD then falls back to EOS). Without these files, and for a missing EOS, roles are
    taken from well-known special token names in the vocabulary ("<|eos|>", "</s>", "<|endoftext|>", ...).

    Args:
      path: file or directory; nothing is downloaded.

    Raises:
      MissingDependencyError: the `tokenizers` package is not installed.
      DataError: the file is missing or cannot be parsed, or no EOS token can be determined.
    """
    tokenizers = require("tokenizers", "tokenizers")
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise DataError(f"tokenizer file {file!r} does not exist; pass a local tokenizer.json or a directory "
                      "holding one (e.g. a Hugging Face checkpoint folder), or use 'byte'")
    try:
      tok = tokenizers.Tokenizer.from_file(file)
    except Exception as e:  # the Rust side raises a bare Exception
      msg = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise DataError(f"cannot read tokenizer file {file!r}: {msg}; is it a Hugging Face tokenizer.json?") from None
    roles, roles_found = _read_special_config(os.path.dirname(os.path.abspath(file)))
    present = {t.content for t in tok.get_added_tokens_decoder().values()}

    def pick(role, names):
      if role in roles:
        return roles[role]
      if role != "eos" and roles_found:  # HF semantics: a config without the key means "no such token"
        return None
      return next((n for n in names if n in present), None)
    return cls(tok, bos=pick("bos", _BOS_NAMES), eos=pick("eos", _EOS_NAMES), pad=pick("pad", _PAD_NAMES),
               source=file)

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Encodes text (special-token names in it map to their ids; no post-processor tokens).

    Raises:
      DataError: `add_bos` for a tokenizer without a BOS token.
    """
    ids = list(self._tok.encode(text, add_special_tokens=False).ids)
    if add_bos:
      if self.bos_id is None:
        raise DataError(f"{self.source}: this tokenizer has no BOS token; use add_bos=False")
      ids.insert(0, self.bos_id)
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
    """Decodes ids to text (`skip_special` drops special tokens)."""
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

  def save(self, path: str) -> None:
    """Writes `tokenizer.json` and `tokenizer_config.json` (bos/eos/pad) into directory `path`."""
    os.makedirs(path, exist_ok=True)
    self._tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
      json.dump({"bos_token": self.bos_token, "eos_token": self.eos_token, "pad_token": self.pad_token}, f,
                indent=2)

  def __repr__(self) -> str:
    return f"HFTokenizer({self.source!r}, vocab_size={self.vocab_size})"


def _read_special_config(folder: str) -> tuple[dict[str, str | None], bool]:
  """({"bos"|"eos"|"pad": token string or None}, whether a config file exists) from the HF files in `folder`.

  Roles absent from the files are omitted from the dict.
  """
  out: dict[str, str | None] = {}
  found = False
  for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins
    file = os.path.join(folder, name)
    if not os.path.isfile(file):
      continue
    found = True
    from jaxlab.data.jsonl import load_json  # pylint: disable=g-import-not-at-top
    cfg = load_json(file)
    if not isinstance(cfg, dict):
      raise DataError(f"{file!r} must hold a JSON object")
    for role in ("bos", "eos", "pad"):
      if f"{role}_token" in cfg:
        v = cfg[f"{role}_token"]
        out[role] = v.get("content") if isinstance(v, dict) else v
  return out, found


def train_bpe(texts: Iterable[str], vocab_size: int, path: str | None = None, *,
              specials: Sequence[str] = DEFAULT_SPECIALS, min_frequency: int = 2) -> HFTokenizer:
  """Trains a byte-level BPE tokenizer offline with the `tokenizers` package.

  The 256 byte symbols are always in the vocabulary, so every text round-trips. Specials come first
  (ids 0, 1, ...; by default pad 0, bos 1, eos 2).

  Args:
    texts: training texts (e.g. `pydoc_data.topics.topics.values()` or generated text).
    vocab_size: target vocabulary size including specials and the 256 byte symbols (>= 256 + len(specials)).
    path: optional directory to save `tokenizer.json` + `tokenizer_config.json` into (reload with
      `HFTokenizer.from_file(path)`).
    specials: special tokens; the first three are used as pad, bos and eos.
    min_frequency: minimum pair count for a merge.

  Returns:
    the trained HFTokenizer.
  """
  tk = require("tokenizers", "tokenizers")
  if len(specials) < 3:
    raise DataError(f"train_bpe needs at least pad, bos and eos specials, got {list(specials)}")
  if vocab_size < 256 + len(specials):
    raise DataError(f"vocab_size={vocab_size} is too small: byte-level BPE needs >= 256 + {len(specials)} "
                    "specials")
  tok = tk.Tokenizer(tk.models.BPE())
  tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tk.decoders.ByteLevel()
  trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                   special_tokens=list(specials), show_progress=False,
                                   initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer)
  out = HFTokenizer(tok, pad=specials[0], bos=specials[1], eos=specials[2])
  if path is not None:
    out.save(path)
    out.source = os.path.join(path, "tokenizer.json")
  return out


def load_tokenizer(spec: str, *, extra_specials: Sequence[str] = ()) -> ByteTokenizer | HFTokenizer:
  """A tokenizer from a config string.

  Args:
    spec: "byte" (ByteTokenizer), "byte:<tool>,</tool>" (ByteTokenizer with comma-separated extra specials),
      or a local path to a tokenizer.json or a directory holding one.
    extra_specials: extra specials for the byte tokenizer (added after those in `spec`).

  Raises:
    DataError: the path does not exist or is not a tokenizer file.
  """
  if spec == "byte" or spec.startswith("byte:"):
    names = [s for s in spec[5:].split(",") if s] if spec.startswith("byte:") else []
    return ByteTokenizer(names + list(extra_specials))
  if extra_specials:
    raise DataError("extra_specials only apply to the byte tokenizer; add specials to the tokenizer.json")
  return HFTokenizer.from_file(spec)


def check_fits(tokenizer, vocab_size: int, where: str = "the model") -> None:
  """Refuses a tokenizer whose ids do not all fit a model's embedding table (before any training).

  Out-of-range ids would read past the table (NaN embeddings on most backends) and surface only as a
  non-finite loss at step 1.

  Args:
    tokenizer: a `ByteTokenizer` / `HFTokenizer` (anything with `vocab_size`).
    vocab_size: rows of the model's embedding table (its logits' width).
    where: the model, for the message (e.g. the checkpoint directory).

  Raises:
    ConfigError: naming both sizes and the fix.
  """
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  if tokenizer.vocab_size > vocab_size:
    raise ConfigError(f"the tokenizer ({tokenizer!r}) has {tokenizer.vocab_size} ids but {where} embeds only "
                      f"{vocab_size}; use the tokenizer the model was trained with, or a model with "
                      f"vocab_size >= {tokenizer.vocab_size}")
