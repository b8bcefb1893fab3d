"""Robust reward estimators over fixed-capacity per-pair reward histories (jit- and vmap-able).

Two forms of the same estimators:

* Pure functions of one padded history `h_c` (C,) float32 holding `n` valid samples in arrival order
  (`history_mean`, `history_median`, `trimmed_mean`, `median_of_means`): a readable, sort-based spec.
* `RewardHistory`, an incremental per-(s, a) structure for use inside a `lax.scan`: each `push` keeps the
  time-ordered buffer, the sorted history, the sorted second half Z' and the sorted block means up to date
  in O(C) (insertion / deletion by a masked shift, no sort), and `estimates` reads every estimator of one
  pair in O(C). A full sort per step is ~100x slower than this on CPU. Tests check both forms against
  numpy / scipy and against each other.

Estimators (all use only the first C samples of a pair once its history is full; `mean` uses all):

* mean: the sample mean (vanilla, not robust: one reward of size M moves it by M / n).
* median: the sample median (the average of the two middle order statistics for even n).
* trimmed mean (Lugosi & Mendelson 2021, univariate): split the n samples in arrival order into
  Z = the first floor(n / 2) and Z' = the remaining m = n - floor(n / 2); with
  zeta = eps_factor * epsilon + log_factor * log(4 / delta) / n, take alpha, beta as the floor(zeta m)-th
  and ceil((1 - zeta) m)-th smallest of Z' (1-based; at least the 1st), and return mean_i clip(Z_i, alpha,
  beta). [reconstructed] When zeta >= 1/2 the two order statistics cross; we then use the median of Z' for
  both, so the estimate is the median of Z'. With n = 1 (Z empty) it is the single sample.
* median of means: the median of the means of consecutive blocks of `block` samples (complete blocks only;
  the mean of the samples when no block is complete). [reconstructed] A fixed block size keeps the block
  means append-only; `mom_block_size` picks block = floor(1 / (4 epsilon)) (at most `max_block`) so that an
  epsilon-fraction of corrupted samples spoils at most a quarter of the blocks.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

ESTIMATORS = ("vanilla", "mean", "median", "mom", "trimmed", "trimmed_known")
"""Names understood by `RewardHistory.estimates`: vanilla = the raw latest reward (standard Q-learning),
trimmed_known = the trimmed mean clipped to a known range of mean rewards (Robust Async-Q with prior
knowledge of the reward statistics); trimmed uses data-driven thresholds only (Robust Async-RAQ)."""


# ------------------------------------------------------------------------------------------ pure functions


def _valid(h_c, n):
  return jnp.arange(h_c.shape[-1]) < n


def history_mean(h_c: jax.Array, n: jax.Array) -> jax.Array:
  """Mean of the first n entries of h_c (C,) (n >= 1)."""
  return jnp.sum(jnp.where(_valid(h_c, n), h_c, 0.0)) / jnp.maximum(n, 1)


def _sorted_prefix(h_c, n):
  return jnp.sort(jnp.where(_valid(h_c, n), h_c, jnp.inf))


def _median_sorted(s_c, n):
  return 0.5 * (s_c[jnp.maximum(n - 1, 0) // 2] + s_c[n // 2])


def history_median(h_c: jax.Array, n: jax.Array) -> jax.Array:
  """Median of the first n entries of h_c (C,) (n >= 1; mean of the two middle values for even n)."""
  return _median_sorted(_sorted_prefix(h_c, n), n)


def trim_level(n, epsilon, delta, eps_factor: float = 8.0, log_factor: float = 24.0):
  """zeta = eps_factor * epsilon + log_factor * log(4 / delta) / n (float32)."""
  return eps_factor * epsilon + log_factor * math.log(4.0 / delta) / jnp.maximum(n, 1).astype(jnp.float32)


def trim_indices(m, zeta):
  """0-based indices (lo, hi) of alpha and beta in the sorted m-sample half Z'.

  lo = max(floor(zeta m), 1) - 1 and hi = ceil((1 - zeta) m) - 1, both replaced by the lower median index
  (m - 1) // 2 when they cross (zeta >= 1/2 or rounding).
  """
  mf = m.astype(jnp.float32)
  lo = jnp.maximum(jnp.floor(zeta * mf).astype(jnp.int32), 1) - 1
  hi = jnp.ceil((1.0 - zeta) * mf - 1e-4).astype(jnp.int32) - 1
  mid = jnp.maximum(m - 1, 0) // 2
  cross = (lo > hi) | (hi < 0)
  return jnp.where(cross, mid, lo), jnp.where(cross, mid, jnp.minimum(hi, m - 1))


def trimmed_mean(h_c: jax.Array, n: jax.Array, epsilon, delta: float, eps_factor: float = 8.0,
                 log_factor: float = 24.0) -> jax.Array:
  """Lugosi-Mendelson univariate trimmed mean of the first n entries of h_c (C,) (see the module docstring).

  Args:
    h_c: (C,) float32 samples in arrival order.
    n: () int32 number of valid samples (1 <= n <= C).
    epsilon: () corruption fraction the estimator guards against.
    delta: failure probability in the threshold.
    eps_factor: multiplier of epsilon in zeta (8 in Lugosi & Mendelson).
    log_factor: multiplier of log(4 / delta) / n in zeta.

  Returns:
    () float32 estimate.
  """
  idx = jnp.arange(h_c.shape[-1])
  half = n // 2
  m = n - half
  z2 = jnp.sort(jnp.where((idx >= half) & (idx < n), h_c, jnp.inf))
  lo, hi = trim_indices(m, trim_level(n, epsilon, delta, eps_factor, log_factor))
  return _clipped_mean(h_c, half, z2[lo], z2[hi], z2[0])


def _clipped_mean(h_c, half, a, b, single):
  idx = jnp.arange(h_c.shape[-1])
  total = jnp.sum(jnp.where(idx < half, jnp.clip(h_c, a, b), 0.0))
  return jnp.where(half > 0, total / jnp.maximum(half, 1), single)


def median_of_means(h_c: jax.Array, n: jax.Array, block: jax.Array) -> jax.Array:
  """Median of the means of the complete blocks of `block` consecutive samples among the first n of h_c.

  Args:
    h_c: (C,) float32 samples in arrival order.
    n: () int32 number of valid samples (>= 1).
    block: () int32 block size (>= 1).

  Returns:
    () float32 estimate (the plain mean of the n samples when n < block).
  """
  c = h_c.shape[-1]
  k = n // block
  idx = jnp.arange(c)
  seg = jnp.where(idx < k * block, idx // block, c)  # samples past the last complete block are dropped
  means = jax.ops.segment_sum(h_c, seg, num_segments=c + 1)[:c] / block.astype(jnp.float32)
  means = jnp.sort(jnp.where(idx < k, means, jnp.inf))
  return jnp.where(k > 0, _median_sorted(means, k), history_mean(h_c, n))


def mom_block_size(epsilon, max_block: int) -> jax.Array:
  """Block size floor(1 / (4 epsilon)) clipped to [1, max_block] (max_block when epsilon = 0); int32."""
  b = jnp.floor(0.25 / jnp.maximum(jnp.asarray(epsilon, jnp.float32), 1e-12))
  return jnp.clip(b, 1, max_block).astype(jnp.int32)


# ------------------------------------------------------------------------------------ incremental history


def sorted_insert(row_c: jax.Array, x: jax.Array) -> jax.Array:
  """Inserts x into an ascending row padded with +inf (the last entry, +inf, drops out); O(C)."""
  pos = jnp.sum(row_c < x)
  idx = jnp.arange(row_c.shape[-1])
  shifted = jnp.concatenate([row_c[:1], row_c[:-1]])
  return jnp.where(idx < pos, row_c, jnp.where(idx == pos, x, shifted))


def sorted_remove(row_c: jax.Array, x: jax.Array) -> jax.Array:
  """Removes one occurrence of x (which must be present) from an ascending +inf-padded row; O(C)."""
  pos = jnp.sum(row_c < x)
  idx = jnp.arange(row_c.shape[-1])
  shifted = jnp.concatenate([row_c[1:], jnp.full((1,), jnp.inf, row_c.dtype)])
  return jnp.where(idx < pos, row_c, shifted)


class RewardHistory(NamedTuple):
  """Per-(s, a) reward histories with the sorted views the robust estimators need (P = S * A pairs).

  Attributes:
    buf: (P, C) float32 rewards in arrival order (first C per pair; unused slots 0).
    sorted_all: (P, C) float32 the same samples ascending, +inf padded.
    sorted_z2: (P, C) float32 the second half Z' (arrival positions floor(n/2)..n-1) ascending, +inf padded.
    blocks: (P, C) float32 means of the complete blocks ascending, +inf padded.
    count: (P,) int32 samples seen (may exceed C; the buffers then stay frozen).
    total: (P,) float32 sum of all samples seen (for the plain mean).
    block_sum: (P,) float32 sum of the current incomplete block.
  """
  buf: jax.Array
  sorted_all: jax.Array
  sorted_z2: jax.Array
  blocks: jax.Array
  count: jax.Array
  total: jax.Array
  block_sum: jax.Array

  @staticmethod
  def create(num_pairs: int, capacity: int, names: Sequence[str] = ESTIMATORS) -> "RewardHistory":
    """Empty histories for `num_pairs` pairs of `capacity` samples each.

    Views that none of `names` reads are allocated with width 1 and never updated (saves memory and time:
    buf and sorted_z2 serve the trimmed means, sorted_all the median, blocks the median of means).
    """
    trim = "trimmed" in names or "trimmed_known" in names
    width = lambda used: capacity if used else 1  # noqa: E731
    inf = lambda used: jnp.full((num_pairs, width(used)), jnp.inf, jnp.float32)  # noqa: E731
    zeros = jnp.zeros((num_pairs,), jnp.float32)
    return RewardHistory(jnp.zeros((num_pairs, width(trim)), jnp.float32), inf("median" in names), inf(trim),
                         inf("mom" in names), jnp.zeros((num_pairs,), jnp.int32), zeros, zeros)

  @property
  def capacity(self) -> int:
    return max(self.buf.shape[-1], self.sorted_all.shape[-1], self.blocks.shape[-1])

  def push(self, p: jax.Array, x: jax.Array, block: jax.Array, names: Sequence[str] = ESTIMATORS) -> "RewardHistory":
    """Appends reward x to pair p (the sorted views are updated in O(C) while the buffer has room).

    Args:
      p: () int32 pair index s * A + a.
      x: () float32 reward.
      block: () int32 median-of-means block size.
      names: the estimators that will be read (static); other views are left untouched.
    """
    c = self.capacity
    n = self.count[p]
    room = n < c
    new_n = n + 1
    inf = jnp.float32(jnp.inf)
    # Inserting or removing +inf is a no-op on a +inf-padded row, which keeps full histories frozen
    # without a select over whole rows.
    x_in = jnp.where(room, x, inf)
    out = self._replace(count=self.count.at[p].add(1), total=self.total.at[p].add(x))
    if "trimmed" in names or "trimmed_known" in names:
      buf_row = self.buf[p]
      # Z' loses its oldest element buf[n // 2] when the split point floor(n / 2) moves (n odd -> n + 1 even).
      moves = room & ((new_n // 2) > (n // 2))
      leaving = jnp.where(moves, buf_row[jnp.minimum(n // 2, c - 1)], inf)
      slot = jnp.minimum(n, c - 1)
      out = out._replace(buf=self.buf.at[p, slot].set(jnp.where(room, x, buf_row[slot])),
                         sorted_z2=self.sorted_z2.at[p].set(sorted_insert(sorted_remove(self.sorted_z2[p], leaving),
                                                                          x_in)))
    if "median" in names:
      out = out._replace(sorted_all=self.sorted_all.at[p].set(sorted_insert(self.sorted_all[p], x_in)))
    if "mom" in names:
      bsum = self.block_sum[p] + x
      full_block = room & ((new_n % block) == 0)
      blk = sorted_insert(self.blocks[p], jnp.where(full_block, bsum / block.astype(jnp.float32), inf))
      out = out._replace(blocks=self.blocks.at[p].set(blk), block_sum=self.block_sum.at[p].set(
          jnp.where(room, jnp.where(full_block, 0.0, bsum), self.block_sum[p])))
    return out

  def estimates(self, p: jax.Array, last: jax.Array, names: Sequence[str], epsilon: jax.Array, block: jax.Array,
                delta: float, eps_factor: float = 8.0, log_factor: float = 24.0,
                known_range: tuple[float, float] = (0.0, 1.0)) -> jax.Array:
    """Every requested estimator of pair p's reward mean (after at least one push to p).

    Args:
      p: () int32 pair index.
      last: () float32 the latest reward of the pair (the `vanilla` estimate).
      names: estimator names (a subset of ESTIMATORS), static.
      epsilon: () corruption level the trimmed mean guards against.
      block: () int32 median-of-means block size (the one used by `push`).
      delta: trimmed-mean failure probability.
      eps_factor, log_factor: trimmed-mean threshold constants (see `trim_level`).
      known_range: (low, high) range of mean rewards for `trimmed_known`.

    Returns:
      (len(names),) float32.
    """
    n = jnp.minimum(self.count[p], self.capacity)
    out = {}
    if "vanilla" in names:
      out["vanilla"] = last
    if "mean" in names:
      out["mean"] = self.total[p] / jnp.maximum(self.count[p], 1).astype(jnp.float32)
    if "median" in names:
      out["median"] = _median_sorted(self.sorted_all[p], n)
    if "mom" in names:
      k = n // block
      # With no complete block, n < block <= C, so the history holds every sample: use the running mean.
      partial = self.total[p] / jnp.maximum(self.count[p], 1).astype(jnp.float32)
      out["mom"] = jnp.where(k > 0, _median_sorted(self.blocks[p], k), partial)
    if "trimmed" in names or "trimmed_known" in names:
      z2 = self.sorted_z2[p]
      half = n // 2
      lo, hi = trim_indices(n - half, trim_level(n, epsilon, delta, eps_factor, log_factor))
      tm = _clipped_mean(self.buf[p], half, z2[lo], z2[hi], z2[0])
      out["trimmed"] = tm
      out["trimmed_known"] = jnp.clip(tm, known_range[0], known_range[1])
    unknown = [k for k in names if k not in ESTIMATORS]
    if unknown:
      raise ValueError(f"unknown reward estimator(s) {unknown}; known: {ESTIMATORS}")
    return jnp.stack([out[k] for k in names]).astype(jnp.float32)
