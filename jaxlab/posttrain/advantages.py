"""Group-relative advantages (Tunix `compute_advantages` semantics).

Rewards are laid out group by group: rows g*G .. g*G + G - 1 are the G completions of prompt g. Per group,
with mean m and sample standard deviation s (ddof = 1):

* `grpo`:   A_i = (r_i - m) / (s + eps)                     (DeepSeekMath GRPO; Tunix default, eps = 1e-6)
* `rloo`:   A_i = r_i - (sum_j r_j - r_i) / (G - 1)          (leave-one-out baseline; = G/(G-1) (r_i - m))
* `drgrpo`: A_i = r_i - m                                    (Dr. GRPO: mean only, no std division)

A group whose rewards are all equal gets A = 0 under every estimator. With several reward components,
`multi_reward_advantages` either normalises their weighted sum (the usual GRPO) or each component separately
and sums the weighted advantages (`per_reward_normalize`, GDPO-style decoupled normalisation), so a rare but
important reward is not drowned by a dense one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

ESTIMATORS = ("grpo", "rloo", "drgrpo")


def _groups(rewards, num_generations: int) -> np.ndarray:
  r = np.asarray(rewards, np.float64)
  if r.ndim != 1:
    raise ValueError(f"rewards must be 1-D (num_prompts * num_generations,), got shape {r.shape}")
  if num_generations < 2:
    raise ValueError(f"num_generations must be >= 2 for group-relative advantages, got {num_generations}")
  if r.shape[0] % num_generations:
    raise ValueError(f"{r.shape[0]} rewards do not split into groups of num_generations={num_generations}")
  if not np.all(np.isfinite(r)):
    raise ValueError("rewards contain NaN or inf; check the reward functions")
  return r.reshape(-1, num_generations)


def group_advantages(rewards: Sequence[float] | np.ndarray, num_generations: int, estimator: str = "grpo",
                     eps: float = 1e-6) -> np.ndarray:
  """Advantages of grouped rewards.

  Args:
    rewards: (num_prompts * num_generations,) rewards, grouped consecutively.
    num_generations: G, completions per prompt (>= 2).
    estimator: "grpo", "rloo" or "drgrpo" (see the module docstring).
    eps: added to the group standard deviation (grpo).

  Returns:
    (num_prompts * num_generations,) float32 advantages.
  """
  r = _groups(rewards, num_generations)
  mean = r.mean(axis=1, keepdims=True)
  if estimator == "grpo":
    adv = (r - mean) / (r.std(axis=1, ddof=1, keepdims=True) + eps)
  elif estimator == "rloo":
    adv = r - (r.sum(axis=1, keepdims=True) - r) / (num_generations - 1)
  elif estimator == "drgrpo":
    adv = r - mean
  else:
    raise ValueError(f"advantage_estimator={estimator!r}: use one of {ESTIMATORS}")
  return adv.reshape(-1).astype(np.float32)


def multi_reward_advantages(components: np.ndarray, weights: Sequence[float], num_generations: int,
                            estimator: str = "grpo", per_reward_normalize: bool = False,
                            eps: float = 1e-6) -> np.ndarray:
  """Advantages from several reward components.

  Args:
    components: (N, R) per-completion reward components.
    weights: R weights.
    num_generations: G.
    estimator: as in `group_advantages`.
    per_reward_normalize: False: advantages of the weighted sum of components. True: the weighted sum of each
      component's own group advantages.
    eps: as in `group_advantages`.

  Returns:
    (N,) float32 advantages.
  """
  c = np.asarray(components, np.float64)
  w = np.asarray(weights, np.float64).reshape(-1)
  if c.ndim != 2 or c.shape[1] != w.shape[0]:
    raise ValueError(f"components must be (N, {w.shape[0]}) for {w.shape[0]} weights, got shape {c.shape}")
  if not per_reward_normalize:
    return group_advantages(c @ w, num_generations, estimator, eps)
  out = sum(wj * group_advantages(c[:, j], num_generations, estimator, eps).astype(np.float64)
            for j, wj in enumerate(w))
  return np.asarray(out, np.float32)
