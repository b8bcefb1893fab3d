"""Difficulty scores of SFT examples, quantile buckets, and budgeted selection by difficulty.

Scorers (numpy outputs, one value per example, in input order). Examples are `jaxlab.lm.sft_data.Example`s or
records `sft_data.as_example` accepts (`{"prompt", "completion"}`, `{"messages": [...]}`); the model is a
`jaxlab.lm.Transformer` (e.g. `jaxlab.lm.from_pretrained(dir)`) and the tokenizer a `jaxlab.lm.tokenizer`
one (`load_tokenizer("byte")`, an `HFTokenizer`):

* `reference_loss`: the mean per-token negative log-likelihood of the completion tokens given the prompt under
  a reference model, exactly the SFT loss of the example on its own (rows of `sft_data.pad_rows`, prompt
  masked; `jaxlab.lm.sft.make_eval_fn`), its perplexity exp(loss) and the number of tokens it is over.
* `pass_rate`: the fraction of k sampled completions (`jaxlab.posttrain.rollout.sampler_policy`, the KV-cache
  sampler with temperature / top-k / top-p, stopping at EOS) whose verifiable reward (a
  `jaxlab.posttrain.rewards` function such as `answer_reward`) reaches a threshold.
* `length`: completion length in tokens (with a tokenizer) or characters.
* `field`: a task-intrinsic difficulty number stored in each record (e.g. a "level").

`HIGHER_IS_HARDER` says which way each score points (a high loss is hard, a high pass rate easy).

Buckets: `quantile_buckets(scores, B)` gives equal-count quantile bins 0 (easiest) .. B - 1 (hardest).
Selection: `select_budget(buckets, n, d)` draws n examples of bucket d; `select_mix(buckets, n, mix)` draws n
examples with the proportions `mix` over buckets (largest-remainder rounding, so the counts add up to n).
Every draw is a function of its seed.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx

from jaxlab.errors import ConfigError, DataError
from jaxlab.lm import sft, sft_data
from jaxlab.posttrain.rewards import answer_reward
from jaxlab.posttrain.rollout import decode_completion, sampler_policy

log = logging.getLogger("jaxlab")

HIGHER_IS_HARDER = {"loss": True, "perplexity": True, "tokens": True, "length": True, "pass_rate": False}
TIES = ("order", "group")

RewardFn = Callable[[Sequence[str], Sequence[Any]], np.ndarray]


# ----------------------------------------------------------------------------------------------- scorers

def _eval_impl(graphdef, state, rows):
  return sft.make_eval_fn()(nnx.merge(graphdef, state), rows)["loss"]


_eval_rows = jax.jit(_eval_impl, static_argnums=0)


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def reference_loss(model, tokenizer, examples: Sequence[sft_data.Example | Mapping[str, Any]], *, batch: int = 16,
                   seq_len: int | None = None, truncation: str = "left", bucket: int = 16, add_bos: bool = True,
                   add_eos: bool = True, mask_markers: Sequence[tuple[str, str]] = (),
                   chat_format: sft_data.ChatFormat | None = None) -> dict[str, np.ndarray]:
  """Per-example SFT loss (mean NLL of the completion tokens given the prompt) under a reference model.

  Each example becomes one padded row (`sft_data.tokenize` + `pad_rows`: targets are the next tokens, the loss
  mask is 1 on completion tokens and the trained EOS) and its loss is the mean token cross-entropy over that
  mask (`jaxlab.lm.sft.make_eval_fn`). Examples are batched by length: each batch holds `batch` rows (the last
  one filled with empty rows) padded to a multiple of `bucket` tokens, so one compiled forward serves every
  batch of the same width.

  Args:
    model: a `jaxlab.lm.Transformer`.
    tokenizer: a `jaxlab.lm.tokenizer` tokenizer (its ids must fit the model's vocabulary).
    examples: Examples or records accepted by `sft_data.as_example`.
    batch: rows per forward pass.
    seq_len: longest row (inputs) in tokens; None: the model's max_position. Longer examples are cut.
    truncation: how long examples are cut: "left" (default: drop the start of the prompt, keeping BOS, so the
      completion is scored in full) or "right" (drop the end of the completion).
    bucket: row widths are rounded up to a multiple of this (fewer compiled shapes).
    add_bos, add_eos, mask_markers, chat_format: see `sft_data.tokenize`.

  Returns:
    {"loss": float64 (N,) mean NLL in nats, "perplexity": float64 (N,) exp(loss), "tokens": int64 (N,) the
    number of completion tokens scored}. An example without completion tokens gets NaN loss and perplexity.

  Raises:
    ConfigError: bad batch / seq_len / truncation / bucket.
    DataError: a malformed record.
  """
  if batch < 1 or bucket < 1:
    raise ConfigError(f"reference_loss: batch and bucket must be >= 1, got batch={batch}, bucket={bucket}")
  if truncation not in ("left", "right"):
    raise ConfigError(f"reference_loss: truncation={truncation!r} must be 'left' or 'right' (every example is "
                      "scored)")
  limit = int(model.config.max_position if seq_len is None else seq_len)
  if limit < 1:
    raise ConfigError(f"reference_loss: seq_len must be >= 1, got {seq_len}")
  keep_first = add_bos and tokenizer.bos_id is not None
  seqs: list[sft_data.Tokenized | None] = []
  truncated = 0
  for i, ex in enumerate(examples):
    seq = sft_data.tokenize(ex if isinstance(ex, sft_data.Example) else sft_data.as_example(
        ex, chat_format=chat_format, where=f"example {i}"), tokenizer, add_bos=add_bos, add_eos=add_eos,
                            mask_markers=mask_markers)
    kept, stats = sft_data.truncate([seq], limit + 1, truncation, keep_first=keep_first)
    truncated += stats["truncated"]
    seqs.append(kept[0] if kept else None)
  if truncated:
    log.warning("reference_loss: %d of %d examples longer than seq_len + 1 = %d tokens were cut (%s)", truncated,
                len(seqs), limit + 1, truncation)
  n = len(seqs)
  loss = np.full((n,), np.nan, np.float64)
  tokens = np.zeros((n,), np.int64)
  for i, s in enumerate(seqs):
    if s is not None:
      tokens[i] = int(s[1][1:].sum())
  todo = [i for i in range(n) if tokens[i] > 0]
  todo.sort(key=lambda i: len(seqs[i][0]))        # stable: similar lengths share a batch (and a width)
  graphdef, state = nnx.split(model)
  for start in range(0, len(todo), batch):
    idx = todo[start:start + batch]
    width = min(_round_up(max(len(seqs[i][0]) - 1 for i in idx), bucket), limit)
    rows = sft_data.pad_rows([seqs[i] for i in idx], width, tokenizer.pad_id)
    extra = batch - len(idx)
    if extra:
      rows = {k: np.pad(v, ((0, extra), (0, 0)), constant_values=tokenizer.pad_id if k in ("inputs", "targets") else 0)
              for k, v in rows.items()}
    got = np.asarray(jax.device_get(_eval_rows(graphdef, state, rows)), np.float64)
    loss[idx] = got[:len(idx)]
  return {"loss": loss, "perplexity": np.exp(loss), "tokens": tokens}


def _prompt_tokens(prompt, tokenizer, *, add_bos: bool, chat_format, where: str) -> list[int]:
  if isinstance(prompt, str):
    return sft_data.encode_prompt(prompt, tokenizer, add_bos=add_bos)
  if isinstance(prompt, (sft_data.Example, Mapping)):
    return sft_data.prompt_ids(sft_data.as_example(prompt, chat_format=chat_format, where=where), tokenizer,
                               add_bos=add_bos)
  try:
    return [int(t) for t in prompt]
  except (TypeError, ValueError):
    raise DataError(f"{where}: a prompt must be a string, an Example / record or a list of token ids, got "
                    f"{type(prompt).__name__}") from None


def pass_rate(model, tokenizer, prompts: Sequence[Any], answers: Sequence[Any], *, k: int, max_new_tokens: int,
              key: jax.Array, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, batch: int = 64,
              reward: RewardFn = answer_reward, threshold: float = 0.5, add_bos: bool = True, bucket: int = 16,
              chat_format: sft_data.ChatFormat | None = None) -> np.ndarray:
  """The fraction of k sampled completions per prompt whose reward is >= threshold.

  The N * k sample rows (prompts sorted by token length, each repeated k times) are generated `batch` at a time
  with the KV-cache sampler (`sampler_policy`: stop at EOS, cache rounded up to a multiple of `bucket`); a
  short last batch is filled with copies of its last row (dropped), so every call has `batch` rows. Batch j
  samples with `fold_in(key, j)`: the result is a function of the key, the batch size and the settings.
  Completions are decoded with `decode_completion` (EOS dropped) and scored by
  `reward(completions, answers)`.

  Args:
    model: a `jaxlab.lm.Transformer`.
    tokenizer: its tokenizer (eos_id stops, pad_id pads).
    prompts: per example a prompt string (encoded as BOS + text), an Example / SFT record (its prompt part,
      `sft_data.prompt_ids`) or a list of token ids.
    answers: per example its reference, passed to `reward` (one copy per sample).
    k: samples per prompt.
    max_new_tokens: completion length limit.
    key: PRNG key.
    temperature, top_p, top_k: sampling settings (`jaxlab.lm.generate`; temperature 0 is greedy).
    batch: sample rows per sampler call.
    reward: `(completions, answers) -> (N,)`, e.g. `jaxlab.posttrain.rewards.answer_reward`.
    threshold: a sample passes when its reward is >= this.
    add_bos: start string / record prompts with BOS.
    bucket: KV-cache length granularity.
    chat_format: rendering of chat records.

  Returns:
    float64 (N,) pass rates in {0, 1/k, ..., 1}.

  Raises:
    ConfigError: k, batch or max_new_tokens < 1, a temperature < 0.
    DataError: prompts and answers differ in number, an empty prompt, or a prompt too long for the model.
  """
  if k < 1 or batch < 1 or max_new_tokens < 1:
    raise ConfigError(f"pass_rate: k, batch and max_new_tokens must be >= 1, got k={k}, batch={batch}, "
                      f"max_new_tokens={max_new_tokens}")
  if not (temperature >= 0 and math.isfinite(temperature)):
    raise ConfigError(f"pass_rate: temperature must be finite and >= 0, got {temperature}")
  if len(prompts) != len(answers):
    raise DataError(f"pass_rate: {len(prompts)} prompts but {len(answers)} answers")
  ids = [_prompt_tokens(p, tokenizer, add_bos=add_bos, chat_format=chat_format, where=f"prompt {i}")
         for i, p in enumerate(prompts)]
  max_position = model.config.max_position
  for i, p in enumerate(ids):
    if not p:
      raise DataError(f"prompt {i} is empty; sampling needs at least one prompt token")
    if len(p) + max_new_tokens > max_position:
      raise DataError(f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} that exceeds the "
                      f"model's max_position={max_position}; shorten it or lower max_new_tokens")
  n = len(ids)
  if n == 0:
    return np.zeros((0,), np.float64)
  policy = sampler_policy(model, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                          stop_tokens=(tokenizer.eos_id,), pad_id=tokenizer.pad_id, bucket=bucket)
  order = sorted(range(n), key=lambda i: len(ids[i]))
  rows = [i for i in order for _ in range(k)]
  hits = np.zeros((n,), np.int64)
  for j, start in enumerate(range(0, len(rows), batch)):
    chunk = rows[start:start + batch]
    contexts = [ids[i] for i in chunk]
    contexts += [contexts[-1]] * (batch - len(chunk))
    generated, _ = policy(contexts, jax.random.fold_in(key, j))
    texts = [decode_completion(tokenizer, g) for g in generated[:len(chunk)]]
    got = np.asarray(reward(texts, [answers[i] for i in chunk]), np.float64).reshape(-1)
    if got.shape[0] != len(chunk):
      raise ValueError(f"pass_rate: the reward returned {got.shape[0]} values for {len(chunk)} completions")
    np.add.at(hits, np.asarray(chunk), (got >= threshold).astype(np.int64))
  return hits / float(k)


def length(examples: Sequence[sft_data.Example | Mapping[str, Any]], tokenizer=None, *,
           mask_markers: Sequence[tuple[str, str]] = (), chat_format: sft_data.ChatFormat | None = None
           ) -> np.ndarray:
  """Completion length of each example: its trained tokens (no BOS / EOS) or, without a tokenizer, the
  characters of its trained spans.

  Args:
    examples: Examples or records accepted by `sft_data.as_example`.
    tokenizer: a `jaxlab.lm.tokenizer` tokenizer, or None to count characters.
    mask_markers, chat_format: see `sft_data.tokenize` (markers only apply to token counts).

  Returns:
    int64 (N,).
  """
  out = []
  for i, ex in enumerate(examples):
    ex = sft_data.as_example(ex, chat_format=chat_format, where=f"example {i}")
    if tokenizer is None:
      out.append(sum(len(text) for text, trained in ex.spans if trained))
    else:
      _, train = sft_data.tokenize(ex, tokenizer, add_bos=False, add_eos=False, mask_markers=mask_markers)
      out.append(int(train.sum()))
  return np.asarray(out, np.int64)


def field(records: Sequence[Mapping[str, Any]], name: str, *, where: Sequence[str] | None = None) -> np.ndarray:
  """A task-intrinsic difficulty number read from each record (e.g. a "level" or "difficulty" field).

  Args:
    records: dicts (e.g. the JSONL records).
    name: the field; a dotted name ("meta.level") reads nested objects when no top-level key has that name.
    where: per record its location for error messages (e.g. "data.jsonl:12"); default "record <i>".

  Returns:
    float64 (N,).

  Raises:
    DataError: a record is not an object, lacks the field, or its value is not a finite number (bools and
      numeric strings are refused).
  """
  out = []
  for i, rec in enumerate(records):
    at = where[i] if where is not None else f"record {i}"
    if not isinstance(rec, Mapping):
      raise DataError(f"{at}: expected a JSON object with a {name!r} field, got {type(rec).__name__}")
    value: Any = rec
    if name in rec:
      value = rec[name]
    else:
      for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
          raise DataError(f"{at}: no {name!r} field (keys: {sorted(rec)}); every record needs the difficulty "
                          "field")
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      raise DataError(f"{at}: field {name!r} must be a finite number, got {value!r}")
    out.append(float(value))
  return np.asarray(out, np.float64)


# ----------------------------------------------------------------------------------------------- buckets

def quantile_buckets(scores: Sequence[float] | np.ndarray, num_buckets: int, *, higher_is_harder: bool = True,
                     ties: str = "order") -> np.ndarray:
  """Equal-count quantile bins of difficulty: 0 = easiest .. num_buckets - 1 = hardest.

  The difficulty is the score (`higher_is_harder`, e.g. loss or length) or its negative (e.g. pass rate). With
  distinct scores the bins are `pandas.qcut(difficulty, num_buckets, labels=False)`: the edges are the
  np.quantile (linear) of the difficulties at j / num_buckets, and bin j holds the values in
  (edge_j, edge_{j+1}] (bin 0 also holds the minimum), so bin sizes differ by at most one. Ties:

  * "order" (default): tied examples are ranked by their position in the input (a stable sort), then binned as
    above by rank; sizes stay equal whatever the ties (e.g. pass rates with a small k).
  * "group": tied examples share a bin (the bins of `qcut` on the values): bin sizes may differ and a bin can
    be empty when many values tie.

  Args:
    scores: (N,) finite numbers.
    num_buckets: number of bins, 1 <= num_buckets <= N.
    higher_is_harder: True when a larger score means a harder example.
    ties: "order" or "group".

  Returns:
    int64 (N,) bin of each example.

  Raises:
    ConfigError: num_buckets < 1 or an unknown `ties`.
    DataError: scores not 1-D, a NaN / infinite score, or fewer scores than bins.
  """
  x = np.asarray(scores, np.float64)
  if x.ndim != 1:
    raise DataError(f"quantile_buckets: scores must be 1-D, got shape {x.shape}")
  if isinstance(num_buckets, bool) or int(num_buckets) != num_buckets or num_buckets < 1:
    raise ConfigError(f"quantile_buckets: num_buckets must be an integer >= 1, got {num_buckets!r}")
  if ties not in TIES:
    raise ConfigError(f"quantile_buckets: ties={ties!r} is not one of {TIES}")
  num_buckets = int(num_buckets)
  bad = np.flatnonzero(~np.isfinite(x))
  if bad.size:
    raise DataError(f"quantile_buckets: score {int(bad[0])} is {x[bad[0]]} ({bad.size} non-finite in all); "
                    "drop those examples (e.g. without completion tokens) first")
  if x.shape[0] < num_buckets:
    raise DataError(f"quantile_buckets: cannot split {x.shape[0]} scores into {num_buckets} buckets; use at most "
                    f"{x.shape[0]} buckets")
  d = x if higher_is_harder else -x
  q = np.arange(1, num_buckets) / num_buckets
  if ties == "group":
    edges = np.quantile(d, q)
    return np.searchsorted(edges, d, side="left").astype(np.int64)
  rank = np.empty(d.shape[0], np.int64)
  rank[np.argsort(d, kind="stable")] = np.arange(d.shape[0])
  edges = np.quantile(np.arange(d.shape[0], dtype=np.float64), q)
  return np.searchsorted(edges, rank, side="left").astype(np.int64)


# --------------------------------------------------------------------------------------------- selection

def _as_buckets(buckets) -> np.ndarray:
  b = np.asarray(buckets)
  if b.ndim != 1 or (b.size and not np.issubdtype(b.dtype, np.integer)):
    raise DataError(f"buckets must be a 1-D integer array (from quantile_buckets), got {b.dtype} shape {b.shape}")
  return b.astype(np.int64)


def _count(n) -> int:
  if isinstance(n, bool) or int(n) != n or n < 0:
    raise ConfigError(f"the number of examples to select must be an integer >= 0, got {n!r}")
  return int(n)


def select_budget(buckets: Sequence[int] | np.ndarray, n: int, bucket: int, *, seed: int = 0) -> np.ndarray:
  """n examples of one difficulty bucket, drawn without replacement.

  The draw is the first n of a seeded permutation of the bucket's members, so for one seed a larger n extends
  a smaller selection.

  Args:
    buckets: (N,) bucket of each example (`quantile_buckets`).
    n: how many to select.
    bucket: which bucket (0 = easiest).
    seed: randomness of the draw.

  Returns:
    int64 (n,) example indices, ascending.

  Raises:
    ConfigError: n is not a non-negative integer.
    DataError: the bucket holds fewer than n examples.
  """
  b = _as_buckets(buckets)
  n = _count(n)
  members = np.flatnonzero(b == int(bucket))
  if members.size < n:
    present = sorted(int(v) for v in np.unique(b))
    raise DataError(f"bucket {bucket} holds {members.size} examples, fewer than the {n} requested; ask for at most "
                    f"{members.size}, use fewer buckets, or a mix over several buckets (buckets present: {present})")
  pick = np.random.default_rng(seed).permutation(members)[:n]
  return np.sort(pick).astype(np.int64)


def mix_counts(n: int, mix: Mapping[int, float] | Sequence[float]) -> dict[int, int]:
  """{bucket: count} with counts proportional to `mix` that add up to exactly n (largest remainder).

  Each bucket first gets floor(n * p); the examples left over go one each to the buckets with the largest
  fractional parts n * p - floor(n * p) (ties: the lower bucket first).

  Args:
    n: total.
    mix: {bucket: proportion} or a sequence of proportions for buckets 0, 1, ...; proportions are >= 0 and
      sum to 1 (within 1e-6).

  Raises:
    ConfigError: a negative or non-finite proportion, proportions not summing to 1, a bad bucket id.
  """
  n = _count(n)
  items = list(mix.items()) if isinstance(mix, Mapping) else list(enumerate(mix))
  if not items:
    raise ConfigError("the difficulty mix is empty; give proportions per bucket, e.g. {0: 0.5, 2: 0.5}")
  props: dict[int, float] = {}
  for d, p in items:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
      raise ConfigError(f"difficulty mix: bucket {d!r} must be an integer >= 0")
    try:
      p = float(p)
    except (TypeError, ValueError):
      raise ConfigError(f"difficulty mix: the proportion of bucket {d} must be a number, got {p!r}") from None
    if not (math.isfinite(p) and p >= 0):
      raise ConfigError(f"difficulty mix: the proportion of bucket {d} must be finite and >= 0, got {p}")
    props[int(d)] = p
  total = sum(props.values())
  if abs(total - 1.0) > 1e-6:
    raise ConfigError(f"difficulty mix {props} sums to {total:.6g}, not 1; give proportions that sum to 1")
  raw = {d: n * p for d, p in props.items()}
  counts = {d: int(math.floor(v)) for d, v in raw.items()}
  left = n - sum(counts.values())
  for d in sorted(raw, key=lambda d: (-(raw[d] - counts[d]), d))[:max(left, 0)]:
    counts[d] += 1
  return dict(sorted(counts.items()))


def select_mix(buckets: Sequence[int] | np.ndarray, n: int, mix: Mapping[int, float] | Sequence[float], *,
               seed: int = 0) -> np.ndarray:
  """n examples drawn with a difficulty mix: `mix_counts(n, mix)[d]` from each bucket d (`select_budget`).

  Args:
    buckets: (N,) bucket of each example.
    n: total to select.
    mix: {bucket: proportion} or proportions of buckets 0, 1, ... (>= 0, summing to 1).
    seed: randomness of the draws (each bucket draws with this seed from its own members).

  Returns:
    int64 (n,) example indices, ascending.

  Raises:
    ConfigError: a bad mix or n.
    DataError: a bucket holds fewer examples than its share (the message names it and its size).
  """
  b = _as_buckets(buckets)
  counts = mix_counts(n, mix)
  for d, c in counts.items():
    held = int(np.sum(b == d))
    if held < c:
      raise DataError(f"the mix needs {c} of the {n} examples from bucket {d}, which holds {held}; lower n or "
                      f"give bucket {d} a smaller share")
  parts = [select_budget(b, c, d, seed=seed) for d, c in counts.items() if c]
  return np.sort(np.concatenate(parts)) if parts else np.zeros((0,), np.int64)
