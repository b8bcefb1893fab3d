"""Zeroth-order gradient estimators over parameter pytrees, on top of the `zo_perturb` kernel.

One z generator for everything: z for leaf i is `jaxlab.kernels.zo_perturb` at counters
`offset_i + flat index`, offsets from `leaf_offsets` (flatten order), so the perturbation, the restore and
the update of one step regenerate the same z from one uint32 seed and nothing parameter-sized is stored.

* SPSA / MeZO (Malladi et al. 2023): Delta = (L(theta + eps v) - L(theta - eps v)) / (2 eps), v = z (dense) or
  v = m * z (block mask m); for a quadratic L the central difference is exact: Delta = v . grad L.
* Sparse estimate g~ = Delta * w * z with per-block weights w = m / pi (Horvitz-Thompson, CurvZO Def. 3.1:
  unbiased, E[g~] = grad L up to O(eps^2)) or w = m (`ht=False`: E[g~] = pi * grad L, a pi-preconditioned
  direction).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxlab.kernels import zo_perturb
from jaxlab.zo.blocks import BlockLayout

LossFn = Callable[[Any, Any], jax.Array]


def perturb_params(params: Any, seed, scale, layout: BlockLayout | None = None, block_weights: jax.Array | None = None,
                   *, leaf_scales: Sequence[Any] | None = None, shardings: Any = None, impl: str = "auto") -> Any:
  """theta + scale * w * z leaf by leaf (one z over the concatenated leaves).

  Args:
    params: pytree of float arrays.
    seed: uint32 scalar.
    scale: scalar multiplier (used for leaves without an entry in `leaf_scales`).
    layout: block layout of `params` (needed with `block_weights`).
    block_weights: optional (num_blocks,) per-block weights (0 leaves a block untouched).
    leaf_scales: optional per-leaf scales overriding `scale`.
    shardings: NamedShardings of the leaves (a pytree like `params`), so sharded leaves are perturbed shard
      by shard; default: each leaf's own NamedSharding when it is a concrete array. Inside `jax.jit` the
      leaves are tracers without one: pass the shardings recorded outside (the ZO optimizers record them
      when built, `jaxlab.zo.optim.param_shardings`).
    impl: zo_perturb impl ("auto" | "xla" | "pallas" | "interpret").
  """
  leaves, treedef = jax.tree_util.tree_flatten(params)
  offsets = zo_perturb.leaf_offsets(params)
  shs = [None] * len(leaves) if shardings is None else treedef.flatten_up_to(shardings)
  ws = [None] * len(leaves) if block_weights is None else layout.split(block_weights)
  bss = [None] * len(leaves) if block_weights is None else list(layout.leaf_block_sizes)
  scales = [scale] * len(leaves) if leaf_scales is None else list(leaf_scales)
  out = [zo_perturb.perturb(x, seed, s, mask=w, block_size=b, offset=o, impl=impl, sharding=sh)
         for x, s, w, b, o, sh in zip(leaves, scales, ws, bss, offsets, shs)]
  return jax.tree_util.tree_unflatten(treedef, out)


def spsa(loss_fn: LossFn, params: Any, batch: Any, seed, eps: float, layout: BlockLayout | None = None,
         mask: jax.Array | None = None, impl: str = "auto") -> tuple[jax.Array, jax.Array, jax.Array]:
  """Central-difference SPSA along v = (m *) z: returns (Delta, L(theta + eps v), L(theta - eps v)).

  Functional (theta is not modified); the optimizers do the same in place with donated buffers.
  """
  lp = loss_fn(perturb_params(params, seed, eps, layout, mask, impl=impl), batch)
  lm = loss_fn(perturb_params(params, seed, -eps, layout, mask, impl=impl), batch)
  return (lp - lm) / (2.0 * eps), lp, lm


def directional_derivative(grads: Any, seed, layout: BlockLayout | None = None, mask: jax.Array | None = None,
                           impl: str = "auto") -> jax.Array:
  """v . grad with v = (m *) z for the same z the perturbations use (the exact SPSA value on a quadratic)."""
  v = perturb_params(jax.tree.map(jnp.zeros_like, grads), seed, 1.0, layout, mask, impl=impl)
  return sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(v), jax.tree.leaves(grads)))


def sparse_estimate(params_like: Any, seed, delta, layout: BlockLayout, mask: jax.Array, pi: jax.Array | None,
                    ht: bool = True, impl: str = "auto") -> Any:
  """g~ = delta * w * z with w = m / pi (`ht=True`) or w = m; pytree shaped like `params_like`."""
  w = mask / pi if ht else mask
  zeros = jax.tree.map(jnp.zeros_like, params_like)
  return perturb_params(zeros, seed, delta, layout, w, impl=impl)
