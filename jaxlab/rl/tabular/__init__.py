"""Tabular RL: random MDPs, exact planning, robust asynchronous Q-learning under reward corruption."""

from jaxlab.rl.tabular import adversary, estimators, mdp, q_learning
from jaxlab.rl.tabular.adversary import BUDGETS, MODELS, Adversary
from jaxlab.rl.tabular.estimators import ESTIMATORS, RewardHistory
from jaxlab.rl.tabular.mdp import (MDP, greedy, policy_evaluation, q_error, random_mdp, suboptimal_pairs,
                                   suboptimality, value_iteration)
from jaxlab.rl.tabular.q_learning import QLearningSpec, QState, init_state, run, run_batch, step_size

__all__ = ["adversary", "estimators", "mdp", "q_learning", "BUDGETS", "MODELS", "Adversary", "ESTIMATORS",
           "RewardHistory", "MDP", "greedy", "policy_evaluation", "q_error", "random_mdp", "suboptimal_pairs",
           "suboptimality", "value_iteration", "QLearningSpec", "QState", "init_state", "run", "run_batch",
           "step_size"]
