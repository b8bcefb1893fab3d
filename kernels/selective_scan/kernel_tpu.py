"""Pallas TPU (Mosaic) selective-scan kernels: forward and backward; they also run in TPU interpret mode.

Layout (batch, length, dim) as the models use it. Inside a program the state is held as h[state, dim_tile]:
channels (dim) on the 128 LANES, state on the sublanes, so every per-step update is a few full vregs of
element-wise work (state 16 x 128 channels = 2 f32 vregs). All arithmetic is float32 whatever the input
dtype (bf16 in-kernel math is not accurate enough for a long recurrence).

Forward, grid (batch, dim/block_d, length/chunk), dimension semantics ("parallel", "parallel", "arbitrary"):

  * The state h (state, block_d) is carried across the sequence tiles of one (batch, dim tile) in a VMEM
    scratch; it is zeroed on the first tile and written to the last-state output on the last tile.
  * Per tile, a vectorised prologue forms Delta = softplus(delta + delta_bias) (fused), masks the time steps
    past the true length to Delta = 0 (state unchanged: exp(0 A) = 1 and no input), and stores Delta and
    Delta * u as float32 tiles in VMEM scratch.
  * A `fori_loop` over sub-chunks of `sub_chunk` steps, each statically unrolled, runs
        h = exp(Delta_t A) * h + B_t (Delta_t u_t),     y_t = sum_state(C_t * h)
    where B_t, C_t are (state, 1) columns (the row B[t] of the (chunk, state) tile turned into a column)
    and Delta_t, u_t are (1, block_d) rows; y_t is a sublane reduction, stored as a row of a float32
    scratch. With residuals asked for, the state at the START of every sub-chunk is written to the
    residual output hs (batch, length/sub_chunk, state, dim) float32 (the only residual).
  * A vectorised epilogue forms out = (y + D u) * silu(z) for the whole tile and stores it in u's dtype.

Backward, the same grid with the sequence axis REVERSED (every sequence index_map reads tile
nk - 1 - k), block_d_bwd channels per program:

  * The state cotangent dh (state, block_d) is carried in VMEM scratch; on the first backward tile (the
    last time tile) it starts from the cotangent of the last state.
  * Per sub-chunk, walked from the last to the first: recompute its `sub_chunk` states from the saved
    boundary state into a VMEM scratch xs (sub_chunk + 1, state, block_d) (and the decays exp(Delta A) into
    another, so the walk back needs no exp), then step backwards through them:
        dh += C_t dy_t;  dC_t = sum_dim(h_t dy_t);  dB_t = sum_dim(dh Delta_t u_t)
        q = dh exp(Delta_t A) h_{t-1};  dA += q Delta_t;  dDelta_t = sum_state(q A) + u_t sum_state(dh B_t)
        du_t = D dy_t + Delta_t sum_state(dh B_t);  dh = exp(Delta_t A) dh
    with dy = dout * silu(z). dDelta goes through the softplus (times sigmoid(delta + bias)) and is
    masked past the length; dz, dD and d(delta_bias) are vectorised per tile in the epilogue.
  * dA, dD and d(delta_bias) are accumulated per (batch, dim tile) in output blocks resident across the
    sequence axis and summed over batch in XLA. dB_t and dC_t are lane reductions giving (state, 1)
    columns; each is placed at lane t of a (state, chunk) accumulator by a select, so the per-dim-tile
    partial sums are written lane-dense as (dim tiles, batch, chunks, state, chunk) and reduced over dim
    tiles in XLA. No (batch, length, dim, state) tensor is ever written to HBM.

Padding: the length to a multiple of `chunk`, the state to a multiple of 8 (zero A, B, C keep padded
states at 0) and dim to a multiple of the channel tiles (zero u, A, D; sliced off). u / delta / z / dout
are read in their own dtype (bf16 tiles are widened to float32 in VMEM once per tile; float16 is widened
in the wrapper, since Mosaic rejected float16 tiles for v5e); B and C are widened to float32 in the wrapper
(they are dim/state times smaller than u).

Tiling (`BlockSizes`; TPU defaults): block_d 128 and block_d_bwd 128 (lane multiples), chunk 128 (a
multiple of 8; shrunk to the padded length for short sequences), sub_chunk 8 (must divide chunk). The
residual costs 4 * state / sub_chunk bytes per (batch, step, channel): 8 bytes at state 16, sub_chunk 8,
i.e. 1.33x the bf16 u / delta / z; sub_chunk = chunk keeps only tile-boundary states. Tiles whose estimated
VMEM need exceeds 12 MiB get a raised `vmem_limit_bytes`; a need above 100 MiB is a ValueError.

Interpret mode (`interpret=True`) runs both kernels under `pltpu.InterpretParams()`, with the grid in order
(jax 0.10's TPU interpreter mishandles dimension semantics once `vmap` adds a grid axis).

Status: semantics tested under interpret mode on CPU; both kernels compile with Mosaic for TPU v4, v5e,
v5p and v6e topologies (libtpu's compile-only client, no hardware) at the benchmark shape; not yet timed on
a TPU.

Design source: the grid / VMEM-carry / reversed-grid structure follows apple/axlearn's Mosaic Mamba kernel
(`axlearn/common/ssm_kernels/mamba_kernels.py`, read for ideas only); the fused softplus / bias / z
gating, the sub-chunk residuals, the saved decays, the lane-dense dB/dC accumulators and the float32 VMEM
staging of bf16 tiles are this file's own. All code here is original.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxlab.kernels.selective_scan.kernel import BlockSizes

F32 = jnp.float32
LANES = 128
SUBLANES = 8
TPU_DEFAULTS = BlockSizes(block_d=128, chunk=128, sub_chunk=8, block_d_bwd=128)
_SEMANTICS = ("parallel", "parallel", "arbitrary")


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _plan(u_shape, n: int, dtype, block_sizes: BlockSizes | None):
  """Resolves block sizes against the problem size; validates them.

  Returns:
    dict with b, l, d, n (true sizes), lp, dp, np_ (padded), chunk, sub, nk (time tiles), bd, bd_bwd.
  """
  bs = block_sizes or BlockSizes()

  def get(field):
    v = getattr(bs, field)
    return getattr(TPU_DEFAULTS, field) if v is None else int(v)

  b, l, d = u_shape
  bd, bd_bwd, chunk, sub = get("block_d"), get("block_d_bwd"), get("chunk"), get("sub_chunk")
  for name, v in (("block_d", bd), ("block_d_bwd", bd_bwd)):
    if v <= 0 or v % LANES:
      raise ValueError(f"selective_scan (TPU): BlockSizes.{name}={v} must be a positive multiple of {LANES} "
                       "(channels sit on the vector lanes)")
  if chunk <= 0 or chunk % SUBLANES:
    raise ValueError(f"selective_scan (TPU): BlockSizes.chunk={chunk} must be a positive multiple of {SUBLANES}")
  if sub <= 0 or chunk % sub:
    raise ValueError(f"selective_scan (TPU): BlockSizes.sub_chunk={sub} must divide chunk={chunk}")
  # Short sequences: one tile covering the (padded) sequence; 16-bit tiles pack 16 rows per vreg.
  rows = 16 if jnp.dtype(dtype).itemsize < 4 else SUBLANES
  short = _round_up(l, math.lcm(sub, rows))
  if short < chunk:
    chunk = short
  dmax = _round_up(d, LANES)
  bd, bd_bwd = min(bd, dmax), min(bd_bwd, dmax)
  lp = _round_up(l, chunk)
  return dict(b=b, l=l, d=d, n=n, lp=lp, dp=_round_up(d, math.lcm(bd, bd_bwd)), np_=_round_up(n, SUBLANES),
              chunk=chunk, sub=sub, nk=lp // chunk, bd=bd, bd_bwd=bd_bwd)


def _pad(x, shape):
  """Zero-pads x at the end of every axis up to `shape`."""
  if tuple(x.shape) == tuple(shape):
    return x
  return jnp.pad(x, [(0, t - s) for s, t in zip(x.shape, shape)])


def _softplus(x):
  return jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x)))


def _sigmoid(x):
  return 1.0 / (1.0 + jnp.exp(-x))


def _interpret_arg(interpret: bool):
  return pltpu.InterpretParams() if interpret else False


_DEFAULT_SCOPED_VMEM = 12 * 2**20   # stay below the smallest default scoped-VMEM limit (16 MiB on v5e)
_MAX_VMEM = 100 * 2**20


def _compiler_params(vmem_estimate: int, what: str, interpret: bool):
  """Mosaic params; raises the scoped-VMEM limit only for tiles that need it (large block_d / chunk).

  Under interpret mode the grid runs in order (no dimension semantics): jax 0.10's TPU interpreter does
  not account for the grid axis that `vmap` prepends, while the Mosaic lowering does.
  """
  if vmem_estimate > _MAX_VMEM:
    raise ValueError(f"selective_scan (TPU): the {what} tiles need about {vmem_estimate / 2**20:.0f} MiB of VMEM; "
                     "use a smaller BlockSizes.block_d / block_d_bwd / chunk")
  limit = None if vmem_estimate <= _DEFAULT_SCOPED_VMEM else min(int(1.5 * vmem_estimate), _MAX_VMEM)
  return pltpu.CompilerParams(dimension_semantics=None if interpret else _SEMANTICS, vmem_limit_bytes=limit)


def _io_dtype(dtype):
  """The dtype the kernels read u / delta / z in: float16 is widened (Mosaic rejected float16 tiles on v5e)."""
  return F32 if jnp.dtype(dtype) == jnp.float16 else jnp.dtype(dtype)


def _prepare(p, u, delta, A, B, C, D, z, delta_bias):
  """Pads and lays out the inputs for the kernels.

  Returns:
    u, delta, z: (batch, lp, dp) in `_io_dtype` (z may be None); B, C: (batch, lp, np_) float32;
    A_t: (np_, dp) float32 (A transposed: channels on lanes); D, bias: (1, dp) float32.
  """
  seq = (p["b"], p["lp"], p["dp"])
  io = _io_dtype(u.dtype)
  u, delta = _pad(u.astype(io), seq), _pad(delta.astype(io), seq)
  z = None if z is None else _pad(z.astype(io), seq)
  st = (p["b"], p["lp"], p["np_"])
  B, C = _pad(B.astype(F32), st), _pad(C.astype(F32), st)
  A_t = _pad(A.astype(F32).T, (p["np_"], p["dp"]))
  D = _pad(D.astype(F32).reshape(1, -1), (1, p["dp"]))
  bias = _pad(delta_bias.astype(F32).reshape(1, -1), (1, p["dp"]))
  return u, delta, z, B, C, A_t, D, bias


def _delta_tile(delta_ref, bias_ref, tile, *, softplus, length, chunk):
  """Delta for a (chunk, block_d) tile: (pre-activation, Delta) float32; Delta = 0 past the length."""
  pre = delta_ref[...].astype(F32) + bias_ref[...]
  dt = _softplus(pre) if softplus else pre
  if length % chunk:
    rows = tile * chunk + jax.lax.broadcasted_iota(jnp.int32, dt.shape, 0)
    dt = jnp.where(rows < length, dt, 0.0)
  return pre, dt


def _column(ref, t):
  """Row t of a (chunk, state) float32 ref as a (state, 1) column."""
  return ref[t][:, None]


# --------------------------------------------------------------------------------------------- forward


def _fwd_kernel(*refs, has_z, save, softplus, length, chunk, sub, nk):
  it = iter(refs)
  u_ref, delta_ref = next(it), next(it)
  z_ref = next(it) if has_z else None
  b_ref, c_ref, a_ref, dskip_ref, bias_ref = (next(it) for _ in range(5))
  out_ref, last_ref = next(it), next(it)
  hs_ref = next(it) if save else None
  h_scr, dt_scr, dtu_scr, y_scr = (next(it) for _ in range(4))

  k = pl.program_id(2)

  @pl.when(k == 0)
  def _():
    h_scr[...] = jnp.zeros_like(h_scr)

  _, dt = _delta_tile(delta_ref, bias_ref, k, softplus=softplus, length=length, chunk=chunk)
  dt_scr[...] = dt
  dtu_scr[...] = dt * u_ref[...].astype(F32)
  a = a_ref[...]                                                     # (state, block_d)

  def sub_chunk(s, h):
    if save:
      hs_ref[s] = h
    base = pl.multiple_of(s * sub, sub)
    for j in range(sub):                                             # statically unrolled
      t = base + j
      h = jnp.exp(dt_scr[pl.ds(t, 1), :] * a) * h + _column(b_ref, t) * dtu_scr[pl.ds(t, 1), :]
      y_scr[pl.ds(t, 1), :] = jnp.sum(_column(c_ref, t) * h, axis=0, keepdims=True)
    return h

  h = jax.lax.fori_loop(0, chunk // sub, sub_chunk, h_scr[...])
  h_scr[...] = h

  uf = u_ref[...].astype(F32)
  y = y_scr[...] + dskip_ref[...] * uf
  if has_z:
    zf = z_ref[...].astype(F32)
    y = y * (zf * _sigmoid(zf))
  out_ref[...] = y.astype(out_ref.dtype)

  @pl.when(k == nk - 1)
  def _():
    last_ref[...] = h


def forward(u, delta, A, B, C, D, z, delta_bias, *, delta_softplus, block_sizes=None, interpret=False,
            save_residuals=False):
  """Selective scan forward on TPU (Mosaic) or under Pallas' TPU interpret mode.

  Args:
    u, delta: (batch, length, dim), float32/bfloat16/float16 (same dtype).
    A: (dim, state) float32.
    B, C: (batch, length, state).
    D, delta_bias: (dim,) float32 (zeros when absent).
    z: optional (batch, length, dim) gate in u's dtype, or None.
    delta_softplus: apply softplus to delta + delta_bias (inside the kernel).
    block_sizes: `BlockSizes` (None fields: TPU defaults block_d 128, chunk 128, sub_chunk 8).
    interpret: run under `pltpu.InterpretParams()` (any backend) instead of compiling with Mosaic.
    save_residuals: also return the states at every sub-chunk boundary for `backward`.

  Returns:
    out (batch, length, dim) in u's dtype; last state (batch, dim, state) float32; residuals
    (batch, padded_length/sub_chunk, padded_state, padded_dim) float32 or None.
  """
  p = _plan(u.shape, A.shape[1], u.dtype, block_sizes)
  up, dp_, zp, Bp, Cp, A_t, Dp, biasp = _prepare(p, u, delta, A, B, C, D, z, delta_bias)
  b, lp, dpad, np_, chunk, sub, nk, bd = (p[k] for k in ("b", "lp", "dp", "np_", "chunk", "sub", "nk", "bd"))
  has_z = z is not None

  seq_spec = pl.BlockSpec((None, chunk, bd), lambda i, j, k: (i, k, j))
  st_spec = pl.BlockSpec((None, chunk, np_), lambda i, j, k: (i, k, 0))
  a_spec = pl.BlockSpec((np_, bd), lambda i, j, k: (0, j))
  vec_spec = pl.BlockSpec((1, bd), lambda i, j, k: (0, j))
  in_specs = [seq_spec, seq_spec] + ([seq_spec] if has_z else []) + [st_spec, st_spec, a_spec, vec_spec, vec_spec]
  args = [up, dp_] + ([zp] if has_z else []) + [Bp, Cp, A_t, Dp, biasp]

  out_shape = [jax.ShapeDtypeStruct((b, lp, dpad), up.dtype), jax.ShapeDtypeStruct((b, np_, dpad), F32)]
  out_specs = [seq_spec, pl.BlockSpec((None, np_, bd), lambda i, j, k: (i, 0, j))]
  if save_residuals:
    out_shape.append(jax.ShapeDtypeStruct((b, lp // sub, np_, dpad), F32))
    out_specs.append(pl.BlockSpec((None, chunk // sub, np_, bd), lambda i, j, k: (i, k, 0, j)))

  kernel = functools.partial(_fwd_kernel, has_z=has_z, save=save_residuals, softplus=bool(delta_softplus),
                             length=p["l"], chunk=chunk, sub=sub, nk=nk)
  elems = b * lp * dpad
  itemsize = jnp.dtype(up.dtype).itemsize
  cost = pl.CostEstimate(flops=6 * elems * np_, transcendentals=elems * (np_ + 2),
                         bytes_accessed=(3 + has_z) * elems * itemsize + 2 * b * lp * np_ * 4
                         + (elems * np_ * 4 // sub if save_residuals else 0))
  tile, col, st = chunk * bd * 4, chunk * LANES * 4, np_ * bd * 4    # f32 bytes of one block
  isz = tile // 4 * itemsize
  buffered = (2 + has_z) * isz + 2 * col + 3 * st + isz + (chunk // sub * st if save_residuals else 0)
  vmem = 2 * buffered + st + 3 * tile + 4 * tile                     # double buffers, scratch, temporaries
  outs = pl.pallas_call(
      kernel,
      grid=(b, dpad // bd, nk),
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      scratch_shapes=[pltpu.VMEM((np_, bd), F32)] + [pltpu.VMEM((chunk, bd), F32)] * 3,
      compiler_params=_compiler_params(vmem, "forward", interpret),
      interpret=_interpret_arg(interpret),
      cost_estimate=cost,
      name="selective_scan_tpu_fwd",
  )(*args)
  out = outs[0][:, :p["l"], :p["d"]].astype(u.dtype)
  last = jnp.swapaxes(outs[1][:, :p["n"], :p["d"]], 1, 2)
  return out, last, (outs[2] if save_residuals else None)


# -------------------------------------------------------------------------------------------- backward


def _bwd_kernel(*refs, has_z, softplus, length, chunk, sub, nk):
  it = iter(refs)
  u_ref, delta_ref = next(it), next(it)
  z_ref = next(it) if has_z else None
  dout_ref, b_ref, c_ref, a_ref, dskip_ref, bias_ref, hs_ref, dlast_ref = (next(it) for _ in range(8))
  du_ref, ddelta_ref = next(it), next(it)
  dz_ref = next(it) if has_z else None
  da_ref, dd_ref, dbias_ref, db_ref, dc_ref = (next(it) for _ in range(5))
  dh_scr, xs_scr, as_scr, dt_scr, dtu_scr, dy_scr, y_scr = (next(it) for _ in range(7))

  k = pl.program_id(2)
  tile = nk - 1 - k                                                  # time tile (the grid runs backwards)

  @pl.when(k == 0)
  def _():
    dh_scr[...] = dlast_ref[...]
    da_ref[...] = jnp.zeros_like(da_ref)
    dd_ref[...] = jnp.zeros_like(dd_ref)
    dbias_ref[...] = jnp.zeros_like(dbias_ref)

  pre, dt = _delta_tile(delta_ref, bias_ref, tile, softplus=softplus, length=length, chunk=chunk)
  uf = u_ref[...].astype(F32)
  dout = dout_ref[...].astype(F32)
  if has_z:
    zf = z_ref[...].astype(F32)
    sig_z = _sigmoid(zf)
    dy = dout * (zf * sig_z)
  else:
    dy = dout
  dt_scr[...] = dt
  dtu_scr[...] = dt * uf
  dy_scr[...] = dy
  a = a_ref[...]                                                     # (state, block_d)
  np_ = a.shape[0]
  lane_t = jax.lax.broadcasted_iota(jnp.int32, (np_, chunk), 1)

  def sub_chunk(i, carry):
    dh, da_acc, db_acc, dc_acc = carry
    s = chunk // sub - 1 - i
    base = pl.multiple_of(s * sub, sub)
    x = hs_ref[s]                                                    # state before the sub-chunk
    xs_scr[0] = x
    for j in range(sub):                                             # recompute the sub-chunk's states
      t = base + j
      decay = jnp.exp(dt_scr[pl.ds(t, 1), :] * a)
      x = decay * x + _column(b_ref, t) * dtu_scr[pl.ds(t, 1), :]
      as_scr[j] = decay
      xs_scr[j + 1] = x
      y_scr[pl.ds(t, 1), :] = jnp.sum(_column(c_ref, t) * x, axis=0, keepdims=True)
    for j in reversed(range(sub)):                                   # then walk them backwards
      t = base + j
      dy_t = dy_scr[pl.ds(t, 1), :]
      dtu_t = dtu_scr[pl.ds(t, 1), :]
      b_t = _column(b_ref, t)
      decay = as_scr[j]
      dh = dh + _column(c_ref, t) * dy_t
      here = lane_t == t
      dc_acc = dc_acc + jnp.where(here, jnp.sum(xs_scr[j + 1] * dy_t, axis=1, keepdims=True), 0.0)
      db_acc = db_acc + jnp.where(here, jnp.sum(dh * dtu_t, axis=1, keepdims=True), 0.0)
      du_ref[pl.ds(t, 1), :] = jnp.sum(dh * b_t, axis=0, keepdims=True)        # sum_state(dh B_t)
      q = dh * decay * xs_scr[j]
      ddelta_ref[pl.ds(t, 1), :] = jnp.sum(q * a, axis=0, keepdims=True)      # sum_state(q A)
      da_acc = da_acc + q * dt_scr[pl.ds(t, 1), :]
      dh = dh * decay
    return dh, da_acc, db_acc, dc_acc

  zeros_st = jnp.zeros((np_, chunk), F32)
  dh, da_acc, db_acc, dc_acc = jax.lax.fori_loop(
      0, chunk // sub, sub_chunk, (dh_scr[...], jnp.zeros_like(a), zeros_st, zeros_st))
  dh_scr[...] = dh
  da_ref[...] += da_acc
  db_ref[...] = db_acc
  dc_ref[...] = dc_acc

  dskip = dskip_ref[...]
  s_bc = du_ref[...]                                                 # sum_state(dh B)
  du_ref[...] = dskip * dy + dt * s_bc
  dpost = ddelta_ref[...] + uf * s_bc
  dpre = dpost * _sigmoid(pre) if softplus else dpost
  if length % chunk:
    rows = tile * chunk + jax.lax.broadcasted_iota(jnp.int32, dpre.shape, 0)
    dpre = jnp.where(rows < length, dpre, 0.0)
  ddelta_ref[...] = dpre
  dbias_ref[...] += jnp.sum(dpre, axis=0, keepdims=True)
  dd_ref[...] += jnp.sum(dy * uf, axis=0, keepdims=True)
  if has_z:
    y = y_scr[...] + dskip * uf
    dz_ref[...] = dout * y * (sig_z * (1.0 + zf * (1.0 - sig_z)))


def backward(u, delta, A, B, C, D, z, delta_bias, residuals, dout, dlast, *, delta_softplus, block_sizes=None,
             interpret=False):
  """Selective scan backward on TPU (Mosaic) or under Pallas' TPU interpret mode.

  Args:
    u, delta, A, B, C, D, z, delta_bias: the forward's inputs (D, delta_bias float32 arrays; z may be None).
    residuals: the forward's residuals (sub-chunk boundary states).
    dout: (batch, length, dim) cotangent of out.
    dlast: (batch, dim, state) float32 cotangent of the last state.
    delta_softplus, block_sizes, interpret: as in `forward` (the same block sizes).

  Returns:
    (du, ddelta, dA, dB, dC, dD, dz or None, ddelta_bias), float32, shaped like the inputs.
  """
  p = _plan(u.shape, A.shape[1], u.dtype, block_sizes)
  up, dp_, zp, Bp, Cp, A_t, Dp, biasp = _prepare(p, u, delta, A, B, C, D, z, delta_bias)
  b, lp, dpad, np_, chunk, sub, nk, bd = (p[k] for k in ("b", "lp", "dp", "np_", "chunk", "sub", "nk", "bd_bwd"))
  if residuals.shape != (b, lp // sub, np_, dpad):
    raise ValueError(f"selective_scan (TPU): residuals of shape {residuals.shape} do not match this call's "
                     f"tiling {(b, lp // sub, np_, dpad)}; pass the forward's block_sizes to the backward")
  has_z = z is not None
  nd = dpad // bd
  doutp = _pad(dout.astype(up.dtype), (b, lp, dpad))
  dlastp = _pad(jnp.swapaxes(dlast.astype(F32), 1, 2), (b, np_, dpad))
  rev = lambda k: nk - 1 - k  # noqa: E731

  seq_spec = pl.BlockSpec((None, chunk, bd), lambda i, j, k: (i, rev(k), j))
  st_spec = pl.BlockSpec((None, chunk, np_), lambda i, j, k: (i, rev(k), 0))
  a_spec = pl.BlockSpec((np_, bd), lambda i, j, k: (0, j))
  vec_spec = pl.BlockSpec((1, bd), lambda i, j, k: (0, j))
  hs_spec = pl.BlockSpec((None, chunk // sub, np_, bd), lambda i, j, k: (i, rev(k), 0, j))
  carry_spec = pl.BlockSpec((None, np_, bd), lambda i, j, k: (i, 0, j))
  bvec_spec = pl.BlockSpec((None, 1, bd), lambda i, j, k: (i, 0, j))
  part_spec = pl.BlockSpec((None, None, None, np_, chunk), lambda i, j, k: (j, i, rev(k), 0, 0))

  in_specs = ([seq_spec, seq_spec] + ([seq_spec] if has_z else [])
              + [seq_spec, st_spec, st_spec, a_spec, vec_spec, vec_spec, hs_spec, carry_spec])
  args = [up, dp_] + ([zp] if has_z else []) + [doutp, Bp, Cp, A_t, Dp, biasp, residuals, dlastp]
  seq_f32 = jax.ShapeDtypeStruct((b, lp, dpad), F32)
  part = jax.ShapeDtypeStruct((nd, b, nk, np_, chunk), F32)
  out_shape = ([seq_f32, seq_f32] + ([seq_f32] if has_z else [])
               + [jax.ShapeDtypeStruct((b, np_, dpad), F32)] + [jax.ShapeDtypeStruct((b, 1, dpad), F32)] * 2
               + [part, part])
  out_specs = ([seq_spec, seq_spec] + ([seq_spec] if has_z else [])
               + [carry_spec, bvec_spec, bvec_spec, part_spec, part_spec])

  kernel = functools.partial(_bwd_kernel, has_z=has_z, softplus=bool(delta_softplus), length=p["l"],
                             chunk=chunk, sub=sub, nk=nk)
  elems = b * lp * dpad
  itemsize = jnp.dtype(up.dtype).itemsize
  cost = pl.CostEstimate(flops=20 * elems * np_, transcendentals=elems * (np_ + 3),
                         bytes_accessed=(4 + has_z) * elems * itemsize + (2 + has_z) * elems * 4
                         + elems * np_ * 4 // sub + 4 * nd * b * lp * np_ * 4)
  tile, col, st = chunk * bd * 4, chunk * LANES * 4, np_ * bd * 4    # f32 bytes of one block
  isz = tile // 4 * itemsize
  buffered = ((3 + has_z) * isz + 2 * col + 5 * st + chunk // sub * st + (2 + has_z) * tile
              + 2 * np_ * max(chunk, LANES) * 4)
  vmem = 2 * buffered + (2 * sub + 2) * st + 4 * tile + 6 * tile     # double buffers, scratch, temporaries
  outs = pl.pallas_call(
      kernel,
      grid=(b, nd, nk),
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      scratch_shapes=[pltpu.VMEM((np_, bd), F32), pltpu.VMEM((sub + 1, np_, bd), F32),
                      pltpu.VMEM((sub, np_, bd), F32)] + [pltpu.VMEM((chunk, bd), F32)] * 4,
      compiler_params=_compiler_params(vmem, "backward", interpret),
      interpret=_interpret_arg(interpret),
      cost_estimate=cost,
      name="selective_scan_tpu_bwd",
  )(*args)
  outs = list(outs)
  du, ddelta = outs.pop(0), outs.pop(0)
  dz = outs.pop(0) if has_z else None
  da, dd, dbias, db, dc = outs
  l, d, n = p["l"], p["d"], p["n"]
  seq = lambda x: x[:, :l, :d]  # noqa: E731

  def state_grad(partial):   # (nd, b, nk, np_, chunk) -> (b, l, n)
    g = jnp.swapaxes(jnp.sum(partial, axis=0), 2, 3).reshape(b, lp, np_)
    return g[:, :l, :n]

  return (seq(du), seq(ddelta), jnp.sum(da, axis=0)[:n, :d].T, state_grad(db), state_grad(dc),
          jnp.sum(dd, axis=(0, 1))[:d], None if dz is None else seq(dz), jnp.sum(dbias, axis=(0, 1))[:d])
