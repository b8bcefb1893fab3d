"""Reinforcement learning: tabular MDPs and (robust) asynchronous Q-learning (`jaxlab.rl.tabular`); multi-task
model-based RL pieces: environment adapters behind one batched interface (`jaxlab.rl.envs`: dm_control, gymnax),
pure-JAX synthetic dynamics families (`synthetic`), a per-task replay buffer (`replay`), a latent world model
(`world_model`) and a DreamerV3-style online multi-task agent (`dreamer`). Grouping tasks and sharing parameters
across models: `jaxlab.multitask`."""

from jaxlab.rl import tabular

__all__ = ["tabular"]
