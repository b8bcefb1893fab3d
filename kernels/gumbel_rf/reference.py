"""Pure-JAX reference of the fused SWING walk step (the spec the Pallas kernel is tested against).

For a batch of walkers at nodes v with loads l, one step:

  1. feature logits   z_r = log phi_r(x_v) + log S_r,  S = sum_u phi(x_u)    (r = 1..m)
  2. Gumbel-max       r* = argmax_r z_r + g_r,  g_r = -log(-log U_r)       (P(r*) = phi_r(x_v) S_r / phi(x_v).S)
  3. node draw        u_rf = inverse CDF of p_r*(u) = phi_r*(x_u) / S_r* at a uniform U
  4. defensive mix    u = u_rf with probability lam, else a uniform node
  5. proposal prob    q(u | v) = lam phi(x_v).phi(x_u) / phi(x_v).S + (1 - lam) / N
  6. load update      l' = l * W(x_v, x_u) / ((1 - p_halt) q(u | v))   with the TRUE implicit weight W
                      (0 for u = v: no self-loops)

Randomness is a counter-based hash of (seed, step, walker id, slot), so the reference, the interpreted and
the compiled kernel draw identical bits from the same seed, whatever the batch split or device.
Slots: 0..m-1 feature Gumbels, m node uniform, m+1 mixing uniform, m+2 uniform-node uniform.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

KINDS = ("rbf", "eps", "smooth_step")


def _fmix32(h):
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def hash_uniform(seed, step, walker, slot):
  """Uniform in (0, 1) from a murmur3-style hash of four uint32 counters (broadcasting)."""
  h = _fmix32(jnp.asarray(seed, jnp.uint32) ^ (jnp.asarray(step, jnp.uint32) * jnp.uint32(0x9E3779B9)))
  h = _fmix32(h ^ (jnp.asarray(walker, jnp.uint32) * jnp.uint32(0x85EBCA6B)))
  h = _fmix32(h ^ (jnp.asarray(slot, jnp.uint32) * jnp.uint32(0xC2B2AE35) + jnp.uint32(0x27D4EB2F)))
  return ((h >> 8).astype(jnp.float32) + 0.5) * (1.0 / 16777216.0)


def weight_profile(sq_dist, kind: str, bandwidth: float, eps: float, sharpness: float):
  """Unscaled i-graph weight as a function of squared distance (see jaxlab.graphs.igraph)."""
  if kind == "rbf":
    return jnp.exp(-sq_dist / (2.0 * bandwidth * bandwidth))
  dist = jnp.sqrt(jnp.maximum(sq_dist, 0.0))
  if kind == "eps":
    return jnp.where(dist <= eps, 1.0, 0.0)
  return jax.nn.sigmoid((eps - dist) / sharpness)


def inverse_cdf(cdf, rows, u):
  """Smallest index j with cdf[rows, j] >= u, by binary search (log2 N gathers; no (walkers, N) array)."""
  n = cdf.shape[1]

  def body(_, bounds):
    lo, hi = bounds
    mid = (lo + hi) // 2
    below = cdf[rows, mid] < u
    return jnp.where(below, mid + 1, lo), jnp.where(below, hi, mid)

  lo = jnp.zeros(rows.shape, jnp.int32)
  lo, _ = jax.lax.fori_loop(0, max(1, math.ceil(math.log2(n + 1))), body, (lo, lo + n))
  return lo


def walk_step_ref(cur, load, walker_ids, seed, step, log_phi, log_s, cdf, x, *, kind="rbf", bandwidth=1.0,
                  eps=1.0, sharpness=0.1, scale=1.0, lam=0.8, p_halt=0.5):
  """One fused SWING step for a batch of walkers.

  Args:
    cur: (W,) int32 current nodes.
    load: (W,) float32 loads.
    walker_ids: (W,) int32 global walker ids (hash counters).
    seed, step: uint32 / int32 scalars (hash counters).
    log_phi: (N, m) float32 log random features of the nodes (the proposal's linearisation).
    log_s: (m,) float32 log sum_u phi(x_u).
    cdf: (m, N) float32 per-feature CDF over nodes (rows end at 1).
    x: (N, d) float32 node features (for the true weight).
    kind, bandwidth, eps, sharpness, scale: the i-graph weight W.
    lam: defensive mixing weight of the RF proposal.
    p_halt: halting probability (the load is divided by 1 - p_halt).

  Returns:
    (next (W,) int32, new load (W,) float32, q (W,) float32, chosen feature (W,) int32).
  """
  n, m = log_phi.shape
  lphi_v = log_phi[cur]                                                        # (W, m)
  slots = jnp.arange(m, dtype=jnp.uint32)
  g = -jnp.log(-jnp.log(hash_uniform(seed, step, walker_ids[:, None], slots[None, :])))
  feat = jnp.argmax(lphi_v + log_s[None, :] + g, axis=1).astype(jnp.int32)
  u_rf = jnp.minimum(inverse_cdf(cdf, feat, hash_uniform(seed, step, walker_ids, m)), n - 1)
  use_rf = hash_uniform(seed, step, walker_ids, m + 1) < lam
  u_unif = jnp.minimum((hash_uniform(seed, step, walker_ids, m + 2) * n).astype(jnp.int32), n - 1)
  nxt = jnp.where(use_rf, u_rf, u_unif)
  log_num = jax.nn.logsumexp(lphi_v + log_phi[nxt], axis=1)
  log_den = jax.nn.logsumexp(lphi_v + log_s[None, :], axis=1)
  q = lam * jnp.exp(log_num - log_den) + (1.0 - lam) / n
  sq = jnp.sum((x[cur] - x[nxt]) ** 2, axis=1)
  w = jnp.where(nxt == cur, 0.0, scale * weight_profile(sq, kind, bandwidth, eps, sharpness))
  return nxt, load * w / ((1.0 - p_halt) * q), q, feat
