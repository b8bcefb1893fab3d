"""Reinforcement learning: tabular MDPs and (robust) asynchronous Q-learning (`jaxlab.rl.tabular`)."""

from jaxlab.rl import tabular

__all__ = ["tabular"]
