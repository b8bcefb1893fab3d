"""Samples answer pools from an LLM (`jaxlab.llm` backend) and writes them in the official PETS JSONL format.

    python -m jaxlab.tts.sample_pools --prompts PROMPTS.jsonl --out pools.jsonl MODEL [--chat] [--cache DIR] \
        [--n 64] [--temperature 1.0] [--top_p 1.0] [--top_k 0] [--max_new_tokens 32] [--batch 64] [--seed 0] \
        [--answer_regex REGEX]

MODEL is one of
  --model DIR                        a local jaxlab run directory (e.g. an `lm_sft` run: config.json,
                                     checkpoints/; `--experiment` if run.json does not name it) or a Hugging
                                     Face checkpoint folder, sampled with `jaxlab.llm.LocalBackend`
                                     (`--workdir DIR` is the old name of --model);
  --base_url URL --served_model NAME an OpenAI-compatible server (vLLM, vllm-tpu, `python -m jaxlab.llm.serve`),
                                     key from `--api_key_env` (default OPENAI_API_KEY), `--batch` requests
                                     in flight;
  --replay FILE                      recorded completions (`jaxlab.llm.ReplayBackend`, keyed by prompt id).
`--cache DIR` keeps every answer on disk (`CachingBackend`): a rerun, or a run cut short, asks the model only
for what is missing. Nothing is downloaded.

PROMPTS.jsonl holds one object per line: `prompt` (or `question`), optional `id` and gold `answer` /
`correct_answer`. A prompt is sent as raw text (a local model encodes it as BOS + prompt, the SFT prompt
format; a server gets it at /v1/completions) or, with `--chat`, as one user message rendered with the model's
chat template. All prompts go to the backend in one batch (a local model samples prompt i's n answers as rows
of the sampler, `--batch` rows per call, chunk c with fold_in(key(seed), c)). A completion's answer is the
first capture group of `--answer_regex` (or the whole match; default: the stripped completion). Output lines:
`id`, `question`, `answers` (n strings), `final` (their majority; null when every answer is empty or the top
count is tied, so that the reader's tie rule labels the pool the way votes are scored), `answer` (gold, when
given), and, when the backend returns log-probabilities, `trace_confidence` ([{"mean_confidence": c,
"mean_logprob": l}] per answer, where l is the mean log-probability of the sampled tokens and c = exp(l),
their geometric-mean probability: a stand-in for DeepConf's top-k token confidence). The file is written
atomically (nothing is left behind on failure).
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

import numpy as np

from jaxlab import cli
from jaxlab.errors import ConfigError, DataError, JaxlabError
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


def extract_answer(text: str, pattern: re.Pattern | None) -> str:
  """The answer of a completion: the regex's first group (or match), else the stripped text ('' if no match)."""
  if pattern is None:
    return text.strip()
  m = pattern.search(text)
  if not m:
    return ""
  return (m.group(1) if m.groups() else m.group(0)).strip()


def sample_pools(backend, prompts: list[dict[str, Any]], *, n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, answer_regex: str | None = None,
                 chat: bool = False) -> list[dict[str, Any]]:
  """Samples n completions per prompt from a `jaxlab.llm.Backend`; PETS JSONL records (module docstring)."""
  if n < 1 or max_new_tokens < 1:
    raise ConfigError("--n and --max_new_tokens must be >= 1")
  pattern = re.compile(answer_regex) if answer_regex else None
  asked = [[{"role": "user", "content": p["prompt"]}] if chat else p["prompt"] for p in prompts]
  results = backend.complete_batch(asked, n=n, temperature=temperature, top_p=top_p, top_k=top_k,
                                   max_tokens=max_new_tokens, seed=seed, logprobs=True,
                                   request_ids=[p["id"] for p in prompts])
  with_conf = all(c.logprobs is not None for comps in results for c in comps)
  records = []
  for p, comps in zip(prompts, results):
    answers = [extract_answer(c.text, pattern) for c in comps]
    rec = {"id": p["id"], "question": p["prompt"], "answers": answers,
           "final": pools.majority_answer(answers, unique=True)}
    if with_conf:
      mean = [float(np.mean(np.asarray(c.logprobs, np.float32))) if c.logprobs else 0.0 for c in comps]
      rec["trace_confidence"] = [{"mean_confidence": math.exp(m), "mean_logprob": m} for m in mean]
    if p["answer"] is not None:
      rec["answer"] = p["answer"]
    records.append(rec)
  return records


def backend_from_args(args):
  """The `jaxlab.llm` backend the command-line flags name (see the module docstring)."""
  from jaxlab import llm  # pylint: disable=g-import-not-at-top
  chosen = [name for name, v in (("--model", args.model), ("--base_url", args.base_url), ("--replay", args.replay))
            if v]
  if len(chosen) != 1:
    raise ConfigError("name exactly one model: --model DIR (a run directory or HF checkpoint), --base_url URL "
                      f"--served_model NAME (a server), or --replay FILE; got {chosen or 'none'}")
  if args.model:
    backend = llm.LocalBackend(args.model, batch_size=args.batch, experiment=args.experiment)
  elif args.base_url:
    if not args.served_model:
      raise ConfigError("--base_url needs --served_model NAME (GET <base_url>/v1/models lists the names)")
    backend = llm.OpenAICompatBackend(args.base_url, args.served_model, api_key_env=args.api_key_env,
                                      max_concurrency=args.batch)
  else:
    backend = llm.ReplayBackend(args.replay)
  return llm.CachingBackend(backend, args.cache) if args.cache else backend


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m jaxlab.tts.sample_pools", description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", "--workdir", dest="model", default=None,
                      help="a jaxlab run directory (config.json, checkpoints/) or a Hugging Face checkpoint folder")
  parser.add_argument("--base_url", default=None, help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000")
  parser.add_argument("--served_model", default=None, help="the model name the server serves")
  parser.add_argument("--api_key_env", default="OPENAI_API_KEY", help="environment variable holding the API key")
  parser.add_argument("--replay", default=None, help="a replay JSONL of recorded completions (keyed by prompt id)")
  parser.add_argument("--cache", default=None, help="on-disk cache folder for the answers (resumable)")
  parser.add_argument("--chat", action="store_true", help="send each prompt as a user message (chat template)")
  parser.add_argument("--prompts", required=True, help="prompts JSONL: prompt (or question), optional id, answer")
  parser.add_argument("--out", required=True, help="output PETS JSONL (written atomically)")
  parser.add_argument("--experiment", default=None, help="experiment of a run directory (default: its run.json, "
                      "else lm_sft)")
  parser.add_argument("--n", type=int, default=64, help="answers per prompt")
  parser.add_argument("--temperature", type=float, default=1.0)
  parser.add_argument("--top_p", type=float, default=1.0)
  parser.add_argument("--top_k", type=int, default=0)
  parser.add_argument("--max_new_tokens", type=int, default=32)
  parser.add_argument("--batch", type=int, default=64, help="sequences per sampler call (local) or requests in "
                      "flight (server)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--answer_regex", default=None, help=r"e.g. 'answer is \(?([A-D])' (first group = answer)")
  args = parser.parse_args(argv)
  if args.answer_regex:
    try:
      re.compile(args.answer_regex)
    except re.error as e:
      raise ConfigError(f"--answer_regex {args.answer_regex!r} is not a valid regular expression ({e})") from None
  prompts = read_prompts(args.prompts)
  if args.batch < 1:
    raise ConfigError(f"--batch must be >= 1, got {args.batch}")
  with backend_from_args(args) as backend:
    try:
      records = sample_pools(backend, prompts, n=args.n, max_new_tokens=args.max_new_tokens,
                             temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                             answer_regex=args.answer_regex, chat=args.chat)
    except ValueError as e:  # the sampler's checks (prompt too long for the model, ...)
      if isinstance(e, JaxlabError):
        raise
      raise ConfigError(f"sampling failed: {e}") from None
  count = pools.write_pools(args.out, records)
  print(f"wrote {count} pools of {args.n} answers to {args.out}")
  return 0


if __name__ == "__main__":
  cli.main_wrapper(main)
