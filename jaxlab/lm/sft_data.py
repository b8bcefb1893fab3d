"""SFT data: JSONL records, chat rendering, span tokenisation with loss masks, truncation, padded / packed rows.

Data flow (everything on the host in numpy, ready for `jaxlab.data.ArraySource` and `jaxlab.train.fit`):

  JSONL --read_jsonl--> [Example] --tokenize--> [(ids, train)] --truncate--> --pad_rows | pack_rows-->
  {"inputs", "targets", "loss_mask", "positions", "segment_ids"}

`build_padded` / `build_packed` (or `load_sft_data` from a file) do all steps. An `Example` is a sequence
of text spans, each either TRAINED (completion text: its tokens are targets of the loss) or MASKED (prompt,
chat turns of other roles, tool calls' observations). A tokenized example is
`[BOS] span_1 ... span_k [EOS]`; EOS is trained when the last span is. Rows hold `inputs = ids[:-1]`,
`targets = ids[1:]` and `loss_mask = train[1:]`, so `loss_mask[b, t] == 1` exactly when `targets[b, t]` is
a completion token (or the final EOS).

Accepted JSONL records (one JSON object per line; blank lines are skipped; errors name the line):

* `{"prompt": str, "completion": str}`;
* `{"prompt": str, "completion": [{"text": str, "train": bool}, ...]}`: explicit spans, e.g. a tool call
  (trained) followed by its observation (`"train": false`);
* `{"messages": [{"role": ..., "content": ...}, ...]}` (chat): rendered with a `ChatFormat`
  (default `"<role>: <content>\\n"`); the contents of assistant turns (and their turn suffix) are trained,
  everything else is masked.

Text between configurable `mask_markers` pairs inside trained spans (e.g. `("<obs>", "</obs>")`, markers
included) is masked too: the environment, not the model, writes observations.

Padded rows (`build_padded`) hold one example each: `segment_ids` 1 on real tokens, 0 on padding, positions
`0..n-1`. Packed rows (`build_packed`) hold several examples (best-fit packing, order-stable) with
`segment_ids` 1, 2, ... per example, positions restarting at 0 in each segment, and 0 on trailing padding;
the model must then attend only within a segment (`segment_ids_bl`). Padding has `inputs = targets =
pad_id`, `positions = 0` and `loss_mask = 0`. Arrays are int32 except `loss_mask` (float32).

Prompts for sampling: `prompt_ids` (the masked spans before the first trained one) and `encode_prompt`
(plain text). The loss on these rows is `jaxlab.lm.sft`; a synthetic task is `jaxlab.lm.tasks`.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from jaxlab.errors import DataError

log = logging.getLogger("jaxlab")

Tokenized = tuple[np.ndarray, np.ndarray]  # (ids int32 (n,), train bool (n,))
KEYS = ("inputs", "targets", "loss_mask", "positions", "segment_ids")
TRUNCATION = ("right", "left", "drop", "error")


# ----------------------------------------------------------------------------------------------- examples

@dataclasses.dataclass(frozen=True)
class Example:
  """One SFT example: text spans, each trained (completion) or masked (prompt, observations).

  Attributes:
    spans: ((text, trained), ...) in order.
  """
  spans: tuple[tuple[str, bool], ...]

  @classmethod
  def from_pair(cls, prompt: str, completion: str) -> "Example":
    """A prompt (masked) followed by a completion (trained)."""
    return cls(((prompt, False), (completion, True)))

  @property
  def prompt(self) -> str:
    """The text before the first trained span (what a sampler is given)."""
    out = []
    for text, trained in self.spans:
      if trained:
        break
      out.append(text)
    return "".join(out)

  @property
  def completion(self) -> str:
    """The text from the first trained span on (what a sampler should produce)."""
    return "".join(t for t, _ in self.spans)[len(self.prompt):]


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """How `{"messages": [...]}` records become text spans.

  A message renders as `role_prefix.format(role=role)` (masked) + `content` + `turn_suffix`; content and
  suffix are trained for roles in `train_roles` and masked otherwise.

  Attributes:
    role_prefix: format string with `{role}`.
    turn_suffix: text after each message's content (e.g. "\\n" or an end-of-turn special token).
    train_roles: roles whose content is trained.
  """
  role_prefix: str = "{role}: "
  turn_suffix: str = "\n"
  train_roles: tuple[str, ...] = ("assistant",)

  def render(self, messages: Sequence[Mapping[str, Any]], where: str = "messages") -> Example:
    """Builds an Example from chat messages (raises DataError naming `where` on bad input)."""
    if not isinstance(messages, (list, tuple)) or not messages:
      raise DataError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    spans = []
    for i, msg in enumerate(messages):
      if not isinstance(msg, Mapping) or not isinstance(msg.get("role"), str) or not isinstance(
          msg.get("content"), str):
        raise DataError(f"{where}: messages[{i}] must be an object with string 'role' and 'content'")
      trained = msg["role"] in self.train_roles
      spans.append((self.role_prefix.format(role=msg["role"]), False))
      spans.append((msg["content"] + self.turn_suffix, trained))
    return Example(tuple((t, tr) for t, tr in spans if t))


def as_example(record: Example | Mapping[str, Any], *, chat_format: ChatFormat | None = None,
               where: str = "record") -> Example:
  """Converts a record (see the module docstring) to an Example.

  Args:
    record: an Example, `{"prompt", "completion"}` (completion a string or a list of `{"text", "train"}`
      spans) or `{"messages": [...]}`.
    chat_format: rendering of chat records (default `ChatFormat()`).
    where: location for error messages, e.g. "data.jsonl:12".

  Raises:
    DataError: the record has neither form or wrongly typed fields.
  """
  if isinstance(record, Example):
    return record
  if not isinstance(record, Mapping):
    raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
  if "messages" in record:
    return (chat_format or ChatFormat()).render(record["messages"], where)
  if "prompt" not in record or "completion" not in record:
    raise DataError(f"{where}: a record needs 'prompt' and 'completion' (or 'messages'), got keys "
                    f"{sorted(record)}")
  prompt, completion = record["prompt"], record["completion"]
  if not isinstance(prompt, str):
    raise DataError(f"{where}: 'prompt' must be a string, got {type(prompt).__name__}")
  if isinstance(completion, str):
    return Example.from_pair(prompt, completion)
  if isinstance(completion, list):
    spans = [(prompt, False)]
    for i, s in enumerate(completion):
      if not (isinstance(s, Mapping) and isinstance(s.get("text"), str) and isinstance(s.get("train", True), bool)):
        raise DataError(f"{where}: completion[{i}] must be {{'text': str, 'train': bool}}")
      spans.append((s["text"], s.get("train", True)))
    return Example(tuple((t, tr) for t, tr in spans if t))
  raise DataError(f"{where}: 'completion' must be a string or a list of spans, got {type(completion).__name__}")


def read_jsonl(path: str, *, chat_format: ChatFormat | None = None) -> list[Example]:
  """Reads SFT examples from a JSONL file.

  Args:
    path: local JSONL file, one record per line (blank lines skipped).
    chat_format: rendering of `{"messages": ...}` records.

  Returns:
    the examples in file order.

  Raises:
    DataError: missing file, invalid JSON or a malformed record (message: "path:line: what is wrong"),
      or a file without records.
  """
  if not os.path.isfile(path):
    raise DataError(f"SFT data file {path!r} does not exist; pass a local JSONL of "
                    "{\"prompt\": ..., \"completion\": ...} lines")
  from jaxlab.data.jsonl import iter_json_lines  # pylint: disable=g-import-not-at-top
  out = [as_example(record, chat_format=chat_format, where=f"{path}:{lineno}")
         for lineno, record in iter_json_lines(path)]
  if not out:
    raise DataError(f"SFT data file {path!r} holds no records")
  return out


def write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> None:
  """Writes records (e.g. `{"prompt", "completion"}` dicts) to `path`, one JSON object per line."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------------------------- tokenize

def _split_markers(text: str, markers: Sequence[tuple[str, str]]) -> list[tuple[str, bool]]:
  """Splits text into (piece, masked) with every `start ... end` region (markers included) masked.

  An unclosed start marker masks to the end of the text.
  """
  out, i = [], 0
  while i < len(text):
    hits = [(j, s, e) for j, s, e in ((text.find(s, i), s, e) for s, e in markers if s) if j >= 0]
    if not hits:
      out.append((text[i:], False))
      break
    j, s, e = min(hits, key=lambda h: (h[0], -len(h[1])))
    if j > i:
      out.append((text[i:j], False))
    k = text.find(e, j + len(s)) if e else -1
    stop = len(text) if k < 0 else k + len(e)
    out.append((text[j:stop], True))
    i = stop
  return out


def tokenize(example: Example | Mapping[str, Any], tokenizer, *, add_bos: bool = True, add_eos: bool = True,
             mask_markers: Sequence[tuple[str, str]] = (), chat_format: ChatFormat | None = None) -> Tokenized:
  """Tokenizes one example span by span.

  Args:
    example: an Example or a record accepted by `as_example`.
    tokenizer: a `jaxlab.lm.tokenizer.Tokenizer`.
    add_bos: start with `tokenizer.bos_id` (skipped when the tokenizer has none).
    add_eos: end with `tokenizer.eos_id`, trained iff the last span is trained (and does not end inside a
      masked marker region).
    mask_markers: (start, end) string pairs; regions between them inside trained spans are masked.
    chat_format: rendering of chat records.

  Returns:
    (ids int32 (n,), train bool (n,)): `train[i]` is True iff token i is a completion token.
  """
  ex = as_example(example, chat_format=chat_format)
  ids: list[int] = []
  train: list[bool] = []
  if add_bos and tokenizer.bos_id is not None:
    ids.append(tokenizer.bos_id)
    train.append(False)
  eos_trained = False
  for text, trained in ex.spans:
    pieces = _split_markers(text, mask_markers) if trained and mask_markers else [(text, False)]
    eos_trained = trained
    for piece, masked in pieces:
      t = tokenizer.encode(piece)
      ids.extend(t)
      train.extend([trained and not masked] * len(t))
      eos_trained = trained and not masked  # no EOS target right after a masked observation
  if add_eos:
    ids.append(tokenizer.eos_id)
    train.append(eos_trained)
  return np.asarray(ids, np.int32), np.asarray(train, bool)


def encode_prompt(text: str, tokenizer, *, add_bos: bool = True) -> list[int]:
  """Token ids of a plain-text prompt: BOS (when the tokenizer has one and `add_bos`) + the encoded text."""
  return ([tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []) + list(tokenizer.encode(text))


def prompt_ids(example: Example | Mapping[str, Any], tokenizer, *, add_bos: bool = True,
               chat_format: ChatFormat | None = None) -> list[int]:
  """Token ids of the prompt part (BOS + spans before the first trained span), e.g. for sampling eval."""
  ex = as_example(example, chat_format=chat_format)
  ids = [tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []
  for text, trained in ex.spans:
    if trained:
      break
    ids.extend(tokenizer.encode(text))
  return ids


def truncate(seqs: Sequence[Tokenized], max_tokens: int, policy: str = "right", *,
             keep_first: bool = True) -> tuple[list[Tokenized], dict[str, int]]:
  """Fits tokenized examples into `max_tokens` tokens (`seq_len + 1`: inputs and targets share all but one).

  Args:
    seqs: [(ids (n,), train (n,))].
    max_tokens: the longest allowed sequence.
    policy: "right" (cut the end: long completions lose their tail and EOS), "left" (cut the start of the
      prompt, keeping the first token when `keep_first`, i.e. BOS), "drop" (skip long examples) or "error".
    keep_first: with "left", keep token 0 (BOS).

  Returns:
    (kept sequences, {"truncated": n, "dropped": n}); sequences shorter than 2 tokens (no target) are
    dropped too.

  Raises:
    DataError: unknown policy, or a long example under "error".
  """
  if policy not in TRUNCATION:
    raise DataError(f"truncation={policy!r} is unknown; use one of {TRUNCATION}")
  if max_tokens < 2:
    raise DataError(f"seq_len must be >= 1, got {max_tokens - 1}")
  out, truncated, dropped = [], 0, 0
  for i, (ids, train) in enumerate(seqs):
    n = len(ids)
    if n > max_tokens:
      if policy == "error":
        raise DataError(f"example {i} has {n} tokens, more than seq_len + 1 = {max_tokens}; raise seq_len or "
                        "choose truncation='right'|'left'|'drop'")
      if policy == "drop":
        dropped += 1
        continue
      truncated += 1
      if policy == "right":
        ids, train = ids[:max_tokens], train[:max_tokens]
      else:
        head = 1 if keep_first else 0
        tail = max_tokens - head
        ids = np.concatenate([ids[:head], ids[n - tail:]])
        train = np.concatenate([train[:head], train[n - tail:]])
    if len(ids) < 2:
      dropped += 1
      continue
    out.append((np.asarray(ids, np.int32), np.asarray(train, bool)))
  return out, {"truncated": truncated, "dropped": dropped}


# ------------------------------------------------------------------------------------------ padded/packed

def _empty(rows: int, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
  return {"inputs": np.full((rows, seq_len), pad_id, np.int32),
          "targets": np.full((rows, seq_len), pad_id, np.int32),
          "loss_mask": np.zeros((rows, seq_len), np.float32),
          "positions": np.zeros((rows, seq_len), np.int32),
          "segment_ids": np.zeros((rows, seq_len), np.int32)}


def _place(out: dict[str, np.ndarray], row: int, start: int, seq: Tokenized, segment: int) -> None:
  ids, train = seq
  m = len(ids) - 1
  sl = slice(start, start + m)
  out["inputs"][row, sl] = ids[:-1]
  out["targets"][row, sl] = ids[1:]
  out["loss_mask"][row, sl] = train[1:]
  out["positions"][row, sl] = np.arange(m)
  out["segment_ids"][row, sl] = segment


def _check_fits(seqs: Sequence[Tokenized], seq_len: int) -> None:
  for i, (ids, _) in enumerate(seqs):
    if not 2 <= len(ids) <= seq_len + 1:
      raise DataError(f"sequence {i} has {len(ids)} tokens; rows of seq_len={seq_len} take 2..{seq_len + 1} "
                      "(use truncate() first)")


def pad_rows(seqs: Sequence[Tokenized], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
  """One example per row, right-padded.

  Args:
    seqs: [(ids (n,), train (n,))] with 2 <= n <= seq_len + 1.
    seq_len: row length L.
    pad_id: id written into padded inputs/targets.

  Returns:
    {"inputs", "targets", "positions", "segment_ids": int32 (N, L), "loss_mask": float32 (N, L)}.
  """
  _check_fits(seqs, seq_len)
  out = _empty(len(seqs), seq_len, pad_id)
  for r, seq in enumerate(seqs):
    _place(out, r, 0, seq, 1)
  return out


def pack_assignment(lengths: Sequence[int], capacity: int) -> list[list[int]]:
  """Best-fit packing: for each item in order, the fullest row that still fits it (else a new row).

  Args:
    lengths: item sizes, each <= capacity.
    capacity: row size.

  Returns:
    rows as lists of item indices (items keep their relative order within a row).
  """
  rows: list[list[int]] = []
  free: list[tuple[int, int]] = []  # sorted (remaining capacity, row index)
  for i, n in enumerate(lengths):
    j = bisect.bisect_left(free, (n, -1))
    if j < len(free):
      rem, r = free.pop(j)
    else:
      rem, r = capacity, len(rows)
      rows.append([])
    rows[r].append(i)
    if rem - n > 0:
      bisect.insort(free, (rem - n, r))
  return rows


def pack_rows(seqs: Sequence[Tokenized], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
  """Several examples per row (best-fit packing), each a segment with positions restarting at 0.

  Each example of n tokens takes n - 1 slots (its own inputs/targets shift, so no target crosses a segment
  boundary).

  Args:
    seqs: [(ids (n,), train (n,))] with 2 <= n <= seq_len + 1.
    seq_len: row length L.
    pad_id: id written into padded inputs/targets.

  Returns:
    {"inputs", "targets", "positions", "segment_ids": int32 (R, L), "loss_mask": float32 (R, L)};
    `segment_ids` are 1, 2, ... in each row and 0 on trailing padding.
  """
  _check_fits(seqs, seq_len)
  rows = pack_assignment([len(ids) - 1 for ids, _ in seqs], seq_len)
  out = _empty(len(rows), seq_len, pad_id)
  for r, members in enumerate(rows):
    start = 0
    for seg, i in enumerate(members, 1):
      _place(out, r, start, seqs[i], seg)
      start += len(seqs[i][0]) - 1
  return out


def _build(examples, tokenizer, seq_len, packed, *, truncation, add_bos, add_eos, mask_markers, chat_format,
           return_stats):
  if isinstance(examples, (str, os.PathLike)):
    examples = read_jsonl(os.fspath(examples), chat_format=chat_format)
  seqs = [tokenize(ex, tokenizer, add_bos=add_bos, add_eos=add_eos, mask_markers=mask_markers,
                   chat_format=chat_format) for ex in examples]
  if not seqs:
    raise DataError("no SFT examples to build rows from")
  keep_first = add_bos and tokenizer.bos_id is not None
  kept, stats = truncate(seqs, seq_len + 1, truncation, keep_first=keep_first)
  if not kept:
    raise DataError(f"all {len(seqs)} SFT examples were dropped (seq_len={seq_len}, truncation={truncation!r})")
  arrays = (pack_rows if packed else pad_rows)(kept, seq_len, tokenizer.pad_id)
  real = int((arrays["segment_ids"] > 0).sum())
  stats.update(examples=len(seqs), rows=len(arrays["inputs"]), tokens=real,
               loss_tokens=int(arrays["loss_mask"].sum()), fill=real / arrays["inputs"].size)
  if stats["truncated"] or stats["dropped"]:
    log.warning("SFT data: %d of %d examples longer than seq_len + 1 = %d tokens were truncated (%s) and %d "
                "dropped", stats["truncated"], len(seqs), seq_len + 1, truncation, stats["dropped"])
  return (arrays, stats) if return_stats else arrays


def build_padded(examples: Sequence[Example | Mapping[str, Any]] | str, tokenizer, seq_len: int, *,
                 truncation: str = "right", add_bos: bool = True, add_eos: bool = True,
                 mask_markers: Sequence[tuple[str, str]] = (), chat_format: ChatFormat | None = None,
                 return_stats: bool = False):
  """Tokenized, truncated, right-padded SFT rows (one example per row).

  Args:
    examples: Examples / records, or a JSONL path.
    tokenizer: a `jaxlab.lm.tokenizer.Tokenizer`.
    seq_len: row length L (an example may have up to L + 1 tokens).
    truncation: "right" | "left" | "drop" | "error" (see `truncate`); truncations are logged as a warning.
    add_bos, add_eos, mask_markers, chat_format: see `tokenize`.
    return_stats: also return {"examples", "truncated", "dropped", "rows", "tokens", "loss_tokens", "fill"}.

  Returns:
    {"inputs", "targets", "positions", "segment_ids": int32 (N, L), "loss_mask": float32 (N, L)}
    (and the stats dict when `return_stats`).
  """
  return _build(examples, tokenizer, seq_len, False, truncation=truncation, add_bos=add_bos, add_eos=add_eos,
                mask_markers=mask_markers, chat_format=chat_format, return_stats=return_stats)


def build_packed(examples: Sequence[Example | Mapping[str, Any]] | str, tokenizer, seq_len: int, *,
                 truncation: str = "right", add_bos: bool = True, add_eos: bool = True,
                 mask_markers: Sequence[tuple[str, str]] = (), chat_format: ChatFormat | None = None,
                 return_stats: bool = False):
  """Tokenized, truncated SFT examples packed several per row (see `pack_rows`).

  Arguments and return value as in `build_padded`; rows R <= number of examples.
  """
  return _build(examples, tokenizer, seq_len, True, truncation=truncation, add_bos=add_bos, add_eos=add_eos,
                mask_markers=mask_markers, chat_format=chat_format, return_stats=return_stats)


def load_sft_data(path: str, tokenizer, seq_len: int, *, packed: bool = False, **kwargs):
  """`read_jsonl(path)` then `build_packed` or `build_padded` (kwargs are theirs)."""
  build = build_packed if packed else build_padded
  return build(path, tokenizer, seq_len, **kwargs)
