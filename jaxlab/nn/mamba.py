"""Mamba-1 selective state-space block (Flax NNX) and its pre-norm residual layer.

Paper: Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces" (arXiv 2312.00752);
the fused block follows the semantics of mamba_ssm's `mamba_inner_fn` / `selective_scan_fn`.

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
`delta_softplus=False`. All scan arithmetic is float32. The scan reads the device mesh from the context
(`jaxlab.mesh.use`): on a multi-device mesh a Pallas impl runs per shard (batch over logical "batch",
d_inner over logical "mlp"); the XLA impls are partitioned by the compiler.

Initialisation follows the official code (mamba_ssm `Mamba.__init__`): dt_proj weight
uniform(+-dt_rank**-0.5 * dt_scale) ("random") or constant; dt_proj bias = softplus^{-1}(dt), dt log-uniform
in [dt_min, dt_max] floored at dt_init_floor; A_log = log(1..d_state); D = 1; other Linear / conv weights
uniform(+-1/sqrt(fan_in)) (PyTorch's default); Linear biases zero. Reconstructed (not fixed by the paper or
its code): the (d_model, 2, d_inner) layout of W_in (so that sharding d_inner over the `model` mesh axis keeps
each device's x and z halves together); the conv computed in float32 for any compute dtype.

The language model on these blocks is `jaxlab.nn.mamba_lm.MambaLM`; its Hugging Face checkpoint IO is
`jaxlab.nn.mamba_hf`.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab.kernels.selective_scan import reference, selective_scan
from jaxlab.nn import layers

Cache = tuple[jax.Array, jax.Array]


class _CausalConv1d(nnx.Module):
  """Causal depthwise conv over time: out_t = sum_j w_j * x_{t - (k-1) + j} + b (zero left padding).

  Same as torch `Conv1d(d, d, k, groups=d, padding=k-1)` truncated to the first `length` outputs.
  Computed in float32; the kernel is (k, dim), logical names (None, "mlp"). Ours rather than `nnx.Conv`: the
  full-sequence call and the recurrent `step` sum the same taps in the same order, so generation step by
  step reproduces the parallel forward bit for bit; the kernel keeps the (d_conv, d_inner) layout of the
  checkpoint IO.
  """

  def __init__(self, dim: int, width: int, *, use_bias: bool, rngs: nnx.Rngs):
    init = layers.fan_in_uniform(width)
    self.kernel = layers.param(init, (None, "mlp"), rngs.params(), (width, dim))
    self.bias = layers.param(init, ("mlp",), rngs.params(), (dim,)) if use_bias else None
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
    scan_impl: `impl` passed to `selective_scan` ("auto", "xla", "pallas", "interpret", ...). On a
      multi-device mesh in context (`jaxlab.mesh.use`) a Pallas impl runs per shard (see
      `jaxlab.kernels.selective_scan.selective_scan`).
    discretization: "euler" (Mamba: B_bar = Delta B) or "zoh" (exact zero-order hold for B as well,
      B_bar = (exp(Delta A) - 1) / A B; needs scan_impl "auto", "xla" or "associative").
    dtype: computation dtype (parameters stay float32; the scan accumulates in float32).
    out_proj_init_scale: multiplies the out_proj init (the LM passes 1/sqrt(n_layer)).
    rngs: initialisation randomness (not stored).
  """

  def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: float = 2,
               dt_rank: int | str = "auto", dt_min: float = 0.001, dt_max: float = 0.1,
               dt_init: str = "random", dt_scale: float = 1.0, dt_init_floor: float = 1e-4,
               conv_bias: bool = True, bias: bool = False, scan_impl: str = "auto", dtype=jnp.float32,
               *, out_proj_init_scale: float = 1.0, discretization: str = "euler", rngs: nnx.Rngs):
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
    self.dtype = dtype
    with nnx.use_eager_sharding(False):   # logical names are mapped to the mesh by jaxlab.state
      kw = dict(dtype=dtype, rngs=rngs)
      self.in_proj = layers.dense(d_model, (2, d_inner), names=("embed", None, "mlp"),
                                  kernel_init=layers.fan_in_uniform(d_model), use_bias=bias, **kw)
      self.conv1d = _CausalConv1d(d_inner, d_conv, use_bias=conv_bias, rngs=rngs)
      self.x_proj = layers.dense(d_inner, dt_rank + 2 * d_state, names=("mlp", None),
                                 kernel_init=layers.fan_in_uniform(d_inner), **kw)
      std = dt_rank ** -0.5 * dt_scale
      w_init = layers.uniform(std) if dt_init == "random" else nnx.initializers.constant(std)
      # dt_proj's bias is added inside the fused scan (delta_bias), so the block applies only its kernel.
      self.dt_proj = layers.dense(dt_rank, d_inner, names=(None, "mlp"), kernel_init=w_init, use_bias=True,
                                  bias_init=_dt_bias_init(dt_min, dt_max, dt_init_floor), **kw)
      a_init = lambda key, shape, dtype: jnp.log(jnp.broadcast_to(
          jnp.arange(1, shape[1] + 1, dtype=dtype), shape))
      self.A_log = layers.param(a_init, ("mlp", "state"), None, (d_inner, d_state))
      self.D = layers.param(layers.ones(), ("mlp",), None, (d_inner,))
      self.out_proj = layers.dense(d_inner, d_model, names=("mlp", "embed"),
                                   kernel_init=layers.fan_in_uniform(d_inner, out_proj_init_scale), use_bias=bias,
                                   **kw)

  # -- shared pieces ---------------------------------------------------------------------------------

  def _ssm_inputs(self, u):
    """(dt without bias, B, C) from the conv output u (..., d_inner), all in `dtype`."""
    x_dbl = self.x_proj(u)
    r, n = self.dt_rank, self.d_state
    dt, B, C = x_dbl[..., :r], x_dbl[..., r:r + n], x_dbl[..., r + n:]
    kernel = self.dt_proj.kernel[...].astype(self.dtype)
    return jnp.tensordot(dt.astype(self.dtype), kernel, axes=((dt.ndim - 1,), (0,))), B, C

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
    res = selective_scan(u, delta if fused else self._scaled_delta(delta, delta_scale), A, B, C, self.D[...], z,
                         self.dt_proj.bias[...] if fused else None, **kwargs)
    y, last = res if return_last_state else (res, None)
    return self.out_proj(y), x, last

  # -- public API ------------------------------------------------------------------------------------

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
    self.norm = layers.RMSNorm(d_model, eps=eps, dtype=dtype)
    self.mixer = MambaBlock(d_model, dtype=dtype, rngs=rngs, **block_kwargs)

  def __call__(self, h_bld: jax.Array, delta_scale=None) -> jax.Array:
    """(batch, length, d_model) residual stream -> same shape and dtype."""
    return h_bld + self.mixer(self.norm(h_bld), delta_scale).astype(h_bld.dtype)
