"""Samples answer pools from a local jaxlab LM checkpoint and writes them in the official PETS JSONL format.

    python -m jaxlab.tts.sample_pools --workdir CKPT_WORKDIR --prompts PROMPTS.jsonl --out pools.jsonl \
        [--n 64] [--temperature 1.0] [--top_p 1.0] [--top_k 0] [--max_new_tokens 32] [--batch 64] [--seed 0] \
        [--answer_regex REGEX] [--experiment lm_sft]

CKPT_WORKDIR is the run directory of an experiment whose train module exposes
`load_trained(config, workdir) -> (model, tokenizer)` (e.g. `lm_sft`; its config.json and checkpoints/ are
read, nothing is downloaded). PROMPTS.jsonl holds one object per line: `prompt` (or `question`), optional
`id` and gold `answer` / `correct_answer`. Each prompt is encoded as BOS + prompt (the SFT prompt format) and
sampled `n` times with the KV-cache sampler (`jaxlab.lm.generate`, stop at EOS); a completion's answer is the
first capture group of `--answer_regex` (or the whole match; default: the stripped completion). Output lines:
`id`, `question`, `answers` (n strings), `final` (their majority; null when every answer is empty or the top
count is tied, so that the reader's tie rule labels the pool the way votes are scored), `answer` (gold, when
given), `trace_confidence` ([{"mean_confidence": c, "mean_logprob": l}] per
answer, where l is the mean log-probability of the sampled tokens and c = exp(l), their geometric-mean
probability: a stand-in for DeepConf's top-k token confidence, which the sampler does not expose).
The file is written atomically (nothing is left behind on failure).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from typing import Any

from jaxlab import cli
from jaxlab.errors import CheckpointError, ConfigError, DataError
from jaxlab.data.jsonl import iter_jsonl
from jaxlab.tts import pools


def read_prompts(path: str) -> list[dict[str, Any]]:
  """[{"id", "prompt", "answer" (or None)}] from a prompts JSONL file (errors name the line)."""
  out, seen = [], {}
  for no, obj in iter_jsonl(path):
    text = obj.get("prompt", obj.get("question"))
    if not isinstance(text, str) or not text:
      raise DataError(f"{path}:{no}: needs a non-empty string 'prompt' (or 'question')")
    qid = str(obj.get("id") or f"line{no}")
    if qid in seen:
      raise DataError(f"{path}:{no}: duplicate id {qid!r} (first on line {seen[qid]})")
    seen[qid] = no
    gold = obj.get("answer", obj.get("correct_answer"))
    out.append({"id": qid, "prompt": text, "answer": None if gold is None else str(gold)})
  if not out:
    raise DataError(f"{path}: no prompts")
  return out


def _config_from_workdir(exp, workdir: str):
  """The experiment's config with the values of workdir/config.json applied."""
  from jaxlab import configs  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise CheckpointError(f"{workdir} has no config.json; pass the run directory of a finished training run")
  with open(path) as f:
    saved = json.load(f)
  config = exp.get_config(str(saved.get("variant", "tiny")))

  def tupled(v):
    return tuple(tupled(x) for x in v) if isinstance(v, list) else v

  flat = configs.flatten(saved)
  known = configs.flatten(config)
  configs.apply_overrides(config, {k: tupled(v) for k, v in flat.items() if k in known})
  return config


def load_model(workdir: str, experiment: str = "lm_sft"):
  """(model, tokenizer) of a run directory, via the experiment's `load_trained`."""
  from jaxlab import registry  # pylint: disable=g-import-not-at-top
  exp = registry.load(experiment)
  loader = getattr(exp.train_module, "load_trained", None)
  if loader is None:
    raise ConfigError(f"experiment {experiment!r} has no load_trained(config, workdir); use an LM experiment "
                      "such as lm_sft")
  return loader(_config_from_workdir(exp, workdir), workdir)


def extract_answer(text: str, pattern: re.Pattern | None) -> str:
  """The answer of a completion: the regex's first group (or match), else the stripped text ('' if no match)."""
  if pattern is None:
    return text.strip()
  m = pattern.search(text)
  if not m:
    return ""
  return (m.group(1) if m.groups() else m.group(0)).strip()


def sample_pools(model, tokenizer, prompts: list[dict[str, Any]], *, n: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, batch: int = 64, seed: int = 0,
                 answer_regex: str | None = None) -> list[dict[str, Any]]:
  """Samples n completions per prompt and returns PETS JSONL records (see the module docstring)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxlab.lm import generate  # pylint: disable=g-import-not-at-top
  if n < 1 or batch < 1 or max_new_tokens < 1:
    raise ConfigError("--n, --batch and --max_new_tokens must be >= 1")
  pattern = re.compile(answer_regex) if answer_regex else None
  bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
  rows = [(i, bos + tokenizer.encode(p["prompt"])) for i, p in enumerate(prompts) for _ in range(n)]
  answers: list[list[str]] = [[] for _ in prompts]
  confs: list[list[dict]] = [[] for _ in prompts]
  key = jax.random.key(seed)
  for start in range(0, len(rows), batch):
    chunk = rows[start:start + batch]
    out = generate(model, [ids for _, ids in chunk], max_new_tokens, temperature=temperature, top_p=top_p,
                   top_k=top_k, stop_tokens=(tokenizer.eos_id,), pad_id=tokenizer.pad_id,
                   key=jax.random.fold_in(key, start // batch))
    toks, lens, lps = (np.asarray(x) for x in (out.tokens, out.lengths, out.logprobs))
    for (qi, _), row, ln, lp in zip(chunk, toks, lens, lps):
      ids = [int(t) for t in row[:ln] if int(t) != tokenizer.eos_id]
      answers[qi].append(extract_answer(tokenizer.decode(ids, skip_special=True), pattern))
      mean_lp = float(np.mean(lp[:ln])) if ln else 0.0
      confs[qi].append({"mean_confidence": math.exp(mean_lp), "mean_logprob": mean_lp})
  records = []
  for p, a, c in zip(prompts, answers, confs):
    rec = {"id": p["id"], "question": p["prompt"], "answers": a, "final": pools.majority_answer(a, unique=True),
           "trace_confidence": c}
    if p["answer"] is not None:
      rec["answer"] = p["answer"]
    records.append(rec)
  return records


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m jaxlab.tts.sample_pools", description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="run directory of an LM experiment (config.json, checkpoints/)")
  parser.add_argument("--prompts", required=True, help="prompts JSONL: prompt (or question), optional id, answer")
  parser.add_argument("--out", required=True, help="output PETS JSONL (written atomically)")
  parser.add_argument("--experiment", default="lm_sft", help="experiment that trained the checkpoint")
  parser.add_argument("--n", type=int, default=64, help="answers per prompt")
  parser.add_argument("--temperature", type=float, default=1.0)
  parser.add_argument("--top_p", type=float, default=1.0)
  parser.add_argument("--top_k", type=int, default=0)
  parser.add_argument("--max_new_tokens", type=int, default=32)
  parser.add_argument("--batch", type=int, default=64, help="sequences per sampler call")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--answer_regex", default=None, help=r"e.g. 'answer is \(?([A-D])' (first group = answer)")
  args = parser.parse_args(argv)
  if args.answer_regex:
    try:
      re.compile(args.answer_regex)
    except re.error as e:
      raise ConfigError(f"--answer_regex {args.answer_regex!r} is not a valid regular expression ({e})") from None
  prompts = read_prompts(args.prompts)
  model, tok = load_model(args.workdir, args.experiment)
  try:
    records = sample_pools(model, tok, prompts, n=args.n, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, batch=args.batch,
                           seed=args.seed, answer_regex=args.answer_regex)
  except ValueError as e:  # the sampler's checks (prompt too long for the model, ...)
    raise ConfigError(f"sampling failed: {e}") from None
  count = pools.write_pools(args.out, records)
  print(f"wrote {count} pools of {args.n} answers to {args.out}")
  return 0


if __name__ == "__main__":
  cli.main_wrapper(main)
