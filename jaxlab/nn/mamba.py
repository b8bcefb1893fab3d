"""Mamba-1 selective state-space block and language model (Flax NNX), with Hugging Face checkpoint IO.

Paper: Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces" (arXiv 2312.00752).
Spec of the fused block: `shared/papers/selective_scan.md` section B.1 (MambaInnerFn semantics).

Equations implemented, per block, with x of shape (batch, length, d_model) and d_inner = expand * d_model:

    (x', z)   = x W_in                                   W_in: (d_model, 2, d_inner)  [(x | z) halves]
    u         = SiLU(causal_depthwise_conv1d(x'))        kernel width d_conv, left zero padding
    (dt, B, C) = u W_x                                   widths (dt_rank, d_state, d_state)
    Delta     = softplus(dt W_dt + b_dt) [* delta_scale]  (d_inner,) per position; Euler rule for B
    A         = -exp(A_log)                              (d_inner, d_state)
    h_t       = exp(Delta_t A) * h_{t-1} + (Delta_t u_t) B_t      h: (batch, d_inner, d_state), h_{-1} = 0
                (discretization="zoh": (exp(Delta_t A) - 1) / A instead of Delta_t, exact for a held input)
    y_t       = <C_t, h_t> + D u_t
    out       = (y * SiLU(z)) W_out                      (batch, length, d_model)

The scan (the h/y lines and the gate) runs in `jaxlab.kernels.selective_scan.selective_scan` with
`delta_bias=b_dt, delta_softplus=True` (the official fused path). With `delta_scale` (DF-Mamba: Delta
multiplied by r^k AFTER the softplus) Delta is formed outside the scan and passed with
`delta_softplus=False`. All scan arithmetic is float32.

The language model (mamba_ssm `MixerModel` / Hugging Face `MambaForCausalLM`): token embedding, n_layer
pre-norm residual blocks `h = h + Mamba(RMSNorm(h))` (residual stream in float32 by default), final
RMSNorm, head tied to the embedding. A recurrent `step` carries per layer the last d_conv - 1 conv inputs
and the (batch, d_inner, d_state) float32 SSM state, so generation costs O(1) per token.

Initialisation follows the official code (mamba_ssm `Mamba.__init__` and `MixerModel._init_weights`):
dt_proj weight uniform(+-dt_rank**-0.5 * dt_scale) ("random") or constant; dt_proj bias =
softplus^{-1}(dt), dt log-uniform in [dt_min, dt_max] floored at dt_init_floor; A_log = log(1..d_state);
D = 1; other Linear / conv weights uniform(+-1/sqrt(fan_in)) (PyTorch's default); Linear biases zero;
embedding N(0, 0.02); out_proj divided by sqrt(n_layer) in the LM (`rescale_prenorm_residual`).
Reconstructed (not fixed by the paper or its code): the (d_model, 2, d_inner) layout of W_in (so that
sharding d_inner over the `model` mesh axis keeps each device's x and z halves together); float32 logits;
the conv computed in float32 for any compute dtype.

Checkpoints: `MambaLM.from_pretrained(dir)` / `save_pretrained(dir)` read and write the Hugging Face
format (config.json + *.safetensors, torch (out, in) Linear layout, names `backbone.layers.{i}.mixer.*`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.errors import CheckpointError, require
from jaxlab.kernels.selective_scan import reference, selective_scan, sharded

Cache = tuple[jax.Array, jax.Array]


# ----------------------------------------------------------------------------------------------------
# Initialisers and small layers
# ----------------------------------------------------------------------------------------------------


def _uniform(bound: float) -> Callable[..., jax.Array]:
  """Initialiser: uniform in [-bound, bound)."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def _fan_in_uniform(fan_in: int, scale: float = 1.0) -> Callable[..., jax.Array]:
  """PyTorch's default Linear/Conv init (kaiming_uniform with a=sqrt(5)): uniform(+-1/sqrt(fan_in)) * scale."""
  bound = 1.0 / math.sqrt(fan_in)
  def init(key, shape, dtype=jnp.float32):
    return scale * jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def _param(init, names: Sequence[str | None], key, shape) -> nnx.Param:
  """A float32 `nnx.Param` annotated with logical axis `names`."""
  return nnx.Param(nnx.with_partitioning(init, tuple(names))(key, tuple(shape), jnp.float32))


class _Dense(nnx.Module):
  """Linear map from the last input axis to an output of any shape (kernel (in, *out_shape), float32).

  Args:
    in_features: size of the contracted input axis.
    out_shape: output shape appended after the batch axes.
    names: logical axis names of the kernel, len(out_shape) + 1 entries.
    kernel_init: kernel initialiser.
    use_bias: add a (zero-initialised unless `bias_init`) bias of shape `out_shape`.
    bias_init: bias initialiser.
    dtype: computation dtype.
    rngs: initialisation randomness.
  """

  def __init__(self, in_features: int, out_shape: Sequence[int], *, names: Sequence[str | None],
               kernel_init, use_bias: bool = False, bias_init=None, dtype=jnp.float32, rngs: nnx.Rngs):
    out_shape = tuple(out_shape)
    self.kernel = _param(kernel_init, names, rngs.params(), (in_features, *out_shape))
    self.bias = (_param(bias_init or nnx.initializers.zeros_init(), names[1:], rngs.params(), out_shape)
                 if use_bias else None)
    self.dtype = dtype

  def __call__(self, x: jax.Array, use_bias: bool = True) -> jax.Array:
    """(..., in) -> (..., *out_shape) in `dtype`; `use_bias=False` skips the bias."""
    k = self.kernel[...].astype(self.dtype)
    y = jnp.tensordot(x.astype(self.dtype), k, axes=((x.ndim - 1,), (0,)))
    if use_bias and self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y


class _CausalConv1d(nnx.Module):
  """Causal depthwise conv over time: out_t = sum_j w_j * x_{t - (k-1) + j} + b (zero left padding).

  Same as torch `Conv1d(d, d, k, groups=d, padding=k-1)` truncated to the first `length` outputs.
  Computed in float32; the kernel is (k, dim), logical names (None, "mlp").
  """

  def __init__(self, dim: int, width: int, *, use_bias: bool, rngs: nnx.Rngs):
    self.kernel = _param(_fan_in_uniform(width), (None, "mlp"), rngs.params(), (width, dim))
    self.bias = _param(_fan_in_uniform(width), ("mlp",), rngs.params(), (dim,)) if use_bias else None
    self.width = width

  def _apply(self, taps: Sequence[jax.Array]) -> jax.Array:
    w = self.kernel[...]
    acc = taps[0].astype(jnp.float32) * w[0]
    for j in range(1, self.width):
      acc = acc + taps[j].astype(jnp.float32) * w[j]
    if self.bias is not None:
      acc = acc + self.bias[...]
    return acc

  def __call__(self, x_bld: jax.Array) -> jax.Array:
    """(batch, length, dim) -> (batch, length, dim) float32."""
    length = x_bld.shape[1]
    xp = jnp.pad(x_bld, ((0, 0), (self.width - 1, 0), (0, 0)))
    return self._apply([xp[:, j:j + length] for j in range(self.width)])

  def step(self, window_bkd: jax.Array) -> jax.Array:
    """One output from the last `width` inputs, window (batch, width, dim) oldest first -> (batch, dim) f32."""
    return self._apply([window_bkd[:, j] for j in range(self.width)])


class RMSNorm(nnx.Module):
  """Root-mean-square layer norm: y = x / sqrt(mean(x^2) + eps) * weight, statistics in float32.

  Args:
    dim: feature size (last axis); the weight is (dim,) float32, logical name "embed".
    eps: added to the mean square.
    dtype: output dtype.
  """

  def __init__(self, dim: int, *, eps: float = 1e-5, dtype=jnp.float32):
    self.weight = nnx.Param(nnx.with_partitioning(nnx.initializers.ones_init(), ("embed",))(
        None, (dim,), jnp.float32))
    self.eps = eps
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """(..., dim) any float dtype -> (..., dim) in `dtype`."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * self.weight[...]).astype(self.dtype)


# ----------------------------------------------------------------------------------------------------
# Mamba block
# ----------------------------------------------------------------------------------------------------


class MambaBlock(nnx.Module):
  """Mamba-1 mixer (selective SSM block), layout (batch, length, d_model).

  Parameters (float32) and their logical axis names:
    in_proj.kernel (d_model, 2, d_inner) ("embed", None, "mlp")  [+ bias (2, d_inner) when `bias`]
    conv1d.kernel (d_conv, d_inner) (None, "mlp"), conv1d.bias (d_inner,) ("mlp",)
    x_proj.kernel (d_inner, dt_rank + 2 d_state) ("mlp", None)
    dt_proj.kernel (dt_rank, d_inner) (None, "mlp"), dt_proj.bias (d_inner,) ("mlp",)
    A_log (d_inner, d_state) ("mlp", "state"), D (d_inner,) ("mlp",)
    out_proj.kernel (d_inner, d_model) ("mlp", "embed")  [+ bias (d_model,)]

  Args:
    d_model: model width.
    d_state: SSM state size N.
    d_conv: causal conv width.
    expand: d_inner = int(expand * d_model).
    dt_rank: rank of the Delta projection; "auto" = ceil(d_model / 16).
    dt_min, dt_max: range of the initial Delta (log-uniform).
    dt_init: "random" (uniform dt_proj weight) or "constant".
    dt_scale: scale of the dt_proj weight init.
    dt_init_floor: lower clamp of the initial Delta.
    conv_bias: conv1d has a bias.
    bias: in_proj / out_proj have biases.
    scan_impl: `impl` passed to `selective_scan` ("auto", "xla", "pallas", "interpret", ...).
    discretization: "euler" (Mamba: B_bar = Delta B) or "zoh" (exact zero-order hold for B as well,
      B_bar = (exp(Delta A) - 1) / A B; needs scan_impl "auto", "xla" or "associative").
    dtype: computation dtype (parameters stay float32; the scan accumulates in float32).
    out_proj_init_scale: multiplies the out_proj init (the LM passes 1/sqrt(n_layer)).
    scan_mesh, scan_axes: run the scan per shard of this mesh, (batch axis, d_inner axis) (see
      `set_scan_mesh`); None calls the op directly.
    rngs: initialisation randomness (not stored).
  """

  def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: float = 2,
               dt_rank: int | str = "auto", dt_min: float = 0.001, dt_max: float = 0.1,
               dt_init: str = "random", dt_scale: float = 1.0, dt_init_floor: float = 1e-4,
               conv_bias: bool = True, bias: bool = False, scan_impl: str = "auto", dtype=jnp.float32,
               *, out_proj_init_scale: float = 1.0, scan_mesh=None,
               scan_axes: tuple[str | None, str | None] = ("data", "model"), discretization: str = "euler",
               rngs: nnx.Rngs):
    d_inner = int(expand * d_model)
    if discretization not in ("euler", "zoh"):
      raise ValueError(f"MambaBlock: discretization must be 'euler' or 'zoh', got {discretization!r}")
    dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else int(dt_rank)
    if dt_init not in ("random", "constant"):
      raise ValueError(f"MambaBlock: dt_init must be 'random' or 'constant', got {dt_init!r}")
    if not 0 < dt_min <= dt_max:
      raise ValueError(f"MambaBlock: need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
    self.d_model, self.d_state, self.d_conv, self.d_inner, self.dt_rank = d_model, d_state, d_conv, d_inner, dt_rank
    self.scan_impl = scan_impl
    self.discretization = discretization
    self.scan_mesh, self.scan_axes = scan_mesh, tuple(scan_axes)   # see `set_scan_mesh`
    self.dtype = dtype
    with nnx.use_eager_sharding(False):   # logical names are mapped to the mesh by jaxlab.state
      self.in_proj = _Dense(d_model, (2, d_inner), names=("embed", None, "mlp"),
                            kernel_init=_fan_in_uniform(d_model), use_bias=bias, dtype=dtype, rngs=rngs)
      self.conv1d = _CausalConv1d(d_inner, d_conv, use_bias=conv_bias, rngs=rngs)
      self.x_proj = _Dense(d_inner, (dt_rank + 2 * d_state,), names=("mlp", None),
                           kernel_init=_fan_in_uniform(d_inner), dtype=dtype, rngs=rngs)
      std = dt_rank ** -0.5 * dt_scale
      w_init = _uniform(std) if dt_init == "random" else nnx.initializers.constant(std)
      self.dt_proj = _Dense(dt_rank, (d_inner,), names=(None, "mlp"), kernel_init=w_init, use_bias=True,
                            bias_init=_dt_bias_init(dt_min, dt_max, dt_init_floor), dtype=dtype, rngs=rngs)
      a_init = lambda key, shape, dtype: jnp.log(jnp.broadcast_to(
          jnp.arange(1, shape[1] + 1, dtype=dtype), shape))
      self.A_log = _param(a_init, ("mlp", "state"), None, (d_inner, d_state))
      self.D = _param(nnx.initializers.ones_init(), ("mlp",), None, (d_inner,))
      self.out_proj = _Dense(d_inner, (d_model,), names=("mlp", "embed"),
                             kernel_init=_fan_in_uniform(d_inner, out_proj_init_scale), use_bias=bias,
                             dtype=dtype, rngs=rngs)

  # -- shared pieces ---------------------------------------------------------------------------------

  def _ssm_inputs(self, u):
    """(dt without bias, B, C) from the conv output u (..., d_inner), all in `dtype`."""
    x_dbl = self.x_proj(u)
    r, n = self.dt_rank, self.d_state
    dt, B, C = x_dbl[..., :r], x_dbl[..., r:r + n], x_dbl[..., r + n:]
    return self.dt_proj(dt, use_bias=False), B, C

  def _scaled_delta(self, delta, delta_scale):
    """softplus(delta + b_dt) * delta_scale in float32, rounded through `dtype` like the scan input."""
    d = jax.nn.softplus(delta.astype(jnp.float32) + self.dt_proj.bias[...])
    return (d * jnp.asarray(delta_scale, jnp.float32)).astype(self.dtype)

  def _forward(self, x_bld, delta_scale, return_last_state):
    xz = self.in_proj(x_bld)                                   # (b, l, 2, d_inner)
    x, z = xz[..., 0, :], xz[..., 1, :]
    u = jax.nn.silu(self.conv1d(x)).astype(self.dtype)
    delta, B, C = self._ssm_inputs(u)
    A = -jnp.exp(self.A_log[...])
    fused = delta_scale is None
    kwargs = dict(delta_softplus=fused, return_last_state=return_last_state, impl=self.scan_impl,
                  zoh_b=self.discretization == "zoh")
    scan = selective_scan
    if self.scan_mesh is not None:
      scan = sharded(self.scan_mesh, batch_axis=self.scan_axes[0], dim_axis=self.scan_axes[1], **kwargs)
      kwargs = {}
    res = scan(u, delta if fused else self._scaled_delta(delta, delta_scale), A, B, C, self.D[...], z,
               self.dt_proj.bias[...] if fused else None, **kwargs)
    y, last = res if return_last_state else (res, None)
    return self.out_proj(y), x, last

  # -- public API ------------------------------------------------------------------------------------

  def set_scan_mesh(self, mesh, batch_axis: str | None = "data", dim_axis: str | None = "model") -> None:
    """Runs the scan per shard with `jaxlab.kernels.selective_scan.sharded` (`jax.shard_map`).

    Needed for the Pallas impls on a multi-device mesh (a Pallas call is not partitioned by the compiler):
    batch is split over `batch_axis` and d_inner over `dim_axis`, as the default sharding rules place them
    (batch -> "data", "mlp" -> "model"). The batch and d_inner must divide by those axis sizes.

    Args:
      mesh: a `jax.sharding.Mesh`, or None to call the op directly (the default).
      batch_axis, dim_axis: mesh axis names (None: that dimension is not split).
    """
    self.scan_mesh, self.scan_axes = mesh, (batch_axis, dim_axis)

  def __call__(self, x_bld: jax.Array, delta_scale: jax.Array | float | None = None) -> jax.Array:
    """Full-sequence forward.

    Args:
      x_bld: (batch, length, d_model) input.
      delta_scale: optional scalar or array broadcastable to (batch, length, d_inner) multiplying Delta
        after the softplus (DF-Mamba's r^k); None uses the fused scan (bias + softplus inside).

    Returns:
      (batch, length, d_model) in `dtype`.
    """
    return self._forward(x_bld, delta_scale, False)[0]

  def prefill(self, x_bld: jax.Array, delta_scale=None) -> tuple[jax.Array, Cache]:
    """Full-sequence forward that also returns the recurrent cache after the last position.

    Args:
      x_bld: (batch, length, d_model).
      delta_scale: as in `__call__`.

    Returns:
      (y_bld (batch, length, d_model) in `dtype`, cache) where cache is as in `init_cache`.
    """
    y, x, last = self._forward(x_bld, delta_scale, True)
    k = self.d_conv - 1
    if x.shape[1] < k:
      x = jnp.pad(x, ((0, 0), (k - x.shape[1], 0), (0, 0)))
    conv_state = x[:, x.shape[1] - k:].astype(self.dtype)
    return y, (conv_state, last)

  def init_cache(self, batch: int, dtype=None) -> Cache:
    """Zero recurrent cache.

    Args:
      batch: batch size.
      dtype: dtype of the conv state (default: the compute dtype).

    Returns:
      (conv_state (batch, d_conv - 1, d_inner) in `dtype`, holding the last d_conv - 1 conv inputs, oldest
      first; ssm_state (batch, d_inner, d_state) float32).
    """
    dtype = self.dtype if dtype is None else dtype
    return (jnp.zeros((batch, self.d_conv - 1, self.d_inner), dtype),
            jnp.zeros((batch, self.d_inner, self.d_state), jnp.float32))

  def step(self, x_bd: jax.Array, cache: Cache, delta_scale=None) -> tuple[jax.Array, Cache]:
    """One recurrent step; a sequence of steps from `init_cache` equals the full-sequence call.

    Args:
      x_bd: (batch, d_model) input at one position.
      cache: (conv_state, ssm_state) from `init_cache`, `prefill` or a previous step.
      delta_scale: optional scalar or array broadcastable to (batch, d_inner) (see `__call__`).

    Returns:
      (y_bd (batch, d_model) in `dtype`, new cache).
    """
    conv_state, h = cache
    xz = self.in_proj(x_bd)                                    # (b, 2, d_inner)
    x, z = xz[:, 0], xz[:, 1]
    window = jnp.concatenate([conv_state.astype(self.dtype), x[:, None]], axis=1)   # (b, d_conv, d_inner)
    u = jax.nn.silu(self.conv1d.step(window)).astype(self.dtype)
    delta, B, C = self._ssm_inputs(u)
    if delta_scale is None:
      d = jax.nn.softplus(delta.astype(jnp.float32) + self.dt_proj.bias[...])
    else:
      d = self._scaled_delta(delta, delta_scale).astype(jnp.float32)
    A = -jnp.exp(self.A_log[...])
    uf = u.astype(jnp.float32)
    da = d[..., None] * A
    gain = reference.zoh_input_gain(d, da, A, self.discretization == "zoh")
    h = jnp.exp(da) * h + gain * uf[..., None] * B.astype(jnp.float32)[:, None, :]
    y = jnp.einsum("bdn,bn->bd", h, C.astype(jnp.float32)) + uf * self.D[...]
    y = (y * jax.nn.silu(z.astype(jnp.float32))).astype(self.dtype)
    return self.out_proj(y), (window[:, 1:].astype(conv_state.dtype), h)


def _dt_bias_init(dt_min: float, dt_max: float, floor: float):
  """dt_proj bias init: softplus^{-1}(dt) with dt log-uniform in [dt_min, dt_max], clamped below at floor."""
  def init(key, shape, dtype=jnp.float32):
    lo, hi = math.log(dt_min), math.log(dt_max)
    dt = jnp.exp(jax.random.uniform(key, shape, jnp.float32) * (hi - lo) + lo)
    dt = jnp.maximum(dt, floor)
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)    # inverse of softplus
  return init


# ----------------------------------------------------------------------------------------------------
# Language model
# ----------------------------------------------------------------------------------------------------


class MambaLayer(nnx.Module):
  """Pre-norm residual wrapper: h + mixer(RMSNorm(h)).

  Args:
    d_model: width.
    eps: RMSNorm epsilon.
    dtype: compute dtype.
    rngs: initialisation randomness.
    **block_kwargs: passed to `MambaBlock`.
  """

  def __init__(self, d_model: int, *, eps: float, dtype, rngs: nnx.Rngs, **block_kwargs):
    self.norm = RMSNorm(d_model, eps=eps, dtype=dtype)
    self.mixer = MambaBlock(d_model, dtype=dtype, rngs=rngs, **block_kwargs)

  def __call__(self, h_bld: jax.Array, delta_scale=None) -> jax.Array:
    """(batch, length, d_model) residual stream -> same shape and dtype."""
    return h_bld + self.mixer(self.norm(h_bld), delta_scale).astype(h_bld.dtype)


class MambaLM(nnx.Module):
  """Mamba-1 causal language model (mamba_ssm `MambaLMHeadModel` / HF `MambaForCausalLM` layout).

  Parameters: embed.embedding (padded_vocab, d_model) ("vocab", "embed"); layers[i].norm.weight,
  layers[i].mixer.* (see `MambaBlock`); norm_f.weight; lm_head.kernel (d_model, padded_vocab)
  ("embed", "vocab") only when `tie_embeddings=False`.

  Args:
    vocab_size: number of tokens; the embedding has `padded_vocab_size` rows (rounded up to a multiple of
      `pad_vocab_size_multiple`) and logits have `padded_vocab_size` columns (as in mamba_ssm).
    d_model: width.
    n_layer: number of residual Mamba blocks.
    d_state, d_conv, expand, dt_rank, conv_bias, bias: `MambaBlock` settings.
    pad_vocab_size_multiple: see `vocab_size`.
    norm_eps: RMSNorm epsilon.
    tie_embeddings: the output head is the transposed embedding.
    residual_in_fp32: keep the residual stream in float32 (whatever `dtype`).
    scan_impl: selective-scan implementation of every block (see `set_scan_impl`).
    scan_mesh, scan_axes: run every block's scan per shard of this mesh (see `MambaBlock.set_scan_mesh`).
    dtype: compute dtype (parameters are float32; logits are returned in float32).
    rngs: initialisation randomness (not stored).
    **block_kwargs: further `MambaBlock` settings (dt_min, dt_max, dt_init, dt_scale, dt_init_floor).
  """

  def __init__(self, vocab_size: int, d_model: int, n_layer: int, *, d_state: int = 16, d_conv: int = 4,
               expand: float = 2, dt_rank: int | str = "auto", conv_bias: bool = True, bias: bool = False,
               pad_vocab_size_multiple: int = 8, norm_eps: float = 1e-5, tie_embeddings: bool = True,
               residual_in_fp32: bool = True, scan_impl: str = "auto", scan_mesh=None,
               scan_axes: tuple[str | None, str | None] = ("data", "model"), dtype=jnp.float32,
               rngs: nnx.Rngs, **block_kwargs):
    m = max(int(pad_vocab_size_multiple), 1)
    padded = -(-vocab_size // m) * m
    self.vocab_size, self.padded_vocab_size = vocab_size, padded
    self.d_model, self.n_layer = d_model, n_layer
    # Hashable (the graphdef is a static jit argument in `generate`); read it through `config`.
    self._config = tuple(sorted(dict(
        vocab_size=vocab_size, d_model=d_model, n_layer=n_layer, d_state=d_state, d_conv=d_conv,
        expand=expand, dt_rank=dt_rank, conv_bias=conv_bias, bias=bias, pad_vocab_size_multiple=m,
        norm_eps=norm_eps, tie_embeddings=tie_embeddings, residual_in_fp32=residual_in_fp32,
        **block_kwargs).items()))
    self.tie_embeddings, self.residual_in_fp32 = tie_embeddings, residual_in_fp32
    self.dtype = dtype
    with nnx.use_eager_sharding(False):
      self.embed = nnx.Embed(padded, d_model, dtype=dtype, param_dtype=jnp.float32, rngs=rngs,
                             embedding_init=nnx.with_partitioning(nnx.initializers.normal(0.02),
                                                                  ("vocab", "embed")))
      self.layers = nnx.List([
          MambaLayer(d_model, eps=norm_eps, dtype=dtype, rngs=rngs, d_state=d_state, d_conv=d_conv,
                     expand=expand, dt_rank=dt_rank, conv_bias=conv_bias, bias=bias, scan_impl=scan_impl,
                     scan_mesh=scan_mesh, scan_axes=scan_axes, out_proj_init_scale=1.0 / math.sqrt(n_layer),
                     **block_kwargs)
          for _ in range(n_layer)])
      self.norm_f = RMSNorm(d_model, eps=norm_eps, dtype=dtype)
      self.lm_head = None if tie_embeddings else _Dense(
          d_model, (padded,), names=("embed", "vocab"), kernel_init=_fan_in_uniform(d_model), dtype=dtype,
          rngs=rngs)

  @property
  def config(self) -> dict[str, Any]:
    """The constructor's architecture arguments (without rngs, dtype and scan_impl)."""
    return dict(self._config)

  def set_scan_impl(self, impl: str, mesh=None, batch_axis: str | None = "data",
                    dim_axis: str | None = "model") -> None:
    """Sets the `selective_scan` implementation of every block, optionally run per shard of `mesh`.

    Args:
      impl: "auto", "xla", "pallas", "interpret", ... (see `jaxlab.kernels.selective_scan`).
      mesh: when given, every block scans inside `jax.shard_map` (see `MambaBlock.set_scan_mesh`).
      batch_axis, dim_axis: mesh axes of the batch and d_inner dimensions.
    """
    for layer in self.layers:
      layer.mixer.scan_impl = impl
      layer.mixer.set_scan_mesh(mesh, batch_axis, dim_axis)

  def _embed(self, tokens):
    h = self.embed(tokens)
    return h.astype(jnp.float32) if self.residual_in_fp32 else h.astype(self.dtype)

  def _logits(self, h):
    x = self.norm_f(h)
    logits = self.embed.attend(x) if self.lm_head is None else self.lm_head(x)
    return logits.astype(jnp.float32)

  def __call__(self, tokens_bl: jax.Array, delta_scale=None) -> jax.Array:
    """Logits of every position.

    Args:
      tokens_bl: (batch, length) integer token ids.
      delta_scale: optional Delta multiplier applied in every block (see `MambaBlock.__call__`).

    Returns:
      (batch, length, padded_vocab_size) float32 logits.
    """
    h = self._embed(tokens_bl)
    for layer in self.layers:
      h = layer(h, delta_scale)
    return self._logits(h)

  def init_cache(self, batch: int) -> tuple[Cache, ...]:
    """Zero recurrent cache: one (conv_state, ssm_state) pair per layer (see `MambaBlock.init_cache`)."""
    return tuple(layer.mixer.init_cache(batch) for layer in self.layers)

  def prefill(self, tokens_bl: jax.Array, delta_scale=None) -> tuple[jax.Array, tuple[Cache, ...]]:
    """Runs a prompt with the parallel scan and returns the last logits and the cache after it.

    Args:
      tokens_bl: (batch, length) prompt, length >= 1.
      delta_scale: optional Delta multiplier.

    Returns:
      (logits_bv (batch, padded_vocab_size) float32 for the last position, cache).
    """
    h = self._embed(tokens_bl)
    cache = []
    for layer in self.layers:
      y, c = layer.mixer.prefill(layer.norm(h), delta_scale)
      h = h + y.astype(h.dtype)
      cache.append(c)
    return self._logits(h[:, -1]), tuple(cache)

  def step(self, token_b: jax.Array, cache: tuple[Cache, ...], delta_scale=None
           ) -> tuple[jax.Array, tuple[Cache, ...]]:
    """One token of recurrent inference.

    Args:
      token_b: (batch,) integer token ids.
      cache: from `init_cache`, `prefill` or a previous `step`.
      delta_scale: optional Delta multiplier.

    Returns:
      (logits_bv (batch, padded_vocab_size) float32, new cache).
    """
    h = self._embed(token_b)
    new = []
    for layer, c in zip(self.layers, cache):
      y, c = layer.mixer.step(layer.norm(h), c, delta_scale)
      h = h + y.astype(h.dtype)
      new.append(c)
    return self._logits(h), tuple(new)

  def generate(self, tokens_bl: jax.Array, max_new_tokens: int, *, temperature: float = 0.0,
               key: jax.Array | None = None) -> jax.Array:
    """Autoregressive generation: parallel prefill, then a jitted `lax.scan` of recurrent steps.

    Args:
      tokens_bl: (batch, length) integer prompt, length >= 1.
      max_new_tokens: number of tokens to append.
      temperature: 0 for greedy decoding, > 0 to sample from softmax(logits / temperature).
      key: PRNG key, required when temperature > 0.

    Returns:
      (batch, length + max_new_tokens) int32: the prompt followed by the generated tokens. Token ids
      >= vocab_size (vocabulary padding) are never produced.
    """
    tokens_bl = jnp.asarray(tokens_bl)
    if tokens_bl.ndim != 2 or tokens_bl.shape[1] < 1:
      raise ValueError(f"generate: tokens must be (batch, length >= 1), got shape {tokens_bl.shape}")
    if max_new_tokens <= 0:
      return tokens_bl.astype(jnp.int32)
    sample = temperature > 0
    if sample and key is None:
      raise ValueError("generate: temperature > 0 samples tokens and needs key=jax.random.key(...)")
    key = jax.random.key(0) if key is None else key
    graphdef, state = nnx.split(self)
    return _generate(graphdef, state, tokens_bl.astype(jnp.int32), jnp.float32(max(temperature, 1e-6)), key,
                     max_new_tokens=int(max_new_tokens), sample=bool(sample))

  # -- Hugging Face checkpoints ------------------------------------------------------------------------

  @classmethod
  def from_pretrained(cls, path: str, dtype=jnp.float32, scan_impl: str = "auto") -> "MambaLM":
    """Loads a local Hugging Face-format Mamba checkpoint directory (nothing is downloaded).

    Args:
      path: directory with config.json (HF `MambaConfig`, or mamba_ssm's d_model/n_layer/ssm_cfg style)
        and one or more *.safetensors files with names `backbone.embeddings.weight`,
        `backbone.layers.{i}.{norm.weight, mixer.*}`, `backbone.norm_f.weight` [, `lm_head.weight`].
      dtype: compute dtype of the returned model (parameters are float32).
      scan_impl: `selective_scan` implementation of the blocks.

    Returns:
      A `MambaLM` holding the checkpoint's weights.

    Raises:
      CheckpointError: missing config.json or weights, unsupported architecture, a missing, unexpected or
        mis-shaped tensor.
      MissingDependencyError: safetensors is not installed (pip install 'jaxlab[hf]').
    """
    kwargs = _read_config(path)
    tensors = _read_safetensors(path)
    model = nnx.eval_shape(lambda: cls(**kwargs, scan_impl=scan_impl, dtype=dtype, rngs=nnx.Rngs(0)))
    prefix = "backbone."
    if not any(k.startswith(prefix) for k in tensors):
      prefix = ""                                           # a bare MambaModel checkpoint
    tensors = {(f"{prefix}embeddings.weight" if k == f"{prefix}embedding.weight" else k): v
               for k, v in tensors.items()}                 # mamba_ssm spelling
    used = set()
    for name, var, to_hf, from_hf in model._hf_entries(prefix):
      if name not in tensors:
        raise CheckpointError(f"checkpoint {path} has no tensor '{name}' (needed by the {model.n_layer}-layer "
                              "model its config.json describes)")
      arr = tensors[name]
      want = to_hf(np.zeros(var.get_value().shape, np.float32)).shape
      if tuple(arr.shape) != tuple(want):
        raise CheckpointError(f"checkpoint tensor '{name}' in {path} has shape {tuple(arr.shape)}, expected "
                              f"{tuple(want)} from config.json")
      var.set_value(jnp.asarray(from_hf(np.asarray(arr, np.float32)), jnp.float32))
      used.add(name)
    extra = sorted(k for k in tensors if k not in used and not (k == "lm_head.weight" and model.tie_embeddings))
    if extra:
      raise CheckpointError(f"checkpoint {path} has tensor '{extra[0]}' ({len(extra)} unexpected in all) that "
                            f"the model from config.json does not use; config.json does not match the weights")
    return model

  def save_pretrained(self, path: str) -> None:
    """Writes config.json (HF `MambaConfig`) and model.safetensors (HF tensor names and torch layout).

    The result loads with `MambaLM.from_pretrained` (bit-exact) and with transformers'
    `MambaForCausalLM.from_pretrained`.

    Args:
      path: output directory (created if needed).
    """
    st = require("safetensors", "hf")
    import safetensors.numpy  # noqa: F401  (submodule)
    os.makedirs(path, exist_ok=True)
    c = self.config
    mixer = self.layers[0].mixer if self.n_layer else None
    cfg = {
        "architectures": ["MambaForCausalLM"], "model_type": "mamba",
        "vocab_size": self.padded_vocab_size, "hidden_size": self.d_model, "state_size": c["d_state"],
        "num_hidden_layers": self.n_layer, "conv_kernel": c["d_conv"], "expand": c["expand"],
        "intermediate_size": int(c["expand"] * self.d_model),
        "time_step_rank": mixer.dt_rank if mixer else c["dt_rank"], "use_bias": c["bias"],
        "use_conv_bias": c["conv_bias"], "layer_norm_epsilon": c["norm_eps"],
        "tie_word_embeddings": self.tie_embeddings, "residual_in_fp32": self.residual_in_fp32,
        "hidden_act": "silu", "torch_dtype": "float32",
    }
    for ours, theirs in (("dt_min", "time_step_min"), ("dt_max", "time_step_max"), ("dt_scale", "time_step_scale"),
                         ("dt_init", "time_step_init_scheme"), ("dt_init_floor", "time_step_floor")):
      if ours in c:
        cfg[theirs] = c[ours]
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump(cfg, f, indent=2, sort_keys=True)
    tensors = {name: np.ascontiguousarray(to_hf(np.asarray(jax.device_get(var[...]), np.float32)))
               for name, var, to_hf, _ in self._hf_entries("backbone.")}
    st.numpy.save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})

  def _hf_entries(self, prefix: str):
    """(HF name, variable, ours -> HF array fn, HF -> ours array fn) for every parameter."""
    ident = (lambda a: a, lambda a: a)
    linear = (lambda a: a.T, lambda a: a.T)                  # ours (in, out) <-> torch (out, in)
    out = [(f"{prefix}embeddings.weight", self.embed.embedding, *ident)]
    for i, layer in enumerate(self.layers):
      p, m = f"{prefix}layers.{i}.", layer.mixer
      d, di = m.d_model, m.d_inner
      out.append((p + "norm.weight", layer.norm.weight, *ident))
      p += "mixer."
      out.append((p + "in_proj.weight", m.in_proj.kernel,
                  lambda a, d=d: a.reshape(d, -1).T, lambda a, d=d, di=di: a.T.reshape(d, 2, di)))
      if m.in_proj.bias is not None:
        out.append((p + "in_proj.bias", m.in_proj.bias, lambda a: a.reshape(-1), lambda a, di=di: a.reshape(2, di)))
      out.append((p + "conv1d.weight", m.conv1d.kernel, lambda a: a.T[:, None, :], lambda a: a[:, 0, :].T))
      if m.conv1d.bias is not None:
        out.append((p + "conv1d.bias", m.conv1d.bias, *ident))
      out.append((p + "x_proj.weight", m.x_proj.kernel, *linear))
      out.append((p + "dt_proj.weight", m.dt_proj.kernel, *linear))
      out.append((p + "dt_proj.bias", m.dt_proj.bias, *ident))
      out.append((p + "A_log", m.A_log, *ident))
      out.append((p + "D", m.D, *ident))
      out.append((p + "out_proj.weight", m.out_proj.kernel, *linear))
      if m.out_proj.bias is not None:
        out.append((p + "out_proj.bias", m.out_proj.bias, *ident))
    out.append((f"{prefix}norm_f.weight", self.norm_f.weight, *ident))
    if self.lm_head is not None:
      out.append(("lm_head.weight", self.lm_head.kernel, *linear))
    return out


def _generate_impl(graphdef, state, tokens_bl, temperature, key, *, max_new_tokens, sample):
  model = nnx.merge(graphdef, state)
  vocab_mask = jnp.arange(model.padded_vocab_size) < model.vocab_size

  def pick(logits_bv, k):
    logits_bv = jnp.where(vocab_mask, logits_bv, -jnp.inf)
    if sample:
      return jax.random.categorical(k, logits_bv / temperature, axis=-1).astype(jnp.int32)
    return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)

  keys = jax.random.split(key, max_new_tokens)
  logits, cache = model.prefill(tokens_bl)
  first = pick(logits, keys[0])

  def body(carry, k):
    tok, cache = carry
    logits, cache = model.step(tok, cache)
    nxt = pick(logits, k)
    return (nxt, cache), nxt

  _, rest = jax.lax.scan(body, (first, cache), keys[1:])
  return jnp.concatenate([tokens_bl, first[:, None], rest.T], axis=1)


_generate = jax.jit(_generate_impl, static_argnames=("graphdef", "max_new_tokens", "sample"))


# ----------------------------------------------------------------------------------------------------
# Checkpoint reading
# ----------------------------------------------------------------------------------------------------


_HF_ARCHS = ("MambaForCausalLM", "MambaModel", "MambaLMHeadModel")


def _read_config(path: str) -> dict[str, Any]:
  """MambaLM keyword arguments from a checkpoint's config.json (HF or mamba_ssm style)."""
  from jaxlab.lm.hf import read_hf_config  # pylint: disable=g-import-not-at-top
  cfg = read_hf_config(path)
  cfg_path = os.path.join(path, "config.json")   # named in the errors below
  model_type = cfg.get("model_type")
  if model_type not in (None, "mamba"):
    raise CheckpointError(f"{cfg_path}: model_type '{model_type}' is not supported; MambaLM loads Mamba-1 "
                          "checkpoints (model_type 'mamba')")
  archs = cfg.get("architectures") or []
  bad = [a for a in archs if a not in _HF_ARCHS]
  if bad:
    raise CheckpointError(f"{cfg_path}: architecture '{bad[0]}' is not supported; expected one of {_HF_ARCHS}")
  if "hidden_size" in cfg:                                    # transformers MambaConfig
    d_model = int(cfg["hidden_size"])
    expand = cfg.get("expand", 2)
    if "intermediate_size" in cfg and int(cfg["intermediate_size"]) != int(expand * d_model):
      raise CheckpointError(f"{cfg_path}: intermediate_size {cfg['intermediate_size']} != expand * hidden_size "
                            f"({expand} * {d_model}); such checkpoints are not supported")
    kwargs = dict(
        vocab_size=int(cfg.get("vocab_size", 50280)), d_model=d_model,
        n_layer=int(cfg.get("num_hidden_layers", 32)), d_state=int(cfg.get("state_size", 16)),
        d_conv=int(cfg.get("conv_kernel", 4)), expand=expand, dt_rank=cfg.get("time_step_rank", "auto"),
        conv_bias=bool(cfg.get("use_conv_bias", True)), bias=bool(cfg.get("use_bias", False)),
        pad_vocab_size_multiple=1, norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        residual_in_fp32=bool(cfg.get("residual_in_fp32", True)))
    for theirs, ours in (("time_step_min", "dt_min"), ("time_step_max", "dt_max"), ("time_step_scale", "dt_scale"),
                         ("time_step_init_scheme", "dt_init"), ("time_step_floor", "dt_init_floor")):
      if theirs in cfg:
        kwargs[ours] = cfg[theirs]
    return kwargs
  if "d_model" in cfg:                                        # mamba_ssm MambaConfig
    ssm = dict(cfg.get("ssm_cfg") or {})
    if ssm.get("layer", "Mamba1") != "Mamba1":
      raise CheckpointError(f"{cfg_path}: ssm_cfg.layer '{ssm['layer']}' is not supported (Mamba1 only)")
    if not cfg.get("rms_norm", True):
      raise CheckpointError(f"{cfg_path}: rms_norm=false (LayerNorm) checkpoints are not supported")
    if cfg.get("d_intermediate", 0) or cfg.get("attn_layer_idx"):
      raise CheckpointError(f"{cfg_path}: hybrid checkpoints (d_intermediate MLPs / attention layers) are not "
                            "supported")
    known = ("d_state", "d_conv", "expand", "dt_rank", "dt_min", "dt_max", "dt_init", "dt_scale",
             "dt_init_floor", "conv_bias", "bias")
    unknown = sorted(k for k in ssm if k not in known + ("layer", "use_fast_path"))
    if unknown:
      raise CheckpointError(f"{cfg_path}: ssm_cfg key '{unknown[0]}' is not supported")
    return dict(vocab_size=int(cfg["vocab_size"]), d_model=int(cfg["d_model"]), n_layer=int(cfg["n_layer"]),
                pad_vocab_size_multiple=int(cfg.get("pad_vocab_size_multiple", 8)),
                tie_embeddings=bool(cfg.get("tie_embeddings", True)),
                residual_in_fp32=bool(cfg.get("residual_in_fp32", True)),
                **{k: ssm[k] for k in known if k in ssm})
  raise CheckpointError(f"{cfg_path} has neither 'hidden_size' (Hugging Face MambaConfig) nor 'd_model' "
                        "(mamba_ssm config); it is not a Mamba checkpoint config")


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of the *.safetensors files in `path` (numpy; bfloat16 is widened to float32).

  Reading (sharded files, the bf16 fallback, errors) is shared with the transformer loader
  (`jaxlab.lm.hf.read_safetensors`).
  """
  from jaxlab.lm.hf import read_safetensors  # pylint: disable=g-import-not-at-top
  tensors = read_safetensors(path)
  return {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in tensors.items()}
