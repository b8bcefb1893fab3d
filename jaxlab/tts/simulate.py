"""Simulated answer pools: Dirichlet-mixture answer distributions, GPQA-sized by default.

Question q draws its answer distribution p_q from a two-component Dirichlet mixture: with probability
`easy_prob` a random permutation of Dirichlet(easy_alpha) (one dominant answer), otherwise a random
permutation of Dirichlet(hard_alpha) (competing answers). Its pool holds `pool_size` iid answers from p_q.
The defaults (K = 198 questions, M = 4 options, 64-answer pools, easy Dir(20, 1, 1, 1) with prob. 0.7, hard
Dir(5, 2, 1, 1)) mirror GPQA-Diamond pools of a strong reasoning model (PETS spec, section 4).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def dirichlet_mixture_pools(num_questions: int = 198, num_options: int = 4, pool_size: int = 64, *,
                            easy_prob: float = 0.7, easy_alpha: Sequence[float] = (20.0, 1.0, 1.0, 1.0),
                            hard_alpha: Sequence[float] = (5.0, 2.0, 1.0, 1.0), seed: int = 0) -> dict[str, np.ndarray]:
  """Samples answer pools.

  Args:
    num_questions: K.
    num_options: M (the alphas must have M entries).
    pool_size: N answers per question.
    easy_prob: probability that a question is "easy".
    easy_alpha: (M,) Dirichlet concentration of easy questions (before a random permutation).
    hard_alpha: (M,) Dirichlet concentration of hard questions.
    seed: numpy seed (the pools are a pure function of the arguments).

  Returns:
    {"answers": int32 (K, N) in [0, M), "theta": float64 (K, M) answer distributions,
     "hard": bool (K,), "majority": int32 (K,) argmax theta (the population majority y*)}.

  Raises:
    ValueError: inconsistent sizes or concentrations.
  """
  easy_alpha = np.asarray(easy_alpha, np.float64)
  hard_alpha = np.asarray(hard_alpha, np.float64)
  if num_questions < 1 or pool_size < 1 or num_options < 2:
    raise ValueError(f"need num_questions >= 1, pool_size >= 1, num_options >= 2; got {num_questions}, "
                     f"{pool_size}, {num_options}")
  for name, a in (("easy_alpha", easy_alpha), ("hard_alpha", hard_alpha)):
    if a.shape != (num_options,) or (a <= 0).any():
      raise ValueError(f"{name} must hold {num_options} positive concentrations, got {a.tolist()}")
  if not 0.0 <= easy_prob <= 1.0:
    raise ValueError(f"easy_prob must be in [0, 1], got {easy_prob}")
  rng = np.random.default_rng(seed)
  hard = rng.random(num_questions) >= easy_prob
  theta = np.where(hard[:, None], rng.dirichlet(hard_alpha, num_questions), rng.dirichlet(easy_alpha, num_questions))
  perm = np.argsort(rng.random((num_questions, num_options)), axis=1)
  theta = np.take_along_axis(theta, perm, axis=1)
  cdf = np.cumsum(theta, axis=1)
  u = rng.random((num_questions, pool_size))
  answers = (u[:, :, None] > cdf[:, None, :-1]).sum(-1).astype(np.int32)
  return {"answers": answers, "theta": theta, "hard": hard, "majority": np.argmax(theta, 1).astype(np.int32)}
