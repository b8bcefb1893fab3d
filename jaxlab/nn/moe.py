"""Mixture-of-experts classification head over any backbone's features: a router, K experts stacked on one
leading axis (logical name "expert", applied with `nnx.vmap`), and hard (top-1), soft (softmax) or top-k
routing.

The aggregate is a mixture of the experts' predictive distributions, p(y | x) = sum_k g_k(x) softmax(z_k(x)),
as in the calibrated-MoE code (ginawong/calibrated_moe, `models.py`: a d -> 128 -> K ReLU router and linear
experts), so that per-expert temperatures act on each expert's own distribution. Hard routing puts all the
gate on argmax_k of the router logits (the router is then trained by other means, e.g. as a classifier of
regions); top-k renormalises the softmax over the k largest router logits.

Sharding: the experts' parameters carry "expert" as the logical name of their stacked axis. No preset rule
maps it (replicated); a config that wants experts over a mesh axis adds `("expert", "model")` to its
`sharding_rules`.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab.errors import ConfigError
from jaxlab.nn.mlp import MLP

EXPERT_AXIS = "expert"
ROUTINGS = ("hard", "soft", "top_k")


def gates_from_logits(router_logits: jax.Array, routing: str, top_k: int = 1) -> jax.Array:
  """(..., K) routing weights summing to 1: one-hot argmax (hard), softmax (soft), or the softmax over the
  `top_k` largest logits (top_k)."""
  if routing == "hard":
    return jax.nn.one_hot(jnp.argmax(router_logits, axis=-1), router_logits.shape[-1], dtype=router_logits.dtype)
  if routing == "soft":
    return jax.nn.softmax(router_logits, axis=-1)
  if routing == "top_k":
    k = router_logits.shape[-1]
    if not 1 <= top_k <= k:
      raise ConfigError(f"top_k={top_k} must be in [1, {k}] (the number of experts)")
    kth = jax.lax.top_k(router_logits, top_k)[0][..., -1:]
    masked = jnp.where(router_logits >= kth, router_logits, -jnp.inf)
    return jax.nn.softmax(masked, axis=-1)
  raise ConfigError(f"routing={routing!r}: use one of {', '.join(ROUTINGS)}")


def mixture(expert_logits: jax.Array, gates: jax.Array, temperatures: jax.Array | None = None) -> jax.Array:
  """sum_k g_k softmax(z_k / T_k): expert_logits (..., K, C), gates (..., K), temperatures (K,) or None."""
  z = expert_logits if temperatures is None else expert_logits / jnp.asarray(temperatures)[:, None]
  return jnp.einsum("...k,...kc->...c", gates, jax.nn.softmax(z, axis=-1))


class MoEClassifier(nnx.Module):
  """Router + K stacked MLP experts on feature vectors (batch, in_features).

  Args:
    in_features: feature size (the backbone's output).
    num_classes: classes.
    num_experts: K.
    rngs: NNX random streams.
    router_hidden: hidden sizes of the router MLP (default (128,), the official router).
    expert_hidden: hidden sizes of each expert (default (): linear experts, as in the official code).
    routing: "hard", "soft" or "top_k" (the default of `__call__`; each call may override it).
    top_k: k for top_k routing.
  """

  def __init__(self, in_features: int, num_classes: int, num_experts: int, *, rngs: nnx.Rngs,
               router_hidden: Sequence[int] = (128,), expert_hidden: Sequence[int] = (), routing: str = "soft",
               top_k: int = 1):
    if routing not in ROUTINGS:
      raise ConfigError(f"routing={routing!r}: use one of {', '.join(ROUTINGS)}")
    if num_experts < 1:
      raise ConfigError(f"num_experts={num_experts} must be >= 1")
    self.num_experts, self.num_classes, self.routing, self.top_k = num_experts, num_classes, routing, top_k

    @nnx.split_rngs(splits=num_experts)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: EXPERT_AXIS})
    def make(r):
      return MLP(in_features, tuple(expert_hidden), num_classes, rngs=r, activation=jax.nn.relu)

    with nnx.use_eager_sharding(False):      # logical names are mapped to a mesh by jaxlab.state
      self.router = MLP(in_features, tuple(router_hidden), num_experts, rngs=rngs, activation=jax.nn.relu)
      self.experts = make(rngs)

  def router_logits(self, x: jax.Array) -> jax.Array:
    return self.router(x)

  def expert_logits(self, x: jax.Array) -> jax.Array:
    """(batch, K, C): every expert on every input (vmapped over the stacked experts)."""
    @nnx.vmap(in_axes=(0, None), out_axes=1)
    def run(expert, x):
      return expert(x)
    return run(self.experts, x)

  def __call__(self, x: jax.Array, routing: str | None = None, temperatures=None) -> dict[str, jax.Array]:
    """{"probs": (batch, C) mixture, "gates": (batch, K), "router_logits", "expert_logits": (batch, K, C)}."""
    r = self.router_logits(x)
    z = self.expert_logits(x)
    g = gates_from_logits(r, routing or self.routing, self.top_k)
    return {"probs": mixture(z, g, temperatures), "gates": g, "router_logits": r, "expert_logits": z}
