"""Supervised fine-tuning (SFT) of decoder LMs: JSONL data, padded / packed batches with loss masks, loss, eval.

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

Loss and eval (`sft_loss`, `make_loss_fn`, `make_eval_fn`): mean token cross-entropy over masked tokens
(float32, numerically the standard log-softmax CE; masked positions get exactly zero gradient), token
accuracy, and per-example sequence exact match (all completion tokens are the argmax under teacher
forcing, which is exactly "greedy decoding reproduces the completion").

`addition_examples` / `addition_split` generate the synthetic multi-digit addition task ("12+345=" ->
"357") used by tests and the tiny `lm_sft` experiment; `write_jsonl` writes records to a file.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import DataError

log = logging.getLogger("jaxlab")

Batch = Mapping[str, jax.Array]
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
  out = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{lineno}"
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
      out.append(as_example(record, chat_format=chat_format, where=where))
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


# ---------------------------------------------------------------------------------------------- loss/eval

def token_stats(logits_blv: jax.Array, targets_bl: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per-token cross-entropy and argmax correctness.

  Args:
    logits_blv: (batch, length, vocab) logits, any float dtype (computed in float32).
    targets_bl: (batch, length) int target ids.

  Returns:
    (ce_bl float32 = logsumexp(logits) - logits[target], correct_bl bool = argmax(logits) == target).
  """
  logits = logits_blv.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  # One-hot contraction rather than a gather: stays local when the vocab axis is sharded.
  target_logit = jnp.sum(logits * jax.nn.one_hot(targets_bl, logits.shape[-1], dtype=logits.dtype), axis=-1)
  correct = jnp.argmax(logits, axis=-1) == targets_bl
  return lse - target_logit, correct


def sft_loss(logits_blv: jax.Array, targets_bl: jax.Array,
             loss_mask_bl: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean token cross-entropy over the masked-in (completion) tokens.

  Positions with `loss_mask == 0` are selected away with `jnp.where`, so they receive exactly zero gradient
  (even if their logits are extreme). Nonzero mask values act as token weights.

  Args:
    logits_blv: (batch, length, vocab) logits.
    targets_bl: (batch, length) int target ids.
    loss_mask_bl: (batch, length) float mask/weights (1 on completion tokens).

  Returns:
    (loss float32 scalar = sum(mask * ce) / max(sum(mask), 1),
     {"token_accuracy": weighted fraction of argmax hits, "tokens": sum(mask)}).
  """
  ce, correct = token_stats(logits_blv, targets_bl)
  mask = loss_mask_bl.astype(jnp.float32)
  on = mask > 0
  tokens = jnp.sum(jnp.where(on, mask, 0.0))
  denom = jnp.maximum(tokens, 1.0)
  loss = jnp.sum(jnp.where(on, ce * mask, 0.0)) / denom
  acc = jnp.sum(jnp.where(on & correct, mask, 0.0)) / denom
  return loss, {"token_accuracy": acc, "tokens": tokens}


def default_apply(model: Callable, batch: Batch) -> jax.Array:
  """Calls a `jaxlab.lm` transformer on an SFT batch: logits (batch, length, vocab)."""
  return model(batch["inputs"], batch["positions"], segment_ids_bl=batch["segment_ids"])


def make_loss_fn(apply: Callable[[Any, Batch], jax.Array] = default_apply):
  """`loss_fn(model, batch, key) -> (loss, {"token_accuracy", "tokens"})` for `jaxlab.train.fit`.

  Args:
    apply: `(model, batch) -> logits (batch, length, vocab)`; the default calls
      `model(inputs, positions, segment_ids_bl=segment_ids)`.
  """
  def loss_fn(model, batch, key):
    del key
    return sft_loss(apply(model, batch), batch["targets"], batch["loss_mask"])
  return loss_fn


def make_eval_fn(apply: Callable[[Any, Batch], jax.Array] = default_apply):
  """`eval_fn(model, batch) -> {"loss", "token_accuracy", "exact_match"}`, each per row (batch,) float32.

  Per row: mean CE over its completion tokens, fraction of them predicted by argmax, and 1.0 iff ALL are
  (teacher-forced exact match == greedy decoding reproduces the completion, EOS included). Use padded rows
  (one example per row) for per-example numbers; on packed rows the values are per row. Rows without
  completion tokens get 0 for all three.

  Args:
    apply: as in `make_loss_fn`.
  """
  def eval_fn(model, batch):
    ce, correct = token_stats(apply(model, batch), batch["targets"])
    on = batch["loss_mask"] > 0
    n = jnp.sum(on, axis=-1).astype(jnp.float32)
    denom = jnp.maximum(n, 1.0)
    loss = jnp.sum(jnp.where(on, ce, 0.0), axis=-1) / denom
    acc = jnp.sum(on & correct, axis=-1) / denom
    exact = (n > 0) & jnp.all(correct | ~on, axis=-1)
    return {"loss": loss, "token_accuracy": acc, "exact_match": exact.astype(jnp.float32)}
  return eval_fn


# ---------------------------------------------------------------------------------------- synthetic task

def operand(rng: np.random.Generator, digits: int) -> int:
  """A uniform random integer with exactly `digits` digits (0-9 for one digit)."""
  lo = 0 if digits == 1 else 10 ** (digits - 1)
  return int(rng.integers(lo, 10 ** digits))


def addition_examples(n: int, *, min_digits: int = 1, max_digits: int = 3, seed: int = 0,
                      reverse_answer: bool = False, pad_operands: bool = False) -> list[dict[str, str]]:
  """Synthetic multi-digit addition: {"prompt": "12+345=", "completion": "357"}.

  Each operand's digit count is uniform in [min_digits, max_digits], then the operand is uniform among
  numbers of that many digits. Deterministic given the arguments.

  Args:
    n: number of examples.
    min_digits, max_digits: operand digit range (1 <= min_digits <= max_digits).
    seed: numpy seed.
    reverse_answer: write the sum's digits least-significant first (easier for small transformers).
    pad_operands: fixed-width format: operands zero-padded to max_digits and the sum to max_digits + 1
      ("012+345=" -> "0357"), which aligns digit positions (Lee et al. 2023, "Teaching arithmetic to small
      transformers", show reversed, padded formats are learned far faster).

  Returns:
    list of n {"prompt": str, "completion": str} dicts (may repeat for small digit ranges).
  """
  if not 1 <= min_digits <= max_digits:
    raise DataError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    da, db = rng.integers(min_digits, max_digits + 1, size=2)
    a, b = operand(rng, int(da)), operand(rng, int(db))
    answer = str(a + b).zfill(max_digits + 1) if pad_operands else str(a + b)
    prompt = f"{a:0{max_digits}d}+{b:0{max_digits}d}=" if pad_operands else f"{a}+{b}="
    out.append({"prompt": prompt, "completion": answer[::-1] if reverse_answer else answer})
  return out


def addition_split(n_train: int, n_eval: int, *, min_digits: int = 1, max_digits: int = 3, seed: int = 0,
                   reverse_answer: bool = False, pad_operands: bool = False
                   ) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
  """Disjoint train / eval sets of the addition task (no eval prompt appears in train; each set unique).

  Args:
    n_train, n_eval: sizes.
    min_digits, max_digits, seed, reverse_answer, pad_operands: as in `addition_examples`.

  Raises:
    DataError: the digit range has too few distinct problems for the requested sizes.
  """
  need = n_train + n_eval
  seen: dict[str, dict[str, str]] = {}
  chunk, tries = max(need, 64), 0
  while len(seen) < need:
    if tries > 50:
      raise DataError(f"only {len(seen)} distinct addition problems found for digits {min_digits}..{max_digits}; "
                      f"asked for {need}; widen the digit range or ask for fewer")
    for r in addition_examples(chunk, min_digits=min_digits, max_digits=max_digits, seed=seed * 1000003 + tries,
                               reverse_answer=reverse_answer, pad_operands=pad_operands):
      if len(seen) < need:
        seen.setdefault(r["prompt"], r)
    tries += 1
  records = list(seen.values())
  return records[n_eval:], records[:n_eval]
