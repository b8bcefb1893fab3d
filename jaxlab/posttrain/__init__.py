"""Post-training of `jaxlab.lm` models: rollouts, verifiable rewards, GRPO, rejection-sampling fine-tuning.

Tunix (`google/tunix`) is the anchor: `GRPOConfig` uses its field names and loss semantics (advantage
estimators, clipped ratio with separate low/high epsilon, k1/k2/k3 KL modes, loss aggregation modes), so a
config carries over to Tunix / MaxText RL.
"""

from jaxlab.posttrain.advantages import ESTIMATORS, group_advantages, multi_reward_advantages
from jaxlab.posttrain.grpo import (GRPOConfig, aggregate, grpo_loss, kl_estimate, make_grpo_loss_fn,
                                   make_logps_fn, per_token_logps)
from jaxlab.posttrain.rewards import (CompositeReward, answer_reward, format_reward, parse_tagged,
                                      tool_call_reward)
from jaxlab.posttrain.rollout import RolloutBatch, decode_completion, multi_turn, sampler_policy, single_turn
from jaxlab.posttrain import arith, rft
