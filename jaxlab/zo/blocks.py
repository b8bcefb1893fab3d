"""Block structure of a parameter pytree, inclusion probabilities and perturbation budgets for sparse ZO.

Blocks (CurvZO's block-wise approximation, paper Sec. 3.5): every leaf, flattened in row-major order, is cut
into consecutive blocks of `block_size` elements ("row": one block per last-axis row; an int: fixed-size
chunks, the last one possibly shorter; leaves smaller than a block are one block). All per-block state
(curvature signal S, inclusion probability pi, masks) is one float vector over the blocks of all leaves in
flatten order, so the extra state is O(#blocks), not O(#parameters).

Inclusion probabilities (Prop. 3.4): minimise sum_b n_b F_b / pi_b subject to sum_b n_b pi_b = k (the expected
number of perturbed coordinates), pi_b in [pi_min, 1]: pi_b = clip(c sqrt(F_b), pi_min, 1) with c set by
water-filling (bisection on log c; the clipped blocks release budget to the others).

Budgets `budget_fn(S, sizes) -> k` (k in coordinates): `fixed_budget(density)`, and the reconstructed
adaptive rule (the paper's Eq. 20 was not retrieved) `participation_budget(rho, ...)`: with q_i the
per-coordinate share of sqrt(S), d_eff = 1 / sum_i q_i^2 (participation ratio, in [1, d]) and
k = clip(rho d_eff, k_min, k_max): a peaked curvature distribution gives a small, focused budget, a flat one a
larger, exploratory budget.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError

BudgetFn = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class BlockLayout:
  """Static block partition of a pytree's leaves (flatten order).

  Attributes:
    leaf_sizes: elements per leaf.
    leaf_block_sizes: block size used for each leaf (elements).
    leaf_num_blocks: blocks per leaf.
    leaf_starts: index of each leaf's first block in the global block vector.
    num_blocks: total number of blocks.
    sizes: (num_blocks,) float32 numpy array, elements in each block.
  """
  leaf_sizes: tuple[int, ...]
  leaf_block_sizes: tuple[int, ...]
  leaf_num_blocks: tuple[int, ...]
  leaf_starts: tuple[int, ...]
  num_blocks: int
  sizes: np.ndarray = dataclasses.field(compare=False, hash=False)

  @property
  def dim(self) -> int:
    """Total number of parameters."""
    return sum(self.leaf_sizes)

  def split(self, vec: jax.Array) -> list[jax.Array]:
    """Per-leaf slices of a (num_blocks,) vector."""
    return [vec[s:s + n] for s, n in zip(self.leaf_starts, self.leaf_num_blocks)]

  def block_of_leaf(self) -> np.ndarray:
    """(num_blocks,) int32: the leaf each block belongs to."""
    return np.repeat(np.arange(len(self.leaf_sizes), dtype=np.int32), self.leaf_num_blocks)


def make_layout(tree: Any, block_size: int | str) -> BlockLayout:
  """The block partition of `tree` (arrays or ShapeDtypeStructs).

  Args:
    tree: the parameter pytree.
    block_size: "row" (one block per last-axis row; 0-/1-D leaves are one block) or a positive int (chunks of
      that many consecutive elements).

  Raises:
    ConfigError: on a bad block_size.
  """
  if not (block_size == "row" or (isinstance(block_size, (int, np.integer)) and not isinstance(block_size, bool)
                                  and block_size > 0)):
    raise ConfigError(f"block_size must be 'row' or a positive int, got {block_size!r}")
  sizes, bsz, nbs, starts, per_block = [], [], [], [], []
  total = 0
  for leaf in jax.tree_util.tree_leaves(tree):
    shape = tuple(jnp.shape(leaf))
    n = math.prod(shape)
    if n == 0:
      raise ConfigError(f"make_layout: empty leaf of shape {shape}")
    if block_size == "row":
      b = shape[-1] if len(shape) >= 2 else n
    else:
      b = min(int(block_size), n)
    nb = -(-n // b)
    sizes.append(n)
    bsz.append(b)
    nbs.append(nb)
    starts.append(total)
    per_block.append(np.full(nb, b, np.float32))
    per_block[-1][-1] = n - b * (nb - 1)
    total += nb
  return BlockLayout(tuple(sizes), tuple(bsz), tuple(nbs), tuple(starts), total,
                     np.concatenate(per_block) if per_block else np.zeros(0, np.float32))


def optimal_inclusion_probs(signal: jax.Array, sizes: jax.Array, k, pmin: float = 0.0,
                            iters: int = 60) -> jax.Array:
  """Water-filling pi_b = clip(c sqrt(signal_b), pmin, 1) with sum_b sizes_b pi_b = k (Prop. 3.4).

  Args:
    signal: (B,) nonnegative curvature signal F_b (per-coordinate mean of block b).
    sizes: (B,) elements per block.
    k: expected number of perturbed coordinates (clipped to [pmin * d, d]).
    pmin: probability floor.
    iters: bisection steps on log c.

  Returns:
    (B,) float32 inclusion probabilities (uniform k / d when the signal is all zero).
  """
  signal = jnp.asarray(signal, jnp.float32)
  sizes = jnp.asarray(sizes, jnp.float32)
  d = jnp.sum(sizes)
  k = jnp.clip(jnp.asarray(k, jnp.float32), pmin * d, d)
  s = jnp.sqrt(jnp.maximum(signal, 0.0))
  smax = jnp.max(s)
  s = jnp.where(smax > 0, s / jnp.where(smax > 0, smax, 1.0), 1.0)   # scale-free; all-zero -> uniform
  tiny = 1e-30
  lo = jnp.log(jnp.maximum(pmin, 1e-12))                 # c = pmin: every block at (or below) its floor
  hi = jnp.log(1.0 / jnp.maximum(jnp.min(jnp.where(s > 0, s, 1.0)), tiny)) + 1.0

  def mass(logc):
    return jnp.sum(sizes * jnp.clip(jnp.exp(logc) * s, pmin, 1.0))

  def body(_, bounds):
    a, b = bounds
    m = 0.5 * (a + b)
    over = mass(m) > k
    return jnp.where(over, a, m), jnp.where(over, m, b)

  lo, hi = jax.lax.fori_loop(0, iters, body, (lo, hi))
  return jnp.clip(jnp.exp(0.5 * (lo + hi)) * s, pmin, 1.0)


def fixed_budget(density: float) -> BudgetFn:
  """`budget_fn` with a constant expected number of perturbed coordinates, k = density * d."""
  if not 0.0 < density <= 1.0:
    raise ConfigError(f"density must be in (0, 1], got {density!r}")
  return lambda signal, sizes: density * jnp.sum(jnp.asarray(sizes, jnp.float32))


def participation_budget(rho: float, min_density: float = 0.01, max_density: float = 0.5) -> BudgetFn:
  """[reconstructed Eq. 20] k = clip(rho * d_eff, min_density d, max_density d), d_eff = participation ratio.

  With per-coordinate weights q_i proportional to sqrt(S) (every coordinate of block b has sqrt(S_b)),
  d_eff = (sum_b n_b sqrt(S_b))^2 / sum_b n_b S_b, between 1 and d.
  """
  if rho <= 0 or not 0.0 < min_density <= max_density <= 1.0:
    raise ConfigError(f"participation_budget needs rho > 0 and 0 < min_density <= max_density <= 1, got "
                      f"{rho}, {min_density}, {max_density}")

  def fn(signal, sizes):
    sizes = jnp.asarray(sizes, jnp.float32)
    d = jnp.sum(sizes)
    r = jnp.sqrt(jnp.maximum(signal, 0.0))
    num = jnp.sum(sizes * r) ** 2
    den = jnp.sum(sizes * r * r)
    d_eff = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), d)
    return jnp.clip(rho * d_eff, min_density * d, max_density * d)
  return fn


BUDGETS = ("fixed", "participation")


def make_budget(kind: str, density: float = 0.1, rho: float = 0.5, min_density: float = 0.01,
                max_density: float = 0.5) -> BudgetFn:
  """A budget_fn by name (for configs)."""
  if kind == "fixed":
    return fixed_budget(density)
  if kind == "participation":
    return participation_budget(rho, min_density, max_density)
  raise ConfigError(f"budget {kind!r} is not one of {BUDGETS}")


def bernoulli_blocks(key: jax.Array, pi: jax.Array) -> jax.Array:
  """(B,) float32 0/1 mask with P(m_b = 1) = pi_b, independent across blocks."""
  return (jax.random.uniform(key, pi.shape) < pi).astype(jnp.float32)


def block_sumsq_z(layout: BlockLayout, seed, leaf_offsets: Sequence[int]) -> jax.Array:
  """(num_blocks,) sum over each block of z_i^2 for the z that `zo_perturb` draws with `seed`.

  Regenerates z block by block from the counter-based generator inside one fused reduction: nothing parameter-sized is
  stored. Used for CurvZO's block statistic mean_{i in b} (Delta z_i)^2 = Delta^2 sumsq_b / n_b.
  """
  from jaxlab.kernels.zo_perturb import reference as zref  # pylint: disable=g-import-not-at-top
  out = []
  for n, b, nb, off in zip(layout.leaf_sizes, layout.leaf_block_sizes, layout.leaf_num_blocks, leaf_offsets):
    hi, lo = zref.split_offset(off)
    full = n // b
    parts = []
    if full:
      flat = (jax.lax.broadcasted_iota(jnp.uint32, (full, b), 0) * jnp.uint32(b)
              + jax.lax.broadcasted_iota(jnp.uint32, (full, b), 1))
      parts.append(jnp.sum(jnp.square(zref.normal_at(seed, hi, lo, flat)), axis=1))
    if nb > full:
      flat = jnp.uint32(full * b) + jax.lax.iota(jnp.uint32, n - full * b)
      parts.append(jnp.sum(jnp.square(zref.normal_at(seed, hi, lo, flat)))[None])
    out.append(jnp.concatenate(parts) if len(parts) > 1 else parts[0])
  return jnp.concatenate(out)
