"""Pallas selective-scan kernels for GPU (Triton lowering); they also run in the Pallas interpreter (CPU).

Layout (batch, length, dim) as the models use it; state x is (dim, state) per batch row; all arithmetic is
float32 in registers whatever the input dtype.

Forward, chunked two-pass (the Mamba-1 analogue of the chunked SSD algorithm of Mamba-2: Dao & Gu, ICML 2024,
arXiv 2405.21060). The sequence is cut into chunks of `chunk` steps so that each program has only `chunk`
dependent steps instead of `length`:

  pass 1  grid (batch, dim/block_d, chunks): scan each chunk from a zero state; write its local final
          state h_c (block_d, state) and the chunk's sum of Delta, s_c (the chunk's decay is exp(A s_c)).
  pass 2  same grid: each program first folds the earlier chunks' (h, s) into its true initial state
          H_c = exp(A s_{c-1}) H_{c-1} + h_{c-1} (a short loop over at most `chunks` small tiles), then rescans
          its chunk and writes y; the last chunk writes the final state. Under differentiation it also saves
          the state every `sub_chunk` steps (the only residual besides s_c).

Backward (two passes, mirror image; never writes a (batch, length, dim, state) tensor):

  pass 1  grid (batch, dim/block_d_bwd, chunks): reverse scan of the state cotangent dx inside each chunk
          from zero; writes P_c = a_first * dx_first (what the chunk passes to the previous one).
  pass 2  each program folds the later chunks (carry = P_k + exp(A s_k) carry, starting from the final
          state's cotangent) into its incoming carry, then walks its sub-chunks backwards: recompute the
          `sub_chunk` states from the saved boundary state (statically unrolled, kept in registers), then step
          backwards through them accumulating du, dDelta (through softplus and bias), dz, dD, dA, and the
          per-program partial sums of dB and dC (reduced over dim blocks in XLA).

Triton needs power-of-two blocks: `block_d`, `chunk`, `sub_chunk` are powers of two, the state is padded
to a power of two (zeros in A, B, C keep the padded states at 0), dim is padded to a block multiple, and
time steps past the true length get Delta = 0 (state unchanged, no output) inside the kernels.
Refs are indexed with dynamic time inside `fori_loop` (values are never dynamically sliced), the pattern
that Pallas-Triton lowers.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tiling of the selective-scan kernels (None = the backend's default).

  Attributes:
    block_d: channels per program in the forward (GPU default 16; TPU default 128, a lane multiple).
    chunk: time steps per program (a power of two; default 128 on both). The forward runs two passes over
      chunks: local chunk states, then outputs from the true chunk-initial states.
    sub_chunk: the backward's recompute granularity: the forward saves a state every `sub_chunk` steps and
      the backward recomputes the states in between (GPU default 16, TPU default 8).
    block_d_bwd: channels per program in the backward (GPU default 32; TPU default 128).
    num_warps: Triton warps per program (GPU only; default 1).
    num_stages: Triton pipelining stages (GPU only; default 1).
  """
  block_d: int | None = None
  chunk: int | None = None
  sub_chunk: int | None = None
  block_d_bwd: int | None = None
  num_warps: int | None = None
  num_stages: int | None = None


GPU_DEFAULTS = BlockSizes(block_d=16, chunk=128, sub_chunk=16, block_d_bwd=32, num_warps=1, num_stages=1)


def _pow2(x: int) -> int:
  return 1 << max(int(x) - 1, 0).bit_length()


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Concrete (padded) sizes of one call."""
  b: int
  l: int
  d: int
  n: int
  lp: int        # padded length (multiple of chunk)
  dp: int        # padded dim (multiple of block_d and block_d_bwd)
  np_: int       # padded state (power of two)
  chunk: int
  sub: int
  nc: int        # number of chunks
  ncp: int       # chunk slots in the residual arrays (power of two, for Triton block shapes)
  bd: int
  bd_bwd: int
  warps: int
  stages: int


def plan(u_shape, n: int, block_sizes: BlockSizes | None) -> _Plan:
  """Resolves block sizes against the problem size (shrinking them for small problems)."""
  bs = block_sizes or BlockSizes()
  get = lambda f: getattr(bs, f) if getattr(bs, f) is not None else getattr(GPU_DEFAULTS, f)  # noqa: E731
  b, l, d = u_shape
  for f in ("block_d", "chunk", "sub_chunk", "block_d_bwd"):
    v = get(f)
    if v <= 0 or v & (v - 1):
      raise ValueError(f"selective_scan: BlockSizes.{f}={v} must be a positive power of two")
  chunk = min(get("chunk"), max(_pow2(l), 8))
  sub = min(get("sub_chunk"), chunk)
  bd = min(get("block_d"), _pow2(d))
  bd_bwd = min(get("block_d_bwd"), _pow2(d))
  lp = -(-l // chunk) * chunk
  step = max(bd, bd_bwd)
  dp = -(-d // step) * step
  nc = lp // chunk
  return _Plan(b=b, l=l, d=d, n=n, lp=lp, dp=dp, np_=_pow2(n), chunk=chunk, sub=sub, nc=nc, ncp=_pow2(nc),
               bd=bd, bd_bwd=bd_bwd, warps=get("num_warps"), stages=get("num_stages"))


def _pad_to(x, shape):
  if x is None:
    return None
  return jnp.pad(x, [(0, t - s) for s, t in zip(x.shape, shape)])


def _softplus(x):
  return jnp.where(x > 20.0, x, jnp.log1p(jnp.exp(jnp.minimum(x, 20.0))))


def _params(p: _Plan):
  return pltr.CompilerParams(num_warps=p.warps, num_stages=p.stages)


def _delta(raw, bias, softplus, valid):
  """Delta used by the recurrence (bias, optional softplus, 0 past the true length)."""
  d = raw + bias
  if softplus:
    d = _softplus(d)
  return jnp.where(valid, d, 0.0)


# ----------------------------------------------------------------------------------------------- forward


def _fwd_local_kernel(u_ref, delta_ref, a_ref, b_ref, bias_ref, h_ref, s_ref, *, p: _Plan, softplus: bool):
  """Pass 1: the chunk's final state from a zero start, and its sum of Delta."""
  A = a_ref[...]
  bias = bias_ref[...]
  t0 = pl.program_id(2) * p.chunk

  def step(t, carry):
    x, s = carry
    d = _delta(delta_ref[0, t, :].astype(F32), bias, softplus, t0 + t < p.l)
    x = jnp.exp(d[:, None] * A) * x + (d * u_ref[0, t, :].astype(F32))[:, None] * b_ref[0, t, :].astype(F32)[None, :]
    return x, s + d

  x, s = jax.lax.fori_loop(0, p.chunk, step, (jnp.zeros((p.bd, p.np_), F32), jnp.zeros((p.bd,), F32)))
  h_ref[0, 0, :, :] = x
  s_ref[0, 0, :] = s


def _fwd_out_kernel(*refs, p: _Plan, softplus: bool, has_z: bool, save: bool):
  """Pass 2: true chunk-initial state, outputs y, final state, and (if `save`) sub-chunk boundary states."""
  refs = list(refs)
  u_ref, delta_ref = refs.pop(0), refs.pop(0)
  z_ref = refs.pop(0) if has_z else None
  a_ref, b_ref, c_ref, dskip_ref, bias_ref, h_ref, s_ref = refs[:7]
  out_ref, last_ref = refs[7], refs[8]
  bnd_ref = refs[9] if save else None
  A = a_ref[...]
  bias = bias_ref[...]
  dskip = dskip_ref[...]
  c = pl.program_id(2)
  t0 = c * p.chunk

  def fold(k, x):
    return jnp.exp(s_ref[0, k, :][:, None] * A) * x + h_ref[0, k, :, :]

  x = jax.lax.fori_loop(0, c, fold, jnp.zeros((p.bd, p.np_), F32))

  def step(t, x):
    uu = u_ref[0, t, :].astype(F32)
    d = _delta(delta_ref[0, t, :].astype(F32), bias, softplus, t0 + t < p.l)
    x = jnp.exp(d[:, None] * A) * x + (d * uu)[:, None] * b_ref[0, t, :].astype(F32)[None, :]
    y = jnp.sum(x * c_ref[0, t, :].astype(F32)[None, :], axis=1) + dskip * uu
    if has_z:
      zz = z_ref[0, t, :].astype(F32)
      y = y * zz * jax.nn.sigmoid(zz)
    out_ref[0, t, :] = y.astype(out_ref.dtype)
    return x

  def sub_chunk(i, x):
    if save:
      bnd_ref[0, i, :, :] = x
    return jax.lax.fori_loop(i * p.sub, (i + 1) * p.sub, step, x)

  x = jax.lax.fori_loop(0, p.chunk // p.sub, sub_chunk, x)

  @pl.when(c == p.nc - 1)
  def _():
    last_ref[0, :, :] = x


def forward(u, delta, A, B, C, D, z, delta_bias, *, delta_softplus, block_sizes=None, interpret=False,
            save_residuals=False):
  """Selective scan forward on GPU / interpreter (see the module docstring for the algorithm).

  Args:
    u, delta: (b, l, d); z: (b, l, d) or None (same dtype as u).
    A: (d, n) float32; B, C: (b, l, n); D, delta_bias: (d,) float32.
    delta_softplus: apply softplus to delta + delta_bias inside the kernel.
    block_sizes: BlockSizes (None fields take GPU defaults).
    interpret: run with the Pallas interpreter.
    save_residuals: also return what `backward` needs.

  Returns:
    (out (b, l, d) in u.dtype, last state (b, d, n) float32, residuals or None).
  """
  p = plan(u.shape, A.shape[1], block_sizes)
  has_z = z is not None
  up, deltap, zp = (_pad_to(x, (p.b, p.lp, p.dp)) for x in (u, delta, z))
  Ap = _pad_to(A.astype(F32), (p.dp, p.np_))
  Bp, Cp = (_pad_to(x, (p.b, p.lp, p.np_)) for x in (B, C))
  Dp, biasp = (_pad_to(x.astype(F32), (p.dp,)) for x in (D, delta_bias))
  grid = (p.b, p.dp // p.bd, p.nc)
  seq = pl.BlockSpec((1, p.chunk, p.bd), lambda i, j, c: (i, c, j))
  state_seq = pl.BlockSpec((1, p.chunk, p.np_), lambda i, j, c: (i, c, 0))
  a_spec = pl.BlockSpec((p.bd, p.np_), lambda i, j, c: (j, 0))
  vec = pl.BlockSpec((p.bd,), lambda i, j, c: (j,))

  h, s = pl.pallas_call(
      functools.partial(_fwd_local_kernel, p=p, softplus=delta_softplus),
      grid=grid,
      in_specs=[seq, seq, a_spec, state_seq, vec],
      out_specs=[pl.BlockSpec((1, 1, p.bd, p.np_), lambda i, j, c: (i, c, j, 0)),
                 pl.BlockSpec((1, 1, p.bd), lambda i, j, c: (i, c, j))],
      out_shape=[jax.ShapeDtypeStruct((p.b, p.ncp, p.dp, p.np_), F32),
                 jax.ShapeDtypeStruct((p.b, p.ncp, p.dp), F32)],
      interpret=interpret, compiler_params=_params(p), name="selective_scan_fwd_local",
  )(up, deltap, Ap, Bp, biasp)

  all_h = pl.BlockSpec((1, p.ncp, p.bd, p.np_), lambda i, j, c: (i, 0, j, 0))
  all_s = pl.BlockSpec((1, p.ncp, p.bd), lambda i, j, c: (i, 0, j))
  in_specs = [seq, seq] + ([seq] if has_z else []) + [a_spec, state_seq, state_seq, vec, vec, all_h, all_s]
  out_specs = [seq, pl.BlockSpec((1, p.bd, p.np_), lambda i, j, c: (i, j, 0))]
  out_shape = [jax.ShapeDtypeStruct((p.b, p.lp, p.dp), u.dtype), jax.ShapeDtypeStruct((p.b, p.dp, p.np_), F32)]
  if save_residuals:
    nsub = p.chunk // p.sub
    out_specs.append(pl.BlockSpec((1, nsub, p.bd, p.np_), lambda i, j, c: (i, c, j, 0)))
    out_shape.append(jax.ShapeDtypeStruct((p.b, p.lp // p.sub, p.dp, p.np_), F32))
  args = [up, deltap] + ([zp] if has_z else []) + [Ap, Bp, Cp, Dp, biasp, h, s]
  outs = pl.pallas_call(
      functools.partial(_fwd_out_kernel, p=p, softplus=delta_softplus, has_z=has_z, save=save_residuals),
      grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      interpret=interpret, compiler_params=_params(p), name="selective_scan_fwd",
  )(*args)
  out, last = outs[0][:, : p.l, : p.d], outs[1][:, : p.d, : p.n]
  residuals = (s, outs[2]) if save_residuals else None
  return out, last, residuals


# ---------------------------------------------------------------------------------------------- backward


def _bwd_local_kernel(*refs, p: _Plan, softplus: bool, has_z: bool):
  """Backward pass 1: reverse scan of dx inside the chunk from zero; writes a_first * dx_first."""
  refs = list(refs)
  delta_ref = refs.pop(0)
  z_ref = refs.pop(0) if has_z else None
  dout_ref, a_ref, c_ref, bias_ref, p_ref = refs
  A = a_ref[...]
  bias = bias_ref[...]
  t0 = pl.program_id(2) * p.chunk

  def step(i, r):
    t = p.chunk - 1 - i
    d = _delta(delta_ref[0, t, :].astype(F32), bias, softplus, t0 + t < p.l)
    g = dout_ref[0, t, :].astype(F32)
    if has_z:
      zz = z_ref[0, t, :].astype(F32)
      g = g * zz * jax.nn.sigmoid(zz)
    dx = g[:, None] * c_ref[0, t, :].astype(F32)[None, :] + r
    return jnp.exp(d[:, None] * A) * dx

  p_ref[0, 0, :, :] = jax.lax.fori_loop(0, p.chunk, step, jnp.zeros((p.bd_bwd, p.np_), F32))


def _bwd_kernel(*refs, p: _Plan, softplus: bool, has_z: bool):
  """Backward pass 2: incoming carry, then sub-chunks in reverse with in-register recompute."""
  refs = list(refs)
  u_ref, delta_ref = refs.pop(0), refs.pop(0)
  z_ref = refs.pop(0) if has_z else None
  (dout_ref, a_ref, b_ref, c_ref, dskip_ref, bias_ref, bnd_ref, pc_ref, s_ref, dlast_ref) = refs[:10]
  refs = refs[10:]
  du_ref, ddelta_ref = refs.pop(0), refs.pop(0)
  dz_ref = refs.pop(0) if has_z else None
  db_ref, dc_ref, da_ref, dd_ref, dbias_ref = refs
  A = a_ref[...]
  bias = bias_ref[...]
  dskip = dskip_ref[...]
  c = pl.program_id(2)
  t0 = c * p.chunk

  def fold(i, r):
    k = p.nc - 1 - i
    return pc_ref[0, k, :, :] + jnp.exp(s_ref[0, k, :][:, None] * A) * r

  r = jax.lax.fori_loop(0, p.nc - 1 - c, fold, dlast_ref[0, :, :])

  def sub_chunk(i, carry):
    r, dA, dD, dbias = carry
    sc = p.chunk // p.sub - 1 - i
    base = sc * p.sub
    x = bnd_ref[0, sc, :, :]
    xs, aa, dd_, raw_, uu_, bb_ = [x], [], [], [], [], []
    for k in range(p.sub):  # recompute the sub-chunk's states (static unroll, registers)
      t = base + k
      raw = delta_ref[0, t, :].astype(F32) + bias
      d = _delta(raw, 0.0, softplus, t0 + t < p.l)
      uu = u_ref[0, t, :].astype(F32)
      bb = b_ref[0, t, :].astype(F32)
      a = jnp.exp(d[:, None] * A)
      x = a * x + (d * uu)[:, None] * bb[None, :]
      xs.append(x)
      aa.append(a)
      dd_.append(d)
      raw_.append(raw)
      uu_.append(uu)
      bb_.append(bb)
    for k in reversed(range(p.sub)):  # walk back through them
      t = base + k
      d, uu, bb, a = dd_[k], uu_[k], bb_[k], aa[k]
      cc = c_ref[0, t, :].astype(F32)
      g = dout_ref[0, t, :].astype(F32)
      if has_z:
        zz = z_ref[0, t, :].astype(F32)
        sg = jax.nn.sigmoid(zz)
        y = jnp.sum(xs[k + 1] * cc[None, :], axis=1) + dskip * uu
        dz_ref[0, t, :] = (g * y * sg * (1.0 + zz * (1.0 - sg))).astype(dz_ref.dtype)
        g = g * zz * sg
      dD = dD + g * uu
      dc_ref[0, 0, t, :] = jnp.sum(g[:, None] * xs[k + 1], axis=0)
      dx = g[:, None] * cc[None, :] + r
      dxa = dx * xs[k] * a
      dA = dA + dxa * d[:, None]
      dxb = jnp.sum(dx * bb[None, :], axis=1)
      ddl = jnp.sum(dxa * A, axis=1) + dxb * uu
      du_ref[0, t, :] = (g * dskip + d * dxb).astype(du_ref.dtype)
      db_ref[0, 0, t, :] = jnp.sum(dx * (d * uu)[:, None], axis=0)
      if softplus:
        ddl = ddl * jax.nn.sigmoid(raw_[k])
      ddl = jnp.where(t0 + t < p.l, ddl, 0.0)
      ddelta_ref[0, t, :] = ddl.astype(ddelta_ref.dtype)
      dbias = dbias + ddl
      r = a * dx
    return r, dA, dD, dbias

  zeros_d = jnp.zeros((p.bd_bwd,), F32)
  init = (r, jnp.zeros((p.bd_bwd, p.np_), F32), zeros_d, zeros_d)
  _, dA, dD, dbias = jax.lax.fori_loop(0, p.chunk // p.sub, sub_chunk, init)
  da_ref[0, 0, :, :] = dA
  dd_ref[0, 0, :] = dD
  dbias_ref[0, 0, :] = dbias


def backward(u, delta, A, B, C, D, z, delta_bias, residuals, dout, dlast, *, delta_softplus, block_sizes=None,
             interpret=False):
  """Gradients of the selective scan (see the module docstring).

  Returns:
    (du, ddelta, dA, dB, dC, dD, dz or None, ddelta_bias) shaped like the inputs (du, ddelta, dz in the
    input dtype, the rest float32).
  """
  p = plan(u.shape, A.shape[1], block_sizes)
  s, bnd = residuals
  has_z = z is not None
  up, deltap, zp = (_pad_to(x, (p.b, p.lp, p.dp)) for x in (u, delta, z))
  doutp = _pad_to(dout, (p.b, p.lp, p.dp))
  Ap = _pad_to(A.astype(F32), (p.dp, p.np_))
  Bp, Cp = (_pad_to(x, (p.b, p.lp, p.np_)) for x in (B, C))
  Dp, biasp = (_pad_to(x.astype(F32), (p.dp,)) for x in (D, delta_bias))
  dlastp = _pad_to(dlast.astype(F32), (p.b, p.dp, p.np_))
  bd, nd = p.bd_bwd, p.dp // p.bd_bwd
  grid = (p.b, nd, p.nc)
  seq = pl.BlockSpec((1, p.chunk, bd), lambda i, j, c: (i, c, j))
  state_seq = pl.BlockSpec((1, p.chunk, p.np_), lambda i, j, c: (i, c, 0))
  a_spec = pl.BlockSpec((bd, p.np_), lambda i, j, c: (j, 0))
  vec = pl.BlockSpec((bd,), lambda i, j, c: (j,))
  chunk_state = pl.BlockSpec((1, 1, bd, p.np_), lambda i, j, c: (i, c, j, 0))
  chunk_vec = pl.BlockSpec((1, 1, bd), lambda i, j, c: (i, c, j))

  pc = pl.pallas_call(
      functools.partial(_bwd_local_kernel, p=p, softplus=delta_softplus, has_z=has_z),
      grid=grid,
      in_specs=[seq] + ([seq] if has_z else []) + [seq, a_spec, state_seq, vec],
      out_specs=chunk_state,
      out_shape=jax.ShapeDtypeStruct((p.b, p.ncp, p.dp, p.np_), F32),
      interpret=interpret, compiler_params=_params(p), name="selective_scan_bwd_local",
  )(*([deltap] + ([zp] if has_z else []) + [doutp, Ap, Cp, biasp]))

  nsub = p.chunk // p.sub
  in_specs = [seq, seq] + ([seq] if has_z else []) + [
      seq, a_spec, state_seq, state_seq, vec, vec,
      pl.BlockSpec((1, nsub, bd, p.np_), lambda i, j, c: (i, c, j, 0)),
      pl.BlockSpec((1, p.ncp, bd, p.np_), lambda i, j, c: (i, 0, j, 0)),
      pl.BlockSpec((1, p.ncp, bd), lambda i, j, c: (i, 0, j)),
      pl.BlockSpec((1, bd, p.np_), lambda i, j, c: (i, j, 0))]
  partial_bc = pl.BlockSpec((1, 1, p.chunk, p.np_), lambda i, j, c: (i, j, c, 0))
  out_specs = [seq, seq] + ([seq] if has_z else []) + [partial_bc, partial_bc, chunk_state, chunk_vec, chunk_vec]
  seq_shape = jax.ShapeDtypeStruct((p.b, p.lp, p.dp), u.dtype)
  out_shape = [seq_shape, seq_shape] + ([seq_shape] if has_z else []) + [
      jax.ShapeDtypeStruct((p.b, nd, p.lp, p.np_), F32), jax.ShapeDtypeStruct((p.b, nd, p.lp, p.np_), F32),
      jax.ShapeDtypeStruct((p.b, p.ncp, p.dp, p.np_), F32), jax.ShapeDtypeStruct((p.b, p.ncp, p.dp), F32),
      jax.ShapeDtypeStruct((p.b, p.ncp, p.dp), F32)]
  args = [up, deltap] + ([zp] if has_z else []) + [doutp, Ap, Bp, Cp, Dp, biasp, bnd, pc, s, dlastp]
  outs = list(pl.pallas_call(
      functools.partial(_bwd_kernel, p=p, softplus=delta_softplus, has_z=has_z),
      grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      interpret=interpret, compiler_params=_params(p), name="selective_scan_bwd",
  )(*args))
  du, ddelta = outs.pop(0), outs.pop(0)
  dz = outs.pop(0) if has_z else None
  db, dc, da, dd, dbias = outs
  cut = lambda x: x[:, : p.l, : p.d]  # noqa: E731
  nc = p.nc
  return (cut(du), cut(ddelta), da[:, :nc].sum((0, 1))[: p.d, : p.n], db.sum(1)[:, : p.l, : p.n],
          dc.sum(1)[:, : p.l, : p.n], dd[:, :nc].sum((0, 1))[: p.d], None if dz is None else cut(dz),
          dbias[:, :nc].sum((0, 1))[: p.d])
