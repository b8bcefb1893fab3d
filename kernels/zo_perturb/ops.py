"""Public ops: `perturb(x, seed, scale, *, mask=None, offset=0, impl="auto")`, `perturb_tree`, `normal`.

impl:
  "xla"        the pure-JAX reference (`reference.perturb_at`; XLA fuses the generator into one elementwise loop);
  "pallas"     the Pallas kernel compiled with Triton (GPU);
  "interpret"  the same kernel under the Pallas interpreter (any backend, e.g. CPU);
  "auto"       "pallas" on GPU, "xla" elsewhere (on TPU too: the kernel uses Triton-only gathers).

Sharded leaves: when x is sharded over a multi-device mesh the op runs inside `jax.shard_map`; each shard
computes the global flat index of its own elements (shard starts from `axis_index`), so it generates exactly
its slice of the global z: the result is bit-identical to the unsharded call with the same impl. The
sharding is x's own when x is a concrete array; inside `jax.jit` x is a tracer without one, so the caller
passes the NamedSharding it recorded outside (`sharding=`; the ZO optimizers of `jaxlab.zo` record their
parameters' shardings when they are built).

The 2-D view of a (local) leaf: with j the last sharded dimension (0 when none), rows are the dims before j
and columns the dims from j on, (R, C) = (prod(shape[:j]), prod(shape[j:])). Columns of one row are then
consecutive in the global leaf, so each row needs one base index (`rowflat`) and the kernel adds the column.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab.kernels.zo_perturb import reference as ref
from jaxlab.kernels.zo_perturb.kernel import BlockSizes

IMPLS = ("auto", "xla", "pallas", "interpret")
U32 = jnp.uint32
_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64)


def resolve_impl(impl: str) -> str:
  """Maps "auto" to the backend's default; validates the name and the platform."""
  if impl not in IMPLS:
    raise ValueError(f"zo_perturb: impl={impl!r} is not one of {IMPLS}")
  platform = jax.default_backend()
  if impl == "auto":
    return "pallas" if platform in ("gpu", "cuda", "rocm") else "xla"
  if impl == "pallas" and platform not in ("gpu", "cuda", "rocm"):
    raise ValueError(f"zo_perturb: impl='pallas' needs a GPU (this backend is {platform!r}); use impl='xla', or "
                     "'interpret' to run the kernel under the Pallas interpreter")
  return impl


def num_blocks(size: int, block_size: int) -> int:
  """Number of `block_size` blocks covering `size` elements (the last one may be partial)."""
  return -(-size // block_size)


def _check(x, mask, block_size):
  if jnp.dtype(x.dtype) not in [jnp.dtype(d) for d in _FLOATS]:
    raise ValueError(f"zo_perturb: x must be float32/bfloat16/float16/float64, got {x.dtype}")
  if x.size >= ref.MAX_LEAF:
    raise ValueError(f"zo_perturb: a leaf must have < 2^32 elements, got shape {x.shape}")
  if mask is None:
    return None
  if jnp.ndim(mask) != 1:
    raise ValueError(f"zo_perturb: mask must be a (num_blocks,) vector of per-block weights, got shape "
                     f"{jnp.shape(mask)}")
  nb = jnp.shape(mask)[0]
  if block_size is None:
    if nb == 0 or x.size % nb:
      raise ValueError(f"zo_perturb: cannot infer block_size: {nb} mask blocks do not split {x.size} elements "
                       "evenly; pass block_size=")
    block_size = x.size // nb
  if not isinstance(block_size, int) or block_size <= 0:
    raise ValueError(f"zo_perturb: block_size must be a positive int, got {block_size!r}")
  if nb != num_blocks(x.size, block_size):
    raise ValueError(f"zo_perturb: mask has {nb} blocks but a leaf of {x.size} elements in blocks of {block_size} "
                     f"has {num_blocks(x.size, block_size)}")
  return block_size


def view_2d(local_shape: Sequence[int], global_shape: Sequence[int], starts: Sequence[Any]):
  """(R, C) and the (R,) uint32 within-leaf flat index of each row's first element.

  Args:
    local_shape: shape of this shard (== global_shape when unsharded).
    global_shape: shape of the whole leaf.
    starts: per dimension, the global index of this shard's first element (ints or traced int32 scalars).
  """
  local_shape, global_shape = tuple(local_shape), tuple(global_shape)
  nd = len(global_shape)
  sharded = [d for d in range(nd) if local_shape[d] != global_shape[d]]
  j = sharded[-1] if sharded else 0
  strides = [math.prod(global_shape[d + 1:]) for d in range(nd)]
  r = math.prod(local_shape[:j])
  c = math.prod(local_shape[j:]) if nd else 1
  base = jnp.zeros((), U32)
  if nd:
    base = base + jnp.asarray(starts[j]).astype(U32) * U32(strides[j])
  rowflat = jnp.broadcast_to(base, (r,))
  for d in range(j):
    idx = jax.lax.broadcasted_iota(U32, local_shape[:j], d).reshape(r)
    rowflat = rowflat + (idx + jnp.asarray(starts[d]).astype(U32)) * U32(strides[d])
  return (r, c), rowflat


def global_flat_index(local_shape: Sequence[int], global_shape: Sequence[int], starts: Sequence[Any]) -> jax.Array:
  """uint32 within-leaf global flat index of every element of a shard (shape `local_shape`)."""
  flat = jnp.zeros(tuple(local_shape), U32)
  for d in range(len(local_shape)):
    stride = math.prod(global_shape[d + 1:])
    idx = jax.lax.broadcasted_iota(U32, tuple(local_shape), d) + jnp.asarray(starts[d]).astype(U32)
    flat = flat + idx * U32(stride)
  return flat


def _local(x, seed, scale, weights, *, global_shape, starts, off, block_size, impl, block_sizes, may_carry):
  """The op on one (local) array; `weights` is the full weight vector or None."""
  hi, lo = off
  if impl == "xla":  # flat indices in x's own shape: no reshape, so XLA updates a donated x in place
    return ref.perturb_at(x, seed, scale, hi, lo, global_flat_index(x.shape, global_shape, starts), weights,
                          block_size, may_carry)
  (r, c), rowflat = view_2d(x.shape, global_shape, starts)
  x2 = x.reshape(r, c)
  from jaxlab.kernels.zo_perturb import kernel  # pylint: disable=g-import-not-at-top
  cdt = ref.compute_dtype(x.dtype)
  ctr = jnp.stack([jnp.asarray(seed).astype(U32), hi, lo, jnp.zeros((), U32)])
  sc = jnp.reshape(jnp.asarray(scale, cdt), (1,))
  wp = None
  if weights is not None:
    n = weights.shape[0]
    wp = jnp.pad(jnp.asarray(weights).astype(cdt), (0, kernel._pow2(n) - n))  # pylint: disable=protected-access
  y2 = kernel.perturb_2d(x2, rowflat, ctr, sc, wp, block_size=block_size, block_sizes=block_sizes,
                         interpret=impl == "interpret", may_carry=may_carry)
  return y2.reshape(x.shape)


def _own_sharding(x) -> NamedSharding | None:
  """x's NamedSharding when x is a concrete array that has one (None for tracers, numpy and other shardings)."""
  if isinstance(x, jax.core.Tracer) or not isinstance(x, jax.Array):
    return None
  return x.sharding if isinstance(x.sharding, NamedSharding) else None


def _mesh_axes(entry) -> tuple[str, ...]:
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def perturb(x, seed, scale, *, mask=None, block_size: int | None = None, offset=0, impl: str = "auto",
            sharding: NamedSharding | None = None, block_sizes: BlockSizes | None = None):
  """Returns `x + scale * w * z` with z ~ N(0, 1) regenerated from (seed, offset + flat index).

  Args:
    x: float32/bfloat16/float16/float64 array of any shape (< 2^32 elements). Donate it (jit
      `donate_argnums`) to update it in place: the kernel's output aliases its input.
    seed: uint32 scalar (Python int or traced), e.g. one per optimizer step.
    scale: float scalar (traced is fine), e.g. +eps, -2 eps, or eps - lr * g.
    mask: optional (num_blocks,) per-block weights w (bool or float) over consecutive blocks of `block_size`
      elements of x.ravel(); blocks with w == 0 are returned unchanged (bit for bit).
    block_size: elements per mask block (default: x.size / num_blocks when that divides).
    offset: counter of x's first element (Python int < 2^64 or traced scalar < 2^32); give each leaf of a
      pytree its own range (`perturb_tree` does).
    impl: "auto" | "xla" | "pallas" | "interpret".
    sharding: x's NamedSharding (default: x's own when x is a concrete array; give it inside `jax.jit`);
      when it shards x, the op runs per shard in `jax.shard_map` with the shard's global offsets (identical
      bits to the unsharded op).
    block_sizes: kernel tiling (Pallas impls).

  Returns:
    Array with x's shape and dtype.

  Raises:
    ValueError: bad dtype, mask shape or block size, unknown impl, or "pallas" off GPU.
  """
  block_size = _check(x, mask, block_size)
  impl = resolve_impl(impl)
  bs = block_sizes or BlockSizes()
  off = ref.split_offset(offset)
  carry = ref.may_carry(offset, x.size)
  weights = None if mask is None else jnp.asarray(mask)
  if sharding is None:
    sharding = _own_sharding(x)
  spec = None if sharding is None else sharding.spec
  if spec is None or sharding.mesh.size == 1 or not any(_mesh_axes(e) for e in spec):
    return _local(x, seed, scale, weights, global_shape=x.shape, starts=[0] * x.ndim, off=off,
                  block_size=block_size, impl=impl, block_sizes=bs, may_carry=carry)
  mesh = sharding.mesh
  entries = list(spec) + [None] * (x.ndim - len(spec))

  def local(xl, seed_, scale_, hi_, lo_, *w):
    starts = []
    for d, e in enumerate(entries):
      axes = _mesh_axes(e)
      starts.append(jax.lax.axis_index(axes) * xl.shape[d] if axes else 0)
    return _local(xl, seed_, scale_, w[0] if w else None, global_shape=x.shape, starts=starts, off=(hi_, lo_),
                  block_size=block_size, impl=impl, block_sizes=bs, may_carry=carry)

  args = [x, jnp.asarray(seed).astype(U32), jnp.asarray(scale, ref.compute_dtype(x.dtype)), off[0], off[1]]
  in_specs = [P(*entries), P(), P(), P(), P()]
  if weights is not None:
    args.append(weights)
    in_specs.append(P())
  return jax.shard_map(local, mesh=mesh, in_specs=tuple(in_specs), out_specs=P(*entries), check_vma=False)(*args)


def leaf_offsets(tree) -> list[int]:
  """Counter offset of each leaf of `tree` (flatten order): the running total of the earlier leaves' sizes."""
  out, total = [], 0
  for leaf in jax.tree_util.tree_leaves(tree):
    out.append(total)
    total += math.prod(jnp.shape(leaf))
  return out


def perturb_tree(tree, seed, scale, *, masks=None, block_sizes_per_leaf=None, shardings=None, impl: str = "auto",
                 base_offset: int = 0, block_sizes: BlockSizes | None = None):
  """`perturb` on every leaf of a pytree, leaf i using counters from `base_offset + leaf_offsets(tree)[i]`.

  Args:
    tree: pytree of float arrays.
    seed, scale: as in `perturb` (shared by all leaves).
    masks: optional list (flatten order) of per-leaf block-weight vectors or None entries.
    block_sizes_per_leaf: optional list of per-leaf mask block sizes.
    shardings: optional pytree of NamedShardings matching `tree` (default: each leaf's own; see `perturb`).
    impl, block_sizes: as in `perturb`.
    base_offset: added to every leaf's offset.

  Returns:
    A pytree like `tree`. Together the leaves see one z over the concatenation of all leaves.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  offs = leaf_offsets(tree)
  shs = [None] * len(leaves) if shardings is None else treedef.flatten_up_to(shardings)
  masks = [None] * len(leaves) if masks is None else list(masks)
  sizes = [None] * len(leaves) if block_sizes_per_leaf is None else list(block_sizes_per_leaf)
  if len(masks) != len(leaves) or len(sizes) != len(leaves):
    raise ValueError(f"zo_perturb: masks / block sizes must have one entry per leaf ({len(leaves)} leaves), got "
                     f"{len(masks)} / {len(sizes)}")
  out = [perturb(x, seed, scale, mask=m, block_size=b, offset=base_offset + o, impl=impl, sharding=s,
                 block_sizes=block_sizes)
         for x, m, b, o, s in zip(leaves, masks, sizes, offs, shs)]
  return jax.tree_util.tree_unflatten(treedef, out)


def normal(shape: Sequence[int], seed, offset=0, dtype=jnp.float32) -> jax.Array:
  """The z that `perturb` adds to a leaf of `shape` at `offset` (for tests and estimators)."""
  return ref.normal(shape, seed, offset, dtype)
