"""Evaluation of post-trained policies: greedy and sampled accuracy, pass@k, majority vote, KL to a reference,
completion length and format validity.

* `pass_at_k(n, c, k)`: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
  on Code", arXiv 2107.03374, Sec. 2.1): with n samples of which c are correct,
  pass@k = 1 - C(n - c, k) / C(n, k), computed as 1 - prod_{i = n - c + 1}^{n} (1 - k / i) (no large binomials).
* `majority_vote(answers, correct)`: maj@n, the fraction of prompts whose most frequent valid answer (ties:
  the first to appear) is correct (Wang et al. 2023, self-consistency).
* `greedy_completions(...)`: the greedy KV-cache completions (text) of encoded prompts, in batches.
* `greedy_eval(...)`: greedy KV-cache decoding of every prompt, each score function averaged.
* `sampled_eval(...)`: n samples per prompt at a temperature: sampled accuracy, pass@k for each k, maj@n,
  format rate and mean completion length.
* `kl_to_reference(...)`: Monte Carlo KL(pi || ref) per completion (k1: the mean of sum_t log pi - log ref over
  completions drawn from pi; unbiased for the sequence-level KL).
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jaxlab.posttrain.grpo import per_token_logps
from jaxlab.posttrain.rollout import decode_completion, single_turn

ScoreFn = Callable[[Sequence[str], Sequence[Any]], np.ndarray]


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples with c correct (1 when fewer than k samples are wrong).

  Raises:
    ValueError: unless 0 <= c <= n and 1 <= k <= n.
  """
  n, c, k = int(n), int(c), int(k)
  if not (0 <= c <= n and 1 <= k <= n):
    raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_vote(answers: Sequence[Sequence[str | None]], correct: Callable[[int, str], bool]) -> float:
  """maj@n: per prompt, the most frequent non-None answer (ties: first seen) is scored by
  `correct(prompt_index, answer)`; a prompt without a valid answer counts as wrong. Returns the mean."""
  hits = []
  for p, answers_p in enumerate(answers):
    valid = [a for a in answers_p if a is not None]
    if not valid:
      hits.append(0.0)
      continue
    top = collections.Counter(valid).most_common(1)[0][0]   # Counter keeps first-seen order among ties
    hits.append(float(correct(p, top)))
  return float(np.mean(hits)) if hits else 0.0


def greedy_completions(model, tokenizer, prompt_ids: Sequence[Sequence[int]], *, batch: int, max_new_tokens: int,
                       with_lengths: bool = False):
  """Greedy KV-cache completions of encoded prompts, `batch` prompts per generate call: their text
  (`decode_completion`: stop token dropped); with `with_lengths`, also the generated token counts (stop token
  included)."""
  from jaxlab.lm.sampler import generate  # pylint: disable=g-import-not-at-top
  texts, lengths = [], []
  for s in range(0, len(prompt_ids), batch):
    chunk = list(prompt_ids[s:s + batch])
    out = generate(model, chunk, max_new_tokens, stop_tokens=(tokenizer.eos_id,), pad_id=tokenizer.pad_id)
    toks, lens = jax.device_get((out.tokens, out.lengths))
    texts += [decode_completion(tokenizer, toks[i, :lens[i]]) for i in range(len(chunk))]
    lengths += [int(n) for n in lens]
  return (texts, lengths) if with_lengths else texts


def greedy_eval(model, tokenizer, prompt_ids: Sequence[Sequence[int]], problems: Sequence[Any],
                scores: Mapping[str, ScoreFn], *, batch: int, max_new_tokens: int) -> dict[str, float]:
  """Greedy KV-cache generation of every prompt; the mean of each score (e.g. {"acc": ..., "format": ...})
  plus "length", the mean number of generated tokens (stop token included).

  Args:
    model: a `jaxlab.lm.Transformer`.
    tokenizer: decodes completions (`decode_completion`); its eos_id stops, its pad_id pads.
    prompt_ids: encoded prompts.
    problems: one reference per prompt, passed to the score functions.
    scores: name -> `(completions, problems) -> (N,)`.
    batch: prompts per generate call.
    max_new_tokens: completion length limit.
  """
  if len(prompt_ids) != len(problems):
    raise ValueError(f"greedy_eval: {len(prompt_ids)} prompts but {len(problems)} problems")
  texts, lengths = greedy_completions(model, tokenizer, prompt_ids, batch=batch, max_new_tokens=max_new_tokens,
                                      with_lengths=True)
  out = {name: float(np.mean(np.asarray(fn(texts, problems), np.float32))) for name, fn in scores.items()}
  out["length"] = float(np.mean(lengths))
  return out


def sampled_eval(model, tokenizer, prompt_ids: Sequence[Sequence[int]], problems: Sequence[Any], *,
                 correct: ScoreFn, extract: Callable[[str], str | None], valid: ScoreFn | None = None,
                 samples: int, ks: Sequence[int] = (1,), key: jax.Array, max_new_tokens: int,
                 temperature: float = 1.0) -> dict[str, float]:
  """`samples` completions per prompt at `temperature`: "sampled_acc", "pass@k" for each k, "maj@<samples>",
  "format" (when `valid` is given) and "length".

  Args:
    correct: `(completions, problems) -> (N,)` 1 for a correct completion.
    extract: completion -> its answer (None when invalid), for the majority vote.
    valid: optional `(completions, problems) -> (N,)` format validity.
  """
  roll = single_turn(model, prompt_ids, samples, key=key, max_new_tokens=max_new_tokens, temperature=temperature,
                     stop_tokens=(tokenizer.eos_id,), pad_id=tokenizer.pad_id)
  texts = [decode_completion(tokenizer, g) for g in roll.generated]
  refs = [p for p in problems for _ in range(samples)]
  hit = np.asarray(correct(texts, refs), np.float32).reshape(len(prompt_ids), samples)
  out = {"sampled_acc": float(hit.mean()), "length": float(np.mean([len(g) for g in roll.generated]))}
  for k in ks:
    out[f"pass@{k}"] = float(np.mean([pass_at_k(samples, int(c), k) for c in hit.sum(axis=1)]))
  answers = [[extract(texts[p * samples + j]) for j in range(samples)] for p in range(len(prompt_ids))]

  def is_correct(p, answer):                      # the score of the first completion that gave this answer
    return bool(hit[p, answers[p].index(answer)])
  out[f"maj@{samples}"] = majority_vote(answers, is_correct)
  if valid is not None:
    out["format"] = float(np.mean(valid(texts, refs)))
  return out


def kl_to_reference(model, ref, prompt_ids: Sequence[Sequence[int]], *, samples: int, key: jax.Array,
                    max_new_tokens: int, temperature: float, stop_tokens: Sequence[int] = (), pad_id: int = 0
                    ) -> float:
  """Monte Carlo KL(pi || ref) per completion of the sampling policies (softmax(logits / T)), in nats: the
  mean over `samples` completions of each prompt, drawn from `model` with `key`, of sum_t (log pi - log ref)."""
  roll = single_turn(model, prompt_ids, samples, key=key, max_new_tokens=max_new_tokens, temperature=temperature,
                     stop_tokens=stop_tokens, pad_id=pad_id)
  args = (roll.tokens, roll.positions, roll.segment_ids)
  diff = (per_token_logps(model, *args, temperature=temperature)
          - per_token_logps(ref, *args, temperature=temperature))
  return float(np.mean(np.sum(np.asarray(diff) * roll.loss_mask, axis=1)))
