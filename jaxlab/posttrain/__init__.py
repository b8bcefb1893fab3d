"""Post-training of `jaxlab.lm` models: rollouts, verifiable rewards, GRPO, rejection-sampling fine-tuning.

The trainers (`jaxlab.posttrain.trainers`: `sft`, `rejection_finetune`, `grpo`, with `RolloutSpec` for single-
or multi-turn sampling) run the cold-start SFT -> RFT -> GRPO pipeline on the shared resumable loops;
`jaxlab.posttrain.evaluate` scores policies (greedy / sampled accuracy, pass@k, maj@n, KL to a reference).

Tunix (`google/tunix`) is the anchor: `GRPOConfig` uses its field names and loss semantics (advantage
estimators, clipped ratio with separate low/high epsilon, k1/k2/k3 KL modes, loss aggregation modes), so a
config carries over to Tunix / MaxText RL.
"""

from jaxlab.posttrain.advantages import ESTIMATORS, group_advantages, multi_reward_advantages
from jaxlab.posttrain.grpo import (GRPOConfig, aggregate, grpo_loss, kl_estimate, make_grpo_loss_fn,
                                   make_logps_fn, per_token_logps)
from jaxlab.posttrain.rewards import (CompositeReward, answer_reward, dimension_rewards, format_reward,
                                      parse_answer_only, parse_labels, parse_raw, parse_tagged, tool_call_reward,
                                      weighted_format_reward)
from jaxlab.posttrain.rollout import RolloutBatch, decode_completion, multi_turn, sampler_policy, single_turn
from jaxlab.posttrain.trainers import RolloutSpec, grpo, rejection_finetune, sft, sft_config
from jaxlab.posttrain import arith, evaluate, rft
