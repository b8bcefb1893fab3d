"""Scores the difficulty of every example of an SFT JSONL file with a local checkpoint and writes the scores back.

    python -m jaxlab.experiments.sft_difficulty.score --data FILE.jsonl --model DIR --out FILE.jsonl \
        [--scores loss,perplexity,length[,pass_rate][,field:NAME]] [--tokenizer DIR|FILE|byte] \
        [--field_prefix difficulty_] [--buckets 3] [--ties order|group] [--k 8] [--temperature 1.0] [--top_p 1.0] \
        [--max_new_tokens 64] [--answer_field answer] [--answer_format tagged|answer_only|raw] [--batch 16] \
        [--chunk 256] [--seq_len N] [--dtype float32] [--seed 0] [--overwrite]

FILE.jsonl holds SFT records as `jaxlab.lm.sft_data.read_jsonl` reads them (`{"prompt", "completion"}` or
`{"messages": [...]}`). DIR is a local Hugging Face checkpoint (config.json + *.safetensors, read with
`jaxlab.lm.from_pretrained`; nothing is downloaded) or the directory of a finished jaxlab run (e.g. of lm_sft:
its newest checkpoint, through its experiment's `load_trained`, with the run's own tokenizer; `--dtype` is the
run's); the tokenizer is DIR's tokenizer.json unless `--tokenizer` names another file / folder or "byte"
(`jaxlab.lm.tokenizer.load_tokenizer`). The output holds every input
record unchanged (same fields, same order) plus one field per score, `<prefix><score>` (e.g. `difficulty_loss`),
and `<prefix>bucket`, the quantile bucket of the first score (0 = easiest .. buckets - 1; `--buckets 0`: none).
Tied scores (common for pass_rate with a small `--k`): `--ties order` (default) ranks them by their position in
the file, so buckets keep equal sizes and a tie can span two buckets; `--ties group` keeps every tie in one
bucket, so bucket sizes may differ (`jaxlab.selection.difficulty.quantile_buckets`).
Scores (`jaxlab.selection.difficulty`):

* loss: mean NLL of the completion tokens given the prompt (the example's SFT loss); perplexity: exp(loss);
* length: completion tokens;
* pass_rate: the fraction of `--k` sampled completions whose answer (`--answer_format`: the `<answer>` block
  of the tagged format, an answer-only `<answer>` block, or the whole completion) equals the record's
  `--answer_field` (`jaxlab.posttrain.rewards.answer_reward`); a higher pass rate is easier;
* field:NAME: the record's own number NAME (e.g. field:level), higher = harder.

A score that cannot be computed (no completion tokens) is written as null and gets a null bucket.

Resume: records are scored `--chunk` at a time; after each chunk its scores are appended to OUT.partial (one JSON
line per record after a header line holding the settings, the data file's SHA-256 and the checkpoint's config
hash) and flushed. Ctrl-C / SIGTERM stops after the chunk in flight is dropped or written whole; rerunning the
same command continues after the last complete chunk (a torn line is dropped), so the result equals an
uninterrupted run's. A partial file holding scores made with other settings or another data file is refused
(one holding none yet is replaced). OUT is
written atomically (temporary file, then rename) once every record is scored, and OUT.partial is removed. An
existing OUT is only replaced with `--overwrite`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import signal
import tempfile
import threading
from typing import Any, Iterator

import numpy as np

from jaxlab import cli, progress
from jaxlab.metrics import file_sha256
from jaxlab.errors import ConfigError, DataError, Interrupted

SCORES = ("loss", "perplexity", "length", "pass_rate")
MODEL_SCORES = ("loss", "perplexity", "pass_rate")
ANSWER_FORMATS = ("tagged", "answer_only", "raw")
DTYPES = ("float32", "bfloat16", "float16")
HEADER_KEY = "jaxlab_sft_difficulty_partial"
VERSION = 1


def parse_args(argv: list[str]) -> argparse.Namespace:
  """The command line (see the module docstring)."""
  p = argparse.ArgumentParser(prog="python -m jaxlab.experiments.sft_difficulty.score",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--data", required=True, help="SFT JSONL: {prompt, completion} or {messages} records")
  p.add_argument("--model", required=True, help="local Hugging Face checkpoint directory (config.json, *.safetensors)")
  p.add_argument("--out", required=True, help="output JSONL: the records plus the score fields")
  p.add_argument("--tokenizer", default=None, help="tokenizer.json file or folder, or 'byte' (default: --model)")
  p.add_argument("--scores", default="loss,perplexity,length",
                 help="comma-separated: loss, perplexity, length, pass_rate, field:NAME (the first one is bucketed)")
  p.add_argument("--field_prefix", default="difficulty_", help="prefix of the written fields")
  p.add_argument("--buckets", type=int, default=3, help="quantile buckets of the first score (0: no bucket field)")
  p.add_argument("--ties", choices=("order", "group"), default="order", help="tied scores: ranked by file order "
                 "(equal bucket sizes; default) or kept in one bucket (sizes may differ)")
  p.add_argument("--k", type=int, default=8, help="pass_rate: samples per prompt")
  p.add_argument("--temperature", type=float, default=1.0, help="pass_rate: sampling temperature (0: greedy)")
  p.add_argument("--top_p", type=float, default=1.0, help="pass_rate: nucleus threshold")
  p.add_argument("--max_new_tokens", type=int, default=64, help="pass_rate: completion length limit")
  p.add_argument("--answer_field", default="answer", help="pass_rate: the record field holding the reference answer")
  p.add_argument("--answer_format", default="tagged", choices=ANSWER_FORMATS,
                 help="pass_rate: where a completion's answer is (tagged: <think>..</think><answer>..</answer>)")
  p.add_argument("--batch", type=int, default=16, help="rows per forward pass / sampler call")
  p.add_argument("--chunk", type=int, default=256, help="records scored between two writes of OUT.partial")
  p.add_argument("--seq_len", type=int, default=None,
                 help="loss: longest row; longer examples lose the start of their prompt (default: max_position)")
  p.add_argument("--dtype", default="float32", choices=DTYPES, help="compute dtype of the model")
  p.add_argument("--seed", type=int, default=0, help="pass_rate sampling seed")
  p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
  args = p.parse_args(argv)
  args.score_names = parse_scores(args.scores)
  for name in ("k", "batch", "chunk", "max_new_tokens"):
    if getattr(args, name) < 1:
      raise ConfigError(f"--{name} must be >= 1, got {getattr(args, name)}")
  if args.buckets < 0:
    raise ConfigError(f"--buckets must be >= 0 (0: no bucket field), got {args.buckets}")
  if args.seq_len is not None and args.seq_len < 1:
    raise ConfigError(f"--seq_len must be >= 1, got {args.seq_len}")
  if not (math.isfinite(args.temperature) and args.temperature >= 0):
    raise ConfigError(f"--temperature must be finite and >= 0, got {args.temperature}")
  if not 0 < args.top_p <= 1:
    raise ConfigError(f"--top_p must be in (0, 1], got {args.top_p}")
  outputs = [out_field(args.field_prefix, s) for s in args.score_names]
  if args.buckets:
    outputs.append(args.field_prefix + "bucket")
  if len(set(outputs)) != len(outputs):
    raise ConfigError(f"--scores {args.scores!r} with --field_prefix {args.field_prefix!r} writes the field(s) "
                      f"{sorted({o for o in outputs if outputs.count(o) > 1})} twice; rename or drop one")
  return args


def parse_scores(text: str) -> list[str]:
  """`"loss,field:level"` -> ["loss", "field:level"] (ConfigError for an unknown, empty or repeated name)."""
  names = [s.strip() for s in text.split(",")]
  if not text.strip() or any(not s for s in names):
    raise ConfigError(f"--scores {text!r} has an empty entry; give e.g. --scores loss,perplexity,length")
  for s in names:
    if s not in SCORES and not (s.startswith("field:") and s[len("field:"):]):
      raise ConfigError(f"--scores: unknown score {s!r}; use {', '.join(SCORES)} or field:NAME")
  if len(set(names)) != len(names):
    raise ConfigError(f"--scores {text!r} names a score twice")
  return names


def out_field(prefix: str, score: str) -> str:
  """The record field a score is written to: prefix + "loss", prefix + NAME for field:NAME."""
  return prefix + (score[len("field:"):] if score.startswith("field:") else score)


def higher_is_harder(score: str) -> bool:
  """Direction of a score: pass_rate is the only one where higher is easier."""
  return score != "pass_rate"


# ------------------------------------------------------------------------------------------------- inputs

def read_records(path: str) -> list[tuple[int, dict[str, Any]]]:
  """[(line number, record dict)] of a JSONL file, each checked to be an SFT record (errors name the line)."""
  from jaxlab.data.jsonl import iter_jsonl  # pylint: disable=g-import-not-at-top
  from jaxlab.lm import sft_data  # pylint: disable=g-import-not-at-top
  out = []
  for no, obj in iter_jsonl(path):
    sft_data.as_example(obj, where=f"{path}:{no}")
    out.append((no, obj))
  if not out:
    raise DataError(f"{path} holds no records; pass a JSONL file of {{\"prompt\": ..., \"completion\": ...}} lines")
  return out


def settings(args: argparse.Namespace) -> dict[str, Any]:
  """What the partial file's scores depend on (compared on resume): the data file's path and SHA-256, the
  tokenizer file's, the checkpoint's config.json hash and weight file sizes, and the arguments of the scores."""
  s: dict[str, Any] = {
      "data": os.path.abspath(args.data), "data_sha256": file_sha256(args.data),
      "scores": list(args.score_names), "chunk": args.chunk,
  }
  run = _is_run(args.model) if any(x in MODEL_SCORES for x in args.score_names) else False
  if any(x in MODEL_SCORES or x == "length" for x in args.score_names):
    spec = args.model if args.tokenizer is None else args.tokenizer
    if run and args.tokenizer is None:
      s["tokenizer"] = "the run's (its config.json)"
    elif spec == "byte" or spec.startswith("byte:"):
      s["tokenizer"] = spec
    else:
      file = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
      s.update(tokenizer=os.path.abspath(file), tokenizer_sha256=file_sha256(file))
  if any(x in MODEL_SCORES for x in args.score_names):
    if run:
      steps = os.listdir(os.path.join(args.model, "checkpoints")) if os.path.isdir(
          os.path.join(args.model, "checkpoints")) else []
      weights = {"checkpoint_step": max((int(d) for d in steps if d.isdigit()), default=None)}
    else:
      files = sorted(n for n in os.listdir(args.model) if n.endswith(".safetensors"))
      weights = {n: os.path.getsize(os.path.join(args.model, n)) for n in files}
    s.update(model=os.path.abspath(args.model), model_config_sha256=file_sha256(os.path.join(args.model,
                                                                                             "config.json")),
             model_weights=weights, dtype=args.dtype, batch=args.batch)
  if "loss" in args.score_names or "perplexity" in args.score_names:
    s["seq_len"] = args.seq_len
  if "pass_rate" in args.score_names:
    s.update(k=args.k, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
             answer_field=args.answer_field, answer_format=args.answer_format, seed=args.seed)
  return s


# ----------------------------------------------------------------------------------------------- partial

@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
  """Holds SIGINT / SIGTERM back while the block runs (delivered right after it), so a chunk is written whole."""
  if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
    yield
    return
  old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _write_whole(f, text: str) -> None:
  f.write(text)
  f.flush()
  os.fsync(f.fileno())


def open_partial(path: str, header: dict[str, Any], lines: list[int], chunk: int):
  """Opens (or starts) the partial file; returns (scored rows so far, file opened for appending).

  Complete lines after the header are kept up to the last whole chunk (or all records when every one is
  scored); a torn last line and the lines of an unfinished chunk are cut off.

  Raises:
    ConfigError: the file holds another run's header (different settings or data).
    DataError: a damaged line before the end, or rows that do not match the data's line numbers.
  """
  if os.path.exists(path):
    with open(path, "rb") as f:
      raw = f.read()
    parts = raw.split(b"\n")
    complete = parts[:-1]                      # the text after the last newline is a torn line (or empty)
    if complete:
      try:
        got = json.loads(complete[0])
      except (json.JSONDecodeError, UnicodeDecodeError):
        got = None
      if not isinstance(got, dict) or HEADER_KEY not in got:
        raise ConfigError(f"{path} is not a partial file of this command; delete it (or choose another --out)")
      if got != header and len(complete) > 1:         # a header alone (nothing scored yet) is just replaced
        theirs, ours = got.get("settings", {}), header["settings"]
        diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        raise ConfigError(f"{path} was written by a run with other settings or data (differs in: "
                          f"{', '.join(diff) or 'version'}); rerun with the original arguments, or delete it to "
                          "start over")
      rows = []
      for i, line in enumerate(complete[1:] if got == header else []):
        try:
          row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
          row = None
        if not isinstance(row, dict) or i >= len(lines) or row.get("line") != lines[i]:
          raise DataError(f"{path}:{i + 2} is damaged or belongs to other data; delete the file to start over")
        rows.append(row)
      if got == header:
        keep = len(rows) if len(rows) == len(lines) else len(rows) - len(rows) % chunk
        size = len(complete[0]) + 1 + sum(len(x) + 1 for x in complete[1:1 + keep])
        with open(path, "r+b") as f:
          f.truncate(size)
        return rows[:keep], open(path, "a", encoding="utf-8")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  f = open(path, "w", encoding="utf-8")
  with _signals_deferred():
    _write_whole(f, json.dumps(header, sort_keys=True) + "\n")
  return [], f


def _jsonable(x) -> float | int | None:
  if isinstance(x, (np.integer, int)):
    return int(x)
  x = float(x)
  return x if math.isfinite(x) else None


# ---------------------------------------------------------------------------------------------- scoring

def score_chunk(args: argparse.Namespace, model, tokenizer, items: list[tuple[int, dict[str, Any]]], key
                ) -> list[dict[str, Any]]:
  """{"line": n, score: value (None when not finite), ...} of each (line, record) of a chunk."""
  from jaxlab.lm import sft_data  # pylint: disable=g-import-not-at-top
  from jaxlab.posttrain import rewards  # pylint: disable=g-import-not-at-top
  from jaxlab.selection import difficulty  # pylint: disable=g-import-not-at-top
  where = [f"{args.data}:{no}" for no, _ in items]
  records = [r for _, r in items]
  examples = [sft_data.as_example(r, where=w) for r, w in zip(records, where)]
  out: dict[str, np.ndarray] = {}
  names = args.score_names
  if "loss" in names or "perplexity" in names:
    ref = difficulty.reference_loss(model, tokenizer, examples, batch=args.batch, seq_len=args.seq_len)
    out.update(loss=ref["loss"], perplexity=ref["perplexity"])
  if "length" in names:
    out["length"] = difficulty.length(examples, tokenizer)
  if "pass_rate" in names:
    parse = {"tagged": rewards.parse_tagged, "answer_only": rewards.parse_answer_only,
             "raw": rewards.parse_raw}[args.answer_format]
    reward = functools.partial(rewards.answer_reward, parse=parse)
    out["pass_rate"] = difficulty.pass_rate(
        model, tokenizer, examples, [str(r[args.answer_field]) for r in records], k=args.k,
        max_new_tokens=args.max_new_tokens, key=key, temperature=args.temperature, top_p=args.top_p,
        batch=args.batch, reward=reward)
  for s in names:
    if s.startswith("field:"):
      out[s] = difficulty.field(records, s[len("field:"):], where=where)
  return [{"line": no, **{s: _jsonable(out[s][i]) for s in names}} for i, (no, _) in enumerate(items)]


def _check_inputs(args, items, tokenizer, max_position: int | None) -> None:
  """Fails fast on records the requested scores cannot use (before any model work)."""
  from jaxlab.lm import sft_data  # pylint: disable=g-import-not-at-top
  from jaxlab.selection import difficulty  # pylint: disable=g-import-not-at-top
  where = [f"{args.data}:{no}" for no, _ in items]
  for s in args.score_names:
    if s.startswith("field:"):
      difficulty.field([r for _, r in items], s[len("field:"):], where=where)
  if "pass_rate" in args.score_names:
    for (no, r), w in zip(items, where):
      if r.get(args.answer_field) is None:
        raise DataError(f"{w}: no {args.answer_field!r} field, which --scores pass_rate compares sampled answers "
                        "with; add it or set --answer_field")
      n = len(sft_data.prompt_ids(r, tokenizer))
      if n + args.max_new_tokens > max_position:
        raise DataError(f"{w}: the prompt has {n} tokens; with --max_new_tokens {args.max_new_tokens} that exceeds "
                        f"the model's max_position={max_position}; lower --max_new_tokens or shorten the prompt")
  if args.buckets > len(items):
    raise ConfigError(f"--buckets {args.buckets} is more than the {len(items)} records; use at most {len(items)}")


def _is_run(path: str) -> bool:
  """Whether `path` is a jaxlab run directory (run.json beside a jaxlab config.json), not a HF checkpoint."""
  from jaxlab.llm import local  # pylint: disable=g-import-not-at-top
  return os.path.isfile(os.path.join(path, "run.json")) and not local.is_hf_checkpoint(path)


def _load_tokenizer(args):
  from jaxlab.lm.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  spec = args.tokenizer if args.tokenizer is not None else args.model
  try:
    return load_tokenizer(spec)
  except DataError as e:
    if args.tokenizer is None:
      raise DataError(f"{e} (the tokenizer defaults to --model's; pass --tokenizer FILE|DIR|byte)") from None
    raise


def finish(args: argparse.Namespace, items: list[tuple[int, dict[str, Any]]], rows: list[dict[str, Any]]) -> None:
  """Writes OUT atomically: each record plus its score fields (and the bucket of the first score)."""
  from jaxlab.selection import difficulty  # pylint: disable=g-import-not-at-top
  first = args.score_names[0]
  bucket = [None] * len(items)
  if args.buckets:
    values = np.asarray([np.nan if r[first] is None else r[first] for r in rows], np.float64)
    ok = np.flatnonzero(np.isfinite(values))
    if ok.size < args.buckets:
      raise DataError(f"only {ok.size} records have a {first} score, too few for --buckets {args.buckets}; rerun "
                      "with fewer buckets (the scores are kept in the partial file)")
    got = difficulty.quantile_buckets(values[ok], args.buckets, higher_is_harder=higher_is_harder(first),
                                      ties=args.ties)
    for i, b in zip(ok, got):
      bucket[i] = int(b)
  folder = os.path.dirname(os.path.abspath(args.out))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(args.out) + ".", suffix=".tmp")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      for (_, rec), row, b in zip(items, rows, bucket):
        new = dict(rec)
        for s in args.score_names:
          new[out_field(args.field_prefix, s)] = row[s]
        if args.buckets:
          new[args.field_prefix + "bucket"] = b
        f.write(json.dumps(new, ensure_ascii=False, allow_nan=False) + "\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, args.out)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def run(args: argparse.Namespace, *, max_chunks: int | None = None) -> int:
  """Scores `args.data` into `args.out` (see the module docstring).

  Args:
    args: from `parse_args`.
    max_chunks: stop (as on Ctrl-C, raising `Interrupted`) after writing this many chunks; for tests.

  Raises:
    ConfigError / DataError / CheckpointError: bad arguments or inputs (one line each).
    Interrupted: Ctrl-C / SIGTERM (or `max_chunks`), after the partial file is left consistent.
  """
  if os.path.exists(args.out) and not args.overwrite:
    raise ConfigError(f"{args.out} exists; pass --overwrite to replace it, or choose another --out")
  items = read_records(args.data)
  need_model = any(s in MODEL_SCORES for s in args.score_names)
  need_tokenizer = need_model or "length" in args.score_names
  model_config = model = run_tokenizer = None
  if need_model and _is_run(args.model):   # a jaxlab run directory: its experiment's load_trained
    from jaxlab.llm import local  # pylint: disable=g-import-not-at-top
    model, run_tokenizer = local.load_run(args.model)
    model_config = model.config
  elif need_model:
    from jaxlab.lm import hf  # pylint: disable=g-import-not-at-top
    model_config = hf.config_from_hf(args.model)                  # CheckpointError without config.json
  tokenizer = (run_tokenizer if run_tokenizer is not None and args.tokenizer is None else
               _load_tokenizer(args) if need_tokenizer else None)
  if model_config is not None:
    from jaxlab.lm.tokenizer import check_fits  # pylint: disable=g-import-not-at-top
    check_fits(tokenizer, model_config.vocab_size, f"the checkpoint {args.model}")
  max_position = None if model_config is None else model_config.max_position
  _check_inputs(args, items, tokenizer, max_position)
  partial = args.out + ".partial"
  header = {HEADER_KEY: VERSION, "settings": settings(args)}
  rows, f = open_partial(partial, header, [no for no, _ in items], args.chunk)
  key = None
  total = len(items)
  done = len(rows)
  bar = progress.bar(total, initial=done, desc="scoring")
  try:
    if done < total and need_model:
      import jax  # pylint: disable=g-import-not-at-top
      if model is None:
        from jaxlab.lm import from_pretrained  # pylint: disable=g-import-not-at-top
        model = from_pretrained(args.model, dtype=args.dtype)
      key = jax.random.key(args.seed)
    written = 0
    while done < total:
      if max_chunks is not None and written >= max_chunks:
        raise Interrupted(f"stopped after {max_chunks} chunk(s)")
      start = done
      chunk_key = None if key is None else jax.random.fold_in(key, start // args.chunk)
      new = score_chunk(args, model, tokenizer, items[start:start + args.chunk], chunk_key)
      text = "".join(json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in new)
      with _signals_deferred():
        _write_whole(f, text)
        rows += new
        done += len(new)
        written += 1
      bar.update(len(new))
    finish(args, items, rows)
  except KeyboardInterrupt as e:
    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    raise Interrupted(f"{done} of {total} records scored", workdir=partial, step=done, checkpoint=done or None,
                      signum=signum) from None
  finally:
    f.close()
    bar.close()
  os.remove(partial)
  fields = [out_field(args.field_prefix, s) for s in args.score_names]
  fields += [args.field_prefix + "bucket"] if args.buckets else []
  print(f"wrote {total} records with {', '.join(fields)} to {args.out}")
  return 0


def main(argv: list[str]) -> int:
  """Entry point (through `jaxlab.cli.main_wrapper`)."""
  return run(parse_args(argv))


if __name__ == "__main__":
  cli.main_wrapper(main)
