"""RLVR arithmetic's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/rlvr_arith/config.py:full [--config.model.hf_path=DIR]

The full variant runs GRPO from a user's checkpoint (config.sft.num_steps = 0: no SFT stage): its config.json
(no weights are read) gives the model, and without one the shape of Llama 3.2 1B stands in. Targets:

* `grpo_update`: the policy update `trainers.grpo` jits (`trainers.grpo_update_step`: `make_grpo_loss_fn`
  accumulated over grpo.micro_batches, the optimizer over train.num_steps x num_iterations updates) on one step's
  rollout batch: train.batch_size prompts x grpo.num_generations completions, rows of data.seq_len tokens (a
  prompt of up to seq_len - max_new_tokens tokens + the completion), with the reference (beta > 0) and old-policy
  (num_iterations > 1) log-probs the loop adds;
* `rollout_sample`: the KV-cache sampler's program (`jaxlab.lm.sampler`: prefill + the decode loop) that draws
  those completions, on the same sharded parameters.
* `grpo_logps`: the reference / old-policy log-prob pass (`grpo.make_logps_fn`, micro-batched as the update
  is) on the update's batch.
"""

from __future__ import annotations

from jaxlab import compile_check

from . import config as config_lib

TOPOLOGY = "v5p-8"


def compile_targets(config):
  """GRPO's update on one step's completions and the sampler that draws them."""
  return compile_check.grpo_lm_targets(config, config_lib.grpo_config(config))
