"""Public selective-scan op: input checks, backend dispatch and the custom VJP.

    selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   return_last_state=False, *, impl="auto", block_sizes=None)

impl:
  "xla"            the pure-JAX reference (`reference.selective_scan_ref`, differentiated by JAX);
  "pallas"         compiled Pallas kernels: Triton on GPU (`kernel.py`), Mosaic on TPU (`kernel_tpu.py`);
  "interpret"      the GPU kernels run by the Pallas interpreter (any backend, e.g. CPU);
  "interpret_tpu"  the TPU kernels under Pallas' TPU interpret mode (any backend, e.g. CPU);
  "associative"    `reference.selective_scan_assoc` (materialises (batch, length, dim, state));
  "auto"           "pallas" on GPU/TPU, "xla" elsewhere.

Every Pallas path has the same custom VJP: the forward saves chunk-boundary states, the backward
recomputes the states inside each chunk (no (batch, length, dim, state) tensor is written to HBM).

Sharded inputs: the compiler partitions the XLA impls like any jitted code, but not a Pallas call. So when a
multi-device mesh is in context (`jaxlab.mesh.use`), a Pallas impl runs per shard inside `jax.shard_map`:
batch over the mesh axes of logical "batch", channels (d_inner) over those of logical "mlp", under the
context's sharding rules (a dimension that does not divide stays whole). Channels are independent, so the
result equals the single-device call. Without a mesh, on one device, or inside a `shard_map`, the kernel is
called directly.

Backend modules (`kernel`, `kernel_tpu`) implement

    forward(u, delta, A, B, C, D, z, delta_bias, *, delta_softplus, block_sizes, interpret, save_residuals)
        -> (out (b,l,d) in u.dtype, last_state (b,d,n) f32, residuals pytree or None)
    backward(u, delta, A, B, C, D, z, delta_bias, residuals, dout, dlast, *, delta_softplus,
             block_sizes, interpret)
        -> (du, ddelta, dA, dB, dC, dD, dz or None, ddelta_bias), float32, shaped like the inputs

where D and delta_bias are always arrays (zeros when the caller gave None) and z may be None.
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxlab.kernels import sharding as mesh_lib
from jaxlab.kernels.selective_scan import reference
from jaxlab.kernels.selective_scan.kernel import BlockSizes

IMPLS = ("auto", "xla", "pallas", "interpret", "interpret_tpu", "associative")
_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)


def _check(u, delta, A, B, C, D, z, delta_bias):
  if u.ndim != 3:
    raise ValueError(f"selective_scan: u must be (batch, length, dim), got shape {u.shape}")
  b, l, d = u.shape
  if l == 0 or b == 0 or d == 0:
    raise ValueError(f"selective_scan: empty input of shape {u.shape}")
  if A.ndim != 2 or A.shape[0] != d:
    raise ValueError(f"selective_scan: A must be (dim={d}, state), got {A.shape}")
  n = A.shape[1]
  want = {"delta": (delta, (b, l, d)), "B": (B, (b, l, n)), "C": (C, (b, l, n)), "z": (z, (b, l, d)),
          "D": (D, (d,)), "delta_bias": (delta_bias, (d,))}
  for name, (x, shape) in want.items():
    if x is not None and tuple(x.shape) != shape:
      raise ValueError(f"selective_scan: {name} must have shape {shape} (from u {u.shape}, A {A.shape}), got {x.shape}")
  for name, x in (("u", u), ("delta", delta), ("z", z), ("B", B), ("C", C)):
    if x is not None and x.dtype not in _FLOATS:
      raise ValueError(f"selective_scan: {name} must be float32/bfloat16/float16, got {x.dtype}")
  if delta.dtype != u.dtype or (z is not None and z.dtype != u.dtype):
    raise ValueError(f"selective_scan: delta and z must have u's dtype {u.dtype}, got delta {delta.dtype}"
                     f"{'' if z is None else f', z {z.dtype}'}")
  if B.dtype != C.dtype:
    raise ValueError(f"selective_scan: B and C must share a dtype, got {B.dtype} and {C.dtype}")
  if A.dtype != jnp.float32:
    raise ValueError(f"selective_scan: A must be float32, got {A.dtype}")


def resolve_impl(impl: str) -> str:
  """Maps "auto" to the backend's default; validates the name and the platform."""
  if impl not in IMPLS:
    raise ValueError(f"selective_scan: impl={impl!r} is not one of {IMPLS}")
  platform = jax.default_backend()
  if impl == "auto":
    return "pallas" if platform in ("gpu", "cuda", "rocm", "tpu") else "xla"
  if impl == "pallas" and platform not in ("gpu", "cuda", "tpu"):
    raise ValueError(f"selective_scan: impl='pallas' needs a GPU or TPU, this backend is {platform!r}; "
                     "use impl='interpret' (Pallas interpreter) or 'xla' (reference) on CPU")
  return impl


def _backend(impl: str):
  """(module, interpret flag) for a Pallas impl."""
  if impl == "interpret":
    return importlib.import_module("jaxlab.kernels.selective_scan.kernel"), True
  if impl == "interpret_tpu":
    return importlib.import_module("jaxlab.kernels.selective_scan.kernel_tpu"), True
  if jax.default_backend() == "tpu":
    return importlib.import_module("jaxlab.kernels.selective_scan.kernel_tpu"), False
  return importlib.import_module("jaxlab.kernels.selective_scan.kernel"), False


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   return_last_state=False, *, impl="auto", block_sizes: BlockSizes | None = None,
                   zoh_b: bool = False):
  """Mamba-1 selective scan (see `reference.py` for the exact semantics).

  Args:
    u, delta: (batch, length, dim), float32/bfloat16/float16 (same dtype).
    A: (dim, state) float32.
    B, C: (batch, length, state).
    D: optional (dim,) skip weights.
    z: optional (batch, length, dim) gate, u's dtype: out = y * silu(z).
    delta_bias: optional (dim,), added to delta before the optional softplus.
    delta_softplus: apply softplus to delta + delta_bias.
    return_last_state: also return the final state.
    impl: "auto" | "xla" | "pallas" | "interpret" | "interpret_tpu" | "associative".
    block_sizes: kernel tiling (default: `BlockSizes()` tuned per backend).
    zoh_b: exact zero-order hold for B (see `reference.selective_scan_ref`). Only the "xla" and "associative"
      impls have it; "auto" then picks "xla" on every backend.

  Returns:
    out (batch, length, dim) in u's dtype; with `return_last_state` also the last state
    (batch, dim, state) float32.

  Raises:
    ValueError: bad shapes or dtypes, unknown impl, "pallas" without a GPU/TPU, or `zoh_b` with a Pallas impl.
  """
  _check(u, delta, A, B, C, D, z, delta_bias)
  impl = "xla" if (zoh_b and impl == "auto") else resolve_impl(impl)
  if impl in ("xla", "associative"):
    fn = reference.selective_scan_ref if impl == "xla" else reference.selective_scan_assoc
    return fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, zoh_b)
  if zoh_b:
    raise ValueError(f"selective_scan: zoh_b=True is implemented by impl='xla' and 'associative' only, got "
                     f"impl={impl!r} (the Pallas kernels use Mamba's Euler rule for B)")
  axes = _shard_axes(u.shape[0], u.shape[-1])
  if axes is not None:   # inside the shard_map the mesh axes are manual, so this branch is not taken again
    fn = _per_shard(*axes, bool(return_last_state), delta_softplus=delta_softplus, impl=impl,
                    block_sizes=block_sizes)
    return fn(u, delta, A, B, C, D, z, delta_bias)
  module, interpret = _backend(impl)
  bs = block_sizes or BlockSizes()
  dim = u.shape[-1]
  Df = jnp.zeros((dim,), jnp.float32) if D is None else D.astype(jnp.float32)
  biasf = jnp.zeros((dim,), jnp.float32) if delta_bias is None else delta_bias.astype(jnp.float32)
  out, last = _scan_vjp(module, bool(delta_softplus), bs, interpret, u, delta, A, B, C, Df, z, biasf)
  return (out, last) if return_last_state else out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _scan_vjp(module, softplus, bs, interpret, u, delta, A, B, C, D, z, bias):
  out, last, _ = module.forward(u, delta, A, B, C, D, z, bias, delta_softplus=softplus, block_sizes=bs,
                                interpret=interpret, save_residuals=False)
  return out, last


def _fwd(module, softplus, bs, interpret, u, delta, A, B, C, D, z, bias):
  out, last, res = module.forward(u, delta, A, B, C, D, z, bias, delta_softplus=softplus, block_sizes=bs,
                                  interpret=interpret, save_residuals=True)
  return (out, last), (u, delta, A, B, C, D, z, bias, res)


def _bwd(module, softplus, bs, interpret, saved, cts):
  u, delta, A, B, C, D, z, bias, res = saved
  dout, dlast = cts
  grads = module.backward(u, delta, A, B, C, D, z, bias, res, dout, dlast.astype(jnp.float32),
                          delta_softplus=softplus, block_sizes=bs, interpret=interpret)
  inputs = (u, delta, A, B, C, D, z, bias)
  return tuple(None if x is None else g.astype(x.dtype) for g, x in zip(grads, inputs))


_scan_vjp.defvjp(_fwd, _bwd)


def _shard_axes(batch: int, dim: int):
  """(batch axes, channel axes) of the mesh in context for a Pallas scan, or None to call it directly.

  The axes are those of logical "batch" and "mlp" (d_inner) under the context's rules; a dimension that does
  not divide over its axes stays whole. None without a multi-device mesh, when neither dimension is split,
  or inside a `shard_map` (manual axes: the arrays are already per shard).
  """
  axes = mesh_lib.dividing_axes("batch", batch), mesh_lib.dividing_axes("mlp", dim)
  return None if axes == (None, None) else axes


def _per_shard(batch_axis, dim_axis, return_last_state, **kwargs):
  """`selective_scan` run per shard in `jax.shard_map` on the mesh in context.

  Batch is split over `batch_axis`, channels over `dim_axis` (either may be None). Channels are independent,
  so the forward needs no communication; the gradients of B and C (replicated over `dim_axis`) are summed
  over its shards by shard_map's transpose.
  """
  seq, state_seq, chan = P(batch_axis, None, dim_axis), P(batch_axis, None, None), P(dim_axis)
  out_specs = (seq, P(batch_axis, dim_axis, None)) if return_last_state else seq

  def local(u, delta, A, B, C, D, z, delta_bias):
    return selective_scan(u, delta, A, B, C, D, z, delta_bias, return_last_state=return_last_state, **kwargs)

  in_specs = (seq, seq, P(dim_axis, None), state_seq, state_seq, chan, seq, chan)
  return jax.shard_map(local, mesh=mesh_lib.current_mesh(), in_specs=in_specs, out_specs=out_specs,
                       check_vma=False)
