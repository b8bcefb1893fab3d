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
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

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
