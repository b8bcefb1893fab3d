"""Rejection-sampling fine-tuning (RFT): sample k completions per prompt, keep the rewarded ones as SFT data.

The kept (prompt, completion) pairs are ordinary `jaxlab.lm.sft_data` records, so the SFT stack trains on them
(`sft_data.build_padded` + `jaxlab.train.fit`).
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from jaxlab.lm import sft_data
from jaxlab.posttrain.rewards import RewardFn
from jaxlab.posttrain.rollout import decode_completion, single_turn


def rejection_sample(model, prompts: Sequence[str], answers: Sequence[str], tokenizer, reward_fn: RewardFn, *,
                     k: int, key: jax.Array, max_new_tokens: int, threshold: float = 1.0, temperature: float = 1.0,
                     max_per_prompt: int | None = None, dedupe: bool = True) -> tuple[list[dict[str, str]], dict]:
  """Keeps sampled completions whose reward reaches `threshold`.

  Args:
    model: a `jaxlab.lm.Transformer` (or a rollout policy callable).
    prompts: prompt texts (encoded by `sft_data.encode_prompt`: BOS when the tokenizer has one).
    answers: reference answers for `reward_fn`.
    tokenizer: a jaxlab tokenizer (encode/decode, bos_id, eos_id, pad_id).
    reward_fn: `(completions, answers) -> (N,)`.
    k: samples per prompt.
    key: PRNG key.
    max_new_tokens: completion length limit.
    threshold: keep completions with reward >= threshold.
    temperature: sampling temperature.
    max_per_prompt: keep at most this many per prompt (None = all kept).
    dedupe: drop repeated completions of the same prompt.

  Returns:
    (records [{"prompt", "completion", "answer"}], stats {"kept", "sampled", "prompts_covered", "reward_mean"}).
  """
  if len(prompts) != len(answers):
    raise ValueError(f"rejection_sample: {len(prompts)} prompts but {len(answers)} answers")
  ids = [sft_data.encode_prompt(p, tokenizer) for p in prompts]
  roll = single_turn(model, ids, k, key=key, max_new_tokens=max_new_tokens, temperature=temperature,
                     stop_tokens=(tokenizer.eos_id,), pad_id=tokenizer.pad_id)
  texts = [decode_completion(tokenizer, g) for g in roll.generated]
  rewards = np.asarray(reward_fn(texts, [a for a in answers for _ in range(k)]), np.float32)
  records, covered = [], 0
  for p in range(len(prompts)):
    kept: list[str] = []
    for i in range(p * k, (p + 1) * k):
      if rewards[i] >= threshold and roll.stopped[i] and not (dedupe and texts[i] in kept):
        kept.append(texts[i])
    kept = kept[:max_per_prompt]         # None keeps all
    covered += bool(kept)
    records += [{"prompt": prompts[p], "completion": t, "answer": answers[p]} for t in kept]
  stats = {"kept": len(records), "sampled": len(texts), "prompts_covered": covered,
           "reward_mean": float(rewards.mean()) if rewards.size else 0.0}
  return records, stats
