"""Pallas kernel of the ZO perturbation (GPU: Triton lowering; CPU: Pallas interpreter).

The leaf is seen as a 2-D array (R, C) (see `ops.view_2d`: R = 1 for an unsharded leaf; a shard of a sharded
leaf keeps the rows that are contiguous in the global leaf) plus a (R,) uint32 vector `rowflat` holding the
within-leaf global flat index of each row's first element. A 1-D grid walks (BR, BC) tiles; each program

  1. builds the flat index of its tile, rowflat[r] + c, and the 64-bit counters offset + flat,
  2. turns them into two uint32 words per element (Philox-4x32-10) and into z by Box-Muller (no random tensor is
     read from memory: the only HBM traffic is reading and writing x),
  3. with block weights: gathers w[flat // block_size] from the (small, cache-resident) weight vector and, if
     the whole tile has w == 0, returns without touching x at all (a sparse mask costs only its blocks),
  4. writes x + scale * w * z into the output, which aliases x (`input_output_aliases`): with a donated input
     the update is in place; tiles that are skipped keep their values.

Triton needs power-of-two blocks: BR and BC are powers of two, tiles past the edges are masked by Pallas, the
weight vector is padded to a power of two.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

from jaxlab.kernels.zo_perturb import reference as ref

U32 = jnp.uint32


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tiling of the kernel.

  Attributes:
    tile: elements per program (a power of two; BC = min(tile, next_pow2(C)), BR = tile // BC rows).
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton pipelining stages (GPU only).
  """
  tile: int = 2048
  num_warps: int = 4
  num_stages: int = 1

  def __post_init__(self):
    if self.tile <= 0 or self.tile & (self.tile - 1):
      raise ValueError(f"zo_perturb: BlockSizes.tile must be a power of two, got {self.tile}")


def _pow2(x: int) -> int:
  return 1 << max(int(x) - 1, 0).bit_length()


def tiles(r: int, c: int, tile: int) -> tuple[int, int, int, int]:
  """(BR, BC, tiles along rows, tiles along columns) of an (r, c) view."""
  bc = min(_pow2(c), tile)
  br = min(_pow2(r), max(1, tile // bc))
  return br, bc, -(-r // br), -(-c // bc)


def _kernel(ctr_ref, scale_ref, rowflat_ref, *refs, bc, n_col_tiles, block_size, n_weights, cdt, may_carry):
  if block_size is None:
    x_ref, o_ref = refs
    w_ref = None
  else:
    w_ref, x_ref, o_ref = refs
  seed, off_hi, off_lo = ctr_ref[0], ctr_ref[1], ctr_ref[2]
  scale = scale_ref[0]
  col0 = (pl.program_id(0) % n_col_tiles * bc).astype(U32)
  flat = rowflat_ref[...][:, None] + (jax.lax.broadcasted_iota(U32, (1, bc), 1) + col0)   # (BR, BC)

  def z_of():
    return ref.normal_at(seed, off_hi, off_lo, flat, may_carry).astype(cdt)

  if w_ref is None:
    o_ref[...] = ref.apply_step(x_ref[...].astype(cdt), scale * z_of()).astype(o_ref.dtype)
    return
  bid = jnp.minimum((flat // U32(block_size)).astype(jnp.int32), n_weights - 1)
  w = w_ref[bid].astype(cdt)

  @pl.when(jnp.max(jnp.abs(w)) > 0)
  def _():
    o_ref[...] = ref.apply_step(x_ref[...].astype(cdt), (scale * w) * z_of()).astype(o_ref.dtype)


def perturb_2d(x2, rowflat, ctr, scale, weights=None, *, block_size: int | None = None,
               block_sizes: BlockSizes = BlockSizes(), interpret: bool = False, may_carry: bool = True):
  """Pallas version of `reference.perturb_at` on a 2-D view.

  Args:
    x2: (R, C) float array; the output aliases it (in place when donated).
    rowflat: (R,) uint32 within-leaf flat index of each row's first element.
    ctr: (4,) uint32 (seed, offset hi, offset lo, unused).
    scale: (1,) float32 (float64 for float64 x).
    weights: optional (n,) per-block weights, n a power of two (pad with zeros).
    block_size: elements per weight block (with `weights`).
    block_sizes: tiling.
    interpret: run under the Pallas interpreter.
    may_carry: False when offset lo + flat provably never wraps (skips the carry logic).

  Returns:
    (R, C) array, x2's dtype.
  """
  r, c = x2.shape
  br, bc, nr, nc = tiles(r, c, block_sizes.tile)
  cdt = ref.compute_dtype(x2.dtype)
  full = lambda n: pl.BlockSpec((n,), lambda i: (0,))  # noqa: E731
  in_specs = [full(4), full(1), pl.BlockSpec((br,), lambda i: (i // nc,))]
  args = [ctr, scale, rowflat]
  if weights is not None:
    in_specs.append(full(weights.shape[0]))
    args.append(weights)
  in_specs.append(pl.BlockSpec((br, bc), lambda i: (i // nc, i % nc)))
  args.append(x2)
  kern = functools.partial(_kernel, bc=bc, n_col_tiles=nc, block_size=block_size if weights is not None else None,
                           n_weights=0 if weights is None else weights.shape[0], cdt=cdt,
                           may_carry=may_carry)
  return pl.pallas_call(
      kern, grid=(nr * nc,), in_specs=in_specs,
      out_specs=pl.BlockSpec((br, bc), lambda i: (i // nc, i % nc)),
      out_shape=jax.ShapeDtypeStruct(x2.shape, x2.dtype),
      input_output_aliases={len(args) - 1: 0},
      interpret=interpret,
      compiler_params=pltr.CompilerParams(num_warps=block_sizes.num_warps, num_stages=block_sizes.num_stages),
      name="zo_perturb",
  )(*args)
