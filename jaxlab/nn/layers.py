"""Shared NNX building blocks: initialisers, logically partitioned parameters, dense layers, norms, embeddings.

Every parameter carries LOGICAL axis names (`nnx.with_partitioning`), which `jaxlab.mesh` maps to mesh axes
with the run's sharding rules; nothing is placed eagerly (build models under `nnx.use_eager_sharding(False)`).

What is flax's and what is ours:

* Dense layers are flax's `nnx.Linear` / `nnx.LinearGeneral`, built by `dense` with partitioned
  initialisers; their parameters are `kernel` (*in_shape, *out_shape) and `bias` (out_shape). flax calls a
  LinearGeneral's kernel initialiser with the flattened shape (prod(in), prod(out)) and reshapes the result;
  the initialisers here draw one number per element in row-major order, so that gives the same values as
  drawing the full shape. Each layer consumes one `rngs.params()` key for its kernel and one for its bias
  (even for a zero bias).
* Embeddings are flax's `nnx.Embed` (`embed`): parameter `embedding` (rows, dim), one key.
* `RMSNorm` and `LayerNorm` are ours. flax's `nnx.RMSNorm` computes x * (rsqrt(mean(x^2) + eps) * scale),
  rounding differently from Hugging Face Llama / Qwen2 (x * rsqrt(...) rounded to the compute dtype, then
  times the weight) and from mamba_ssm's fused RMSNorm (x * rsqrt(...) * weight in float32); flax's
  `nnx.LayerNorm` computes the variance as mean(x^2) - mean(x)^2 by default, not as mean((x - mean)^2) like
  torch. Both flax norms also consume a PRNG key for their constant init and name their parameter `scale`
  where checkpoints say `weight`. Ours take no key and keep the Hugging Face names (`weight`, `bias`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab.kernels import sharding

Initializer = Callable[..., jax.Array]


# ------------------------------------------------------------------------------------------ initialisers


def normal(std: float) -> Initializer:
  """Initialiser: N(0, std^2) (Hugging Face's `initializer_range` convention)."""
  return nnx.initializers.normal(std)


def uniform(bound: float) -> Initializer:
  """Initialiser: uniform in [-bound, bound)."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def fan_in_uniform(fan_in: int, scale: float = 1.0) -> Initializer:
  """PyTorch's default Linear / Conv init (kaiming_uniform with a=sqrt(5)): uniform(+-1/sqrt(fan_in)) * scale.

  `fan_in` is explicit (not read from the shape), so it is right for kernels of any layout.
  """
  bound = 1.0 / math.sqrt(fan_in)
  def init(key, shape, dtype=jnp.float32):
    return scale * jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def zeros() -> Initializer:
  """Initialiser: zeros."""
  return nnx.initializers.zeros_init()


def ones() -> Initializer:
  """Initialiser: ones."""
  return nnx.initializers.ones_init()


def partitioned(init: Initializer, names: Sequence[str | None]) -> Initializer:
  """`init` whose result carries the logical axis `names` (one per dimension)."""
  return nnx.with_partitioning(init, tuple(names))


def param(init: Initializer, names: Sequence[str | None], key, shape: Sequence[int], dtype=jnp.float32) -> nnx.Param:
  """An `nnx.Param` of `shape` / `dtype` from `init(key, shape, dtype)`, annotated with logical axis `names`.

  `key` may be None for constant initialisers (no PRNG key is consumed).
  """
  return nnx.Param(partitioned(init, names)(key, tuple(shape), dtype))


# ---------------------------------------------------------------------------------------------- layers


def dense(in_shape: int | Sequence[int], out_shape: int | Sequence[int], *, names: Sequence[str | None],
          kernel_init: Initializer, use_bias: bool = False, bias_init: Initializer | None = None,
          dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs) -> nnx.Linear | nnx.LinearGeneral:
  """A flax dense layer contracting the trailing `len(in_shape)` input axes, with logical axis names.

  y = x W (+ b), W (*in_shape, *out_shape), b (*out_shape); computed in `dtype` (inputs, kernel and bias are
  cast to it first). `nnx.Linear` when both shapes are single ints, else `nnx.LinearGeneral`.

  Args:
    in_shape: size(s) of the contracted input axes.
    out_shape: size(s) of the output axes.
    names: logical names of the kernel axes (len(in_shape) + len(out_shape)); the bias takes the output part.
    kernel_init: kernel initialiser (see the module docstring on flattened shapes).
    use_bias: add a bias (initialised by `bias_init`, default zeros; it consumes a PRNG key either way).
    bias_init: bias initialiser.
    dtype: computation dtype.
    param_dtype: parameter dtype.
    rngs: initialisation randomness (one key for the kernel, then one for the bias).

  Returns:
    The layer; its parameters are `kernel` and (with `use_bias`) `bias`.
  """
  ins = (in_shape,) if isinstance(in_shape, int) else tuple(in_shape)
  outs = (out_shape,) if isinstance(out_shape, int) else tuple(out_shape)
  names = tuple(names)
  if len(names) != len(ins) + len(outs):
    raise ValueError(f"dense: {len(names)} axis names for a kernel of shape {ins + outs}")
  kw = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
            kernel_init=partitioned(kernel_init, names),
            bias_init=partitioned(bias_init or zeros(), names[len(ins):]))
  if len(ins) == 1 and len(outs) == 1:
    return nnx.Linear(ins[0], outs[0], **kw)
  return nnx.LinearGeneral(ins, outs, axis=tuple(range(-len(ins), 0)), **kw)


def embed(rows: int, dim: int, *, names: Sequence[str | None], init: Initializer, dtype=jnp.float32,
          param_dtype=jnp.float32, rngs: nnx.Rngs) -> nnx.Embed:
  """A flax `nnx.Embed` lookup table (rows, dim) with logical axis `names`; lookups return `dtype`."""
  return nnx.Embed(rows, dim, dtype=dtype, param_dtype=param_dtype, embedding_init=partitioned(init, names),
                   rngs=rngs)


class RMSNorm(nnx.Module):
  """Root-mean-square norm, statistics in float32: y = x / sqrt(mean(x^2) + eps) * weight.

  Two roundings of the weight multiply, for exact parity with two reference implementations:

  * `round_before_scale=False` (default; mamba_ssm's fused RMSNorm): (x_hat * weight) in float32, then
    cast to `dtype`;
  * `round_before_scale=True` (Hugging Face `LlamaRMSNorm` / `Qwen2RMSNorm`): x_hat cast to `dtype`
    first, then times the weight cast to `dtype`.

  In float32 the two are the same. The weight is initialised to ones without a PRNG key.

  Args:
    dim: feature size (last axis); the weight is (dim,) with logical name "embed".
    eps: added to the mean square.
    dtype: output dtype.
    param_dtype: weight dtype.
    round_before_scale: see above.
  """

  def __init__(self, dim: int, *, eps: float = 1e-5, dtype=jnp.float32, param_dtype=jnp.float32,
               round_before_scale: bool = False):
    self.weight = param(ones(), ("embed",), None, (dim,), param_dtype)
    self.eps = float(eps)
    self.dtype = dtype
    self.round_before_scale = bool(round_before_scale)

  def __call__(self, x: jax.Array) -> jax.Array:
    """(..., dim) any float dtype -> (..., dim) in `dtype`."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    if self.round_before_scale:
      return self.weight[...].astype(self.dtype) * y.astype(self.dtype)
    return (y * self.weight[...].astype(jnp.float32)).astype(self.dtype)


class LayerNorm(nnx.Module):
  """Layer norm as torch computes it, in float32: y = (x - mean) / sqrt(mean((x - mean)^2) + eps) * weight + bias.

  Parameters `weight` (ones) and `bias` (zeros), (dim,) with logical name "embed", initialised without a
  PRNG key.

  Args:
    dim: feature size (last axis).
    eps: added to the variance.
    dtype: output dtype.
    param_dtype: parameter dtype.
  """

  def __init__(self, dim: int, *, eps: float = 1e-5, dtype=jnp.float32, param_dtype=jnp.float32):
    self.weight = param(ones(), ("embed",), None, (dim,), param_dtype)
    self.bias = param(zeros(), ("embed",), None, (dim,), param_dtype)
    self.eps = float(eps)
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """(..., dim) any float dtype -> (..., dim) in `dtype`."""
    x32 = x.astype(jnp.float32)
    mu = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mu), axis=-1, keepdims=True)
    y = (x32 - mu) * jax.lax.rsqrt(var + self.eps)
    return (y * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)).astype(self.dtype)


# ----------------------------------------------------------------------------------------------------
# Stacked (scanned) blocks and activation sharding, shared by the LM transformer and the DiT
# ----------------------------------------------------------------------------------------------------

LAYERS_AXIS = "layers"       # logical name of the stacked-layer axis (no rule maps it: replicated)
REMAT_POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable", "everything_saveable")


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """`jax.lax.with_sharding_constraint` of x to logical axis names under the mesh and rules in context.

  A no-op without a multi-device mesh (or inside a `shard_map`); a dimension whose mesh axes do not divide
  it stays unconstrained (e.g. batch 1 while sampling), so the constraint never makes a call fail.
  """
  mesh = sharding.current_mesh()
  if not sharding.multi_device(mesh) or getattr(mesh, "manual_axes", ()):
    return x
  spec = sharding.logical_to_mesh(jax.sharding.PartitionSpec(*names), sharding.current_rules(), mesh)
  sizes = dict(mesh.shape)
  entries = []
  for dim, entry in zip(x.shape, tuple(spec) + (None,) * (x.ndim - len(spec))):
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    entries.append(entry if axes and dim % math.prod(sizes[a] for a in axes) == 0 else None)
  spec = jax.sharding.PartitionSpec(*entries)
  if isinstance(mesh, jax.sharding.Mesh):
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))
  return jax.lax.with_sharding_constraint(x, spec)


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def stack_blocks(blocks: Sequence[nnx.Module]) -> nnx.Module:
  """One module of the blocks' structure whose variables are the blocks' stacked on a new leading axis.

  The axis is named `LAYERS_AXIS` in each variable's logical sharding names (`flax.nnx.spmd.add_axis`).
  """
  splits = [nnx.split(b) for b in blocks]
  graphdef, states = splits[0][0], [st for _, st in splits]
  stacked = jax.tree.map(lambda *vs: vs[0].replace(jnp.stack([v[...] for v in vs])), *states, is_leaf=_is_var)
  stacked = nnx.spmd.add_axis(stacked, 0, {nnx.PARTITION_NAME: LAYERS_AXIS})
  return nnx.merge(graphdef, stacked)


def scan_blocks(stacked: nnx.Module, h: Any, apply: Callable, xs: Any = None, *,
                remat_policy: str | None = None) -> tuple[Any, Any]:
  """Runs h through `stack_blocks` output under `jax.lax.scan`: (final h, stacked per-layer outputs).

  `apply(block, h, x) -> (h, y)` is called with one layer's block and the matching slice of `xs` (None when
  xs is None). `remat_policy` (one of `REMAT_POLICIES`) wraps the scan body in `jax.checkpoint` with that
  policy (`prevent_cse=False`, as scan bodies need no CSE barrier); None keeps every activation.
  """
  graphdef, state = nnx.split(stacked)

  def body(h, layer_xs):
    layer_state, x = layer_xs
    return apply(nnx.merge(graphdef, layer_state), h, x)
  if remat_policy is not None:
    body = jax.checkpoint(body, policy=getattr(jax.checkpoint_policies, remat_policy), prevent_cse=False)
  return jax.lax.scan(body, h, (state, xs))
