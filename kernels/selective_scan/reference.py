"""Pure-JAX reference of the Mamba-1 selective scan: the spec every kernel is tested against.

Semantics (Mamba-1 `selective_scan_ref`, layout (batch, length, dim) as the models use it):

    d_t   = softplus(delta_t + delta_bias) if delta_softplus else delta_t + delta_bias
    x_t   = exp(d_t A) * x_{t-1} + (d_t u_t) B_t            x: (batch, dim, state), x_{-1} = 0
    y_t   = <C_t, x_t> + D u_t
    out_t = y_t * silu(z_t)                                   (when z is given)

All arithmetic is float32 whatever the input dtype; `out` is cast to u's dtype; the last state x_{L-1} is
float32.

Two formulations: `selective_scan_ref` (lax.scan over time, O(batch*dim*state) memory) and
`selective_scan_assoc` (lax.associative_scan over the (a, b) pairs of the linear recurrence; materialises
(batch, length, dim, state) float32, so only for short sequences and benchmarks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _prepare(u, delta, D, z, delta_bias, delta_softplus):
  f32 = jnp.float32
  d = delta.astype(f32)
  if delta_bias is not None:
    d = d + delta_bias.astype(f32)
  if delta_softplus:
    d = jax.nn.softplus(d)
  dim = u.shape[-1]
  D = jnp.zeros((dim,), f32) if D is None else D.astype(f32)
  gate = None if z is None else jax.nn.silu(z.astype(f32))
  return u.astype(f32), d, D, gate


def zoh_input_gain(delta, delta_a, A, zoh: bool):
  """The factor multiplying B u in the state update: delta (Euler, Mamba) or expm1(delta A) / A (exact ZOH).

  Args:
    delta: (..., dim) step sizes; delta_a: (..., dim, state) delta * A; A: (dim, state) (strictly negative).
    zoh: exact zero-order hold instead of Euler.

  Returns:
    (..., dim, 1) for Euler, (..., dim, state) for ZOH, float32.
  """
  return jnp.expm1(delta_a) / A if zoh else delta[..., None]


def selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                       return_last_state=False, zoh_b=False):
  """Selective scan by a sequential `lax.scan` over time.

  Args:
    u, delta: (batch, length, dim).
    A: (dim, state) float32 (negative real in Mamba).
    B, C: (batch, length, state).
    D: optional (dim,) skip connection.
    z: optional (batch, length, dim) gate: out = y * silu(z).
    delta_bias: optional (dim,) added to delta before the softplus.
    delta_softplus: apply softplus to delta (+ bias).
    return_last_state: also return the final state.
    zoh_b: discretise B by the exact zero-order hold, B_bar = (exp(delta A) - 1) / A * B, instead of Mamba's
      Euler rule B_bar = delta B (A_bar = exp(delta A) either way). With it, r steps at delta equal one step at
      r delta for an input held constant over the r steps (see `zoh_input_gain`).

  Returns:
    out (batch, length, dim) in u's dtype, and the last state (batch, dim, state) float32 if asked.
  """
  uf, d, Df, gate = _prepare(u, delta, D, z, delta_bias, delta_softplus)
  A = A.astype(jnp.float32)
  Bf, Cf = B.astype(jnp.float32), C.astype(jnp.float32)

  def step(x_bdn, inputs):
    d_bd, u_bd, b_bn, c_bn = inputs
    da = d_bd[..., None] * A
    x_bdn = jnp.exp(da) * x_bdn + zoh_input_gain(d_bd, da, A, zoh_b) * u_bd[..., None] * b_bn[:, None, :]
    return x_bdn, jnp.einsum("bdn,bn->bd", x_bdn, c_bn)

  batch, _, dim = u.shape
  x0 = jnp.zeros((batch, dim, A.shape[1]), jnp.float32)
  seq = tuple(jnp.swapaxes(a, 0, 1) for a in (d, uf, Bf, Cf))  # time-major
  last, y_lbd = jax.lax.scan(step, x0, seq)
  y = jnp.swapaxes(y_lbd, 0, 1) + uf * Df
  if gate is not None:
    y = y * gate
  out = y.astype(u.dtype)
  return (out, last) if return_last_state else out


def selective_scan_assoc(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                         return_last_state=False, zoh_b=False):
  """Same as `selective_scan_ref`, by `lax.associative_scan` over (batch, length, dim, state) pairs."""
  uf, d, Df, gate = _prepare(u, delta, D, z, delta_bias, delta_softplus)
  A = A.astype(jnp.float32)
  da = d[..., None] * A
  a = jnp.exp(da)                                                                  # (b, l, d, n)
  b = zoh_input_gain(d, da, A, zoh_b) * uf[..., None] * B.astype(jnp.float32)[:, :, None, :]   # (b, l, d, n)

  def combine(left, right):
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2

  _, x = jax.lax.associative_scan(combine, (a, b), axis=1)
  y = jnp.einsum("bldn,bln->bld", x, C.astype(jnp.float32)) + uf * Df
  if gate is not None:
    y = y * gate
  out = y.astype(u.dtype)
  return (out, x[:, -1]) if return_last_state else out
