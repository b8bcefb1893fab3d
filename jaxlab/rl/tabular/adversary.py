"""Reward-corruption adversaries for the strong-contamination model (an epsilon-fraction of rewards).

An adversary decides, sample by sample, whether the reward the learner observes is replaced by an arbitrary
value. Models (`MODELS`):

* big: a corrupted reward is the constant `magnitude` M (any pair may be hit).
* targeted: only pairs whose action is suboptimal under Q* are hit, and their reward is inflated to M (this
  makes every suboptimal action look attractive).
* bernoulli: every sample is corrupted independently with probability epsilon, value M (no budget; the
  expected reward becomes (1 - epsilon) r + epsilon M, a closed form used in tests).

Budgets (`BUDGETS`) for big / targeted, both front-loaded (the adversary corrupts as early as it may):

* per_pair: in every prefix of each pair's reward stream at most an epsilon-fraction is corrupted: the k-th
  sample of a pair is corrupted iff (corrupted so far at the pair) + 1 <= epsilon * k.
* global: the same rule on the single stream of all rewards (the t-th reward overall is corrupted iff
  (corrupted so far) + 1 <= epsilon * t and the pair is eligible), so one pair's first samples may all be
  corrupted.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

MODELS = ("big", "targeted", "bernoulli")
BUDGETS = ("per_pair", "global")


class Adversary(NamedTuple):
  """One adversary's parameters (a pytree of scalars, batchable).

  Attributes:
    epsilon: () float32 corruption fraction.
    magnitude: () float32 the corrupted reward value M.
    model: () int32 index into MODELS.
    budget: () int32 index into BUDGETS.
  """
  epsilon: jax.Array
  magnitude: jax.Array
  model: jax.Array
  budget: jax.Array

  @staticmethod
  def create(epsilon: float, magnitude: float, model: str = "big", budget: str = "per_pair") -> "Adversary":
    """Builds an adversary from names (raises ValueError on an unknown model or budget)."""
    if model not in MODELS:
      raise ValueError(f"unknown corruption model {model!r}; use one of {MODELS}")
    if budget not in BUDGETS:
      raise ValueError(f"unknown corruption budget {budget!r}; use one of {BUDGETS}")
    return Adversary(jnp.float32(epsilon), jnp.float32(magnitude), jnp.int32(MODELS.index(model)),
                     jnp.int32(BUDGETS.index(budget)))


def within_budget(corrupted: jax.Array, seen: jax.Array, epsilon: jax.Array) -> jax.Array:
  """True when one more corruption keeps the fraction <= epsilon: corrupted + 1 <= epsilon * seen.

  Args:
    corrupted: int32 corruptions so far (before this sample).
    seen: int32 samples so far including this one.
    epsilon: float32 budget fraction.
  """
  seen_f = seen.astype(jnp.float32)
  return (corrupted + 1).astype(jnp.float32) <= epsilon * seen_f + 1e-5 * seen_f


def decide(adv: Adversary, coin_u: jax.Array, eligible: jax.Array, pair_corrupted: jax.Array, pair_seen: jax.Array,
           all_corrupted: jax.Array, all_seen: jax.Array) -> jax.Array:
  """Whether the current sample is corrupted; () bool.

  Args:
    adv: the adversary.
    coin_u: () float32 uniform in [0, 1) for the bernoulli model (corrupt iff coin_u < epsilon).
    eligible: () bool whether the current pair may be targeted (suboptimal action for `targeted`).
    pair_corrupted: () int32 corruptions so far at the current pair.
    pair_seen: () int32 samples of the current pair including this one.
    all_corrupted: () int32 corruptions so far overall.
    all_seen: () int32 samples overall including this one.
  """
  budget_ok = jnp.where(adv.budget == BUDGETS.index("per_pair"),
                        within_budget(pair_corrupted, pair_seen, adv.epsilon),
                        within_budget(all_corrupted, all_seen, adv.epsilon))
  is_targeted = adv.model == MODELS.index("targeted")
  planned = budget_ok & jnp.where(is_targeted, eligible, True)
  coin = coin_u < adv.epsilon
  return jnp.where(adv.model == MODELS.index("bernoulli"), coin, planned) & (adv.epsilon > 0)


def corrupt(adv: Adversary, reward: jax.Array, flag: jax.Array) -> jax.Array:
  """The observed reward: M where flagged, the true reward elsewhere."""
  return jnp.where(flag, adv.magnitude, reward)
