"""Pallas kernel of the fused SWING walk step (GPU: Triton lowering; CPU: Pallas interpreter).

Grid over blocks of `block_walkers` walkers. Each program gathers its walkers' feature rows from the
(N, m) table, draws the m Gumbel variables from the counter-based hash (no random tensor is read from
memory), takes the Gumbel-max feature, binary-searches the feature's CDF row for the node (log2 N gathers),
applies the defensive mixture, evaluates q(u | v) from the two feature rows (O(m)) and the true implicit
weight from the two feature vectors x (O(d)), and writes (next node, new load, q, feature). Everything
between the gathers stays in registers: the unfused reference materialises (walkers, m) logits, Gumbels and
two gathered feature blocks in memory.

Tables are padded to powers of two for Triton (extra features get log-weight -inf and are never chosen;
extra nodes are never addressed; extra coordinates are zero).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

from jaxlab.kernels.gumbel_rf.reference import hash_uniform, weight_profile


def _pow2(x: int) -> int:
  return 1 << max(int(x) - 1, 0).bit_length()


def _logsumexp(x, axis):
  mx = jnp.max(x, axis=axis, keepdims=True)
  return jnp.log(jnp.sum(jnp.exp(x - mx), axis=axis)) + jnp.squeeze(mx, axis)


def _kernel(ctr_ref, cur_ref, load_ref, wid_ref, lphi_ref, logs_ref, cdf_ref, x_ref,
            nxt_ref, newload_ref, q_ref, feat_ref, *, n, m, mp, kind, bandwidth, eps, sharpness, scale, lam, p_halt):
  seed = ctr_ref[0]
  step = ctr_ref[1]
  cur = cur_ref[...]
  wid = wid_ref[...].astype(jnp.uint32)
  log_s = logs_ref[...]
  lphi_v = lphi_ref[cur, :]                                                  # (bw, mp) gather
  slots = jax.lax.broadcasted_iota(jnp.uint32, (1, mp), 1)
  g = -jnp.log(-jnp.log(hash_uniform(seed, step, wid[:, None], slots)))
  feat = jnp.argmax(lphi_v + log_s[None, :] + g, axis=1).astype(jnp.int32)
  u = hash_uniform(seed, step, wid, jnp.uint32(m))

  def search(_, bounds):
    lo, hi = bounds
    mid = (lo + hi) // 2
    below = cdf_ref[feat, mid] < u
    return jnp.where(below, mid + 1, lo), jnp.where(below, hi, mid)

  lo0 = jnp.zeros_like(cur)
  lo, _ = jax.lax.fori_loop(0, max(1, math.ceil(math.log2(n + 1))), search, (lo0, lo0 + n))
  u_rf = jnp.minimum(lo, n - 1)
  use_rf = hash_uniform(seed, step, wid, jnp.uint32(m + 1)) < lam
  u_unif = jnp.minimum((hash_uniform(seed, step, wid, jnp.uint32(m + 2)) * n).astype(jnp.int32), n - 1)
  nxt = jnp.where(use_rf, u_rf, u_unif)
  lphi_u = lphi_ref[nxt, :]
  log_num = _logsumexp(lphi_v + lphi_u, axis=1)
  log_den = _logsumexp(lphi_v + log_s[None, :], axis=1)
  q = lam * jnp.exp(log_num - log_den) + (1.0 - lam) / n
  diff = x_ref[cur, :] - x_ref[nxt, :]
  w = scale * weight_profile(jnp.sum(diff * diff, axis=1), kind, bandwidth, eps, sharpness)
  w = jnp.where(nxt == cur, 0.0, w)
  nxt_ref[...] = nxt
  newload_ref[...] = load_ref[...] * w / ((1.0 - p_halt) * q)
  q_ref[...] = q
  feat_ref[...] = feat


def walk_step(cur, load, walker_ids, seed, step, log_phi, log_s, cdf, x, *, kind="rbf", bandwidth=1.0, eps=1.0,
              sharpness=0.1, scale=1.0, lam=0.8, p_halt=0.5, block_walkers=128, interpret=False, num_warps=4):
  """Pallas version of `reference.walk_step_ref` (same arguments and outputs)."""
  n, m = log_phi.shape
  d = x.shape[1]
  w = cur.shape[0]
  bw = min(_pow2(block_walkers), _pow2(w))
  wp = -(-w // bw) * bw
  np_, mp, dp = _pow2(n), _pow2(m), _pow2(d)
  pad1 = lambda a, size, v=0: jnp.pad(a, (0, size - a.shape[0]), constant_values=v)  # noqa: E731
  curp, loadp, widp = pad1(cur.astype(jnp.int32), wp), pad1(load.astype(jnp.float32), wp), pad1(walker_ids.astype(jnp.int32), wp)
  lphi = jnp.pad(log_phi.astype(jnp.float32), ((0, np_ - n), (0, mp - m)), constant_values=-jnp.inf)
  logs = pad1(log_s.astype(jnp.float32), mp, -jnp.inf)
  cdfp = jnp.pad(cdf.astype(jnp.float32), ((0, mp - m), (0, np_ - n)), constant_values=1.0)
  xp = jnp.pad(x.astype(jnp.float32), ((0, np_ - n), (0, dp - d)))
  ctr = jnp.stack([jnp.asarray(seed, jnp.uint32), jnp.asarray(step, jnp.uint32)])
  blk = pl.BlockSpec((bw,), lambda i: (i,))
  full = lambda shape: pl.BlockSpec(shape, lambda i: (0,) * len(shape))  # noqa: E731
  kern = functools.partial(_kernel, n=n, m=m, mp=mp, kind=kind, bandwidth=float(bandwidth), eps=float(eps),
                           sharpness=float(sharpness), scale=float(scale), lam=float(lam), p_halt=float(p_halt))
  outs = pl.pallas_call(
      kern, grid=(wp // bw,),
      in_specs=[full((2,)), blk, blk, blk, full((np_, mp)), full((mp,)), full((mp, np_)), full((np_, dp))],
      out_specs=[blk, blk, blk, blk],
      out_shape=[jax.ShapeDtypeStruct((wp,), jnp.int32), jax.ShapeDtypeStruct((wp,), jnp.float32),
                 jax.ShapeDtypeStruct((wp,), jnp.float32), jax.ShapeDtypeStruct((wp,), jnp.int32)],
      interpret=interpret, compiler_params=pltr.CompilerParams(num_warps=num_warps, num_stages=1),
      name="swing_gumbel_rf_step",
  )(ctr, curp, loadp, widp, lphi, logs, cdfp, xp)
  return tuple(o[:w] for o in outs)
