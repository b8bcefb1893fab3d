"""Calibration error of probabilistic classifiers: binned ECE (top-label, classwise, weighted), differentiable
surrogates for training (soft-binned ECE, MMCE), bootstrap intervals and reliability-diagram data.

Conventions (those of Guo et al. 2017, "On Calibration of Modern Neural Networks", and of the calibrated-MoE
code, ginawong/calibrated_moe `compute_ece`): `n_bins` equal-width bins of the confidence, bin b = (b/n, (b+1)/n]
(a confidence of exactly 0 falls in bin 0), and

    ECE = sum_b (W_b / W) |acc_b - conf_b|,   acc_b, conf_b = the weighted means of correctness / confidence in b,

with W_b the total weight in bin b. Weights make the same estimator measure calibration under a covariate shift
given by a density ratio w(x) (importance weighting), and integer weights equal repeating rows. Everything is
jittable; per-bin sums are `jax.ops.segment_sum` (one pass, no (n, bins) one-hot).

Binned ECE is biased upwards: a perfectly calibrated model has ECE > 0 of order sqrt(n_bins / n) (about 0.006 at
n = 20,000 with 15 bins); `calibrated_floor` measures it by simulation for a given confidence distribution.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


def bin_index(conf: jax.Array, n_bins: int) -> jax.Array:
  """Equal-width bin of each confidence in [0, 1]: b with b/n < conf <= (b+1)/n (0 -> bin 0)."""
  b = jnp.ceil(jnp.asarray(conf, jnp.float32) * n_bins).astype(jnp.int32) - 1
  return jnp.clip(b, 0, n_bins - 1)


class BinStats(NamedTuple):
  """Per-bin totals: weight, weighted confidence sum, weighted correctness sum (each (n_bins,))."""
  weight: jax.Array
  conf: jax.Array
  acc: jax.Array


def bin_stats(conf, correct, weights=None, n_bins: int = 15) -> BinStats:
  """Weighted per-bin sums via segment sums."""
  conf = jnp.asarray(conf, jnp.float32)
  correct = jnp.asarray(correct, jnp.float32)
  w = jnp.ones_like(conf) if weights is None else jnp.asarray(weights, jnp.float32)
  b = bin_index(conf, n_bins)
  seg = lambda v: jax.ops.segment_sum(v, b, num_segments=n_bins)  # noqa: E731
  return BinStats(seg(w), seg(w * conf), seg(w * correct))


def ece(conf, correct, weights=None, n_bins: int = 15) -> jax.Array:
  """Binned expected calibration error of confidences `conf` against 0/1 outcomes `correct` (weighted)."""
  s = bin_stats(conf, correct, weights, n_bins)
  return jnp.sum(jnp.abs(s.acc - s.conf)) / jnp.maximum(jnp.sum(s.weight), 1e-30)


def top_label(probs, labels) -> tuple[jax.Array, jax.Array]:
  """(confidence, correct): the largest class probability and whether its class is the label."""
  probs = jnp.asarray(probs)
  return jnp.max(probs, axis=-1), (jnp.argmax(probs, axis=-1) == jnp.asarray(labels)).astype(jnp.float32)


def top_label_ece(probs, labels, weights=None, n_bins: int = 15) -> jax.Array:
  """ECE of the top-label confidence (the usual "ECE" of multiclass classifiers)."""
  conf, correct = top_label(probs, labels)
  return ece(conf, correct, weights, n_bins)


def classwise_ece(probs, labels, weights=None, n_bins: int = 15) -> jax.Array:
  """Mean over classes k of the ECE of p_k against 1[y = k] (Kull et al. 2019's classwise-ECE)."""
  probs = jnp.asarray(probs, jnp.float32)
  onehot = jax.nn.one_hot(jnp.asarray(labels), probs.shape[-1], dtype=jnp.float32)
  per_class = jax.vmap(lambda p, y: ece(p, y, weights, n_bins), in_axes=(1, 1))(probs, onehot)
  return jnp.mean(per_class)


def accuracy(probs, labels, weights=None) -> jax.Array:
  """(Weighted) top-1 accuracy."""
  _, correct = top_label(probs, labels)
  w = jnp.ones_like(correct) if weights is None else jnp.asarray(weights, jnp.float32)
  return jnp.sum(w * correct) / jnp.sum(w)


# ------------------------------------------------------------------------------ differentiable surrogates


def soft_binned_ece(conf, correct, weights=None, n_bins: int = 15, temperature: float = 0.01,
                    p: int = 1) -> jax.Array:
  """Soft-binned ECE (Karandikar et al. 2021, "Soft Calibration Objectives for Neural Networks"): each
  confidence belongs to every bin with weight softmax_b(-(conf - centre_b)^2 / temperature); the L_p gap of
  the soft bins' accuracy and confidence, weighted by the bins' soft mass. Differentiable in `conf` (the
  training surrogate); tends to the binned ECE (bins at the nearest centre) as temperature -> 0."""
  conf = jnp.asarray(conf, jnp.float32)
  correct = jnp.asarray(correct, jnp.float32)
  w = jnp.ones_like(conf) if weights is None else jnp.asarray(weights, jnp.float32)
  centres = (jnp.arange(n_bins, dtype=jnp.float32) + 0.5) / n_bins
  m = jax.nn.softmax(-(conf[:, None] - centres[None, :]) ** 2 / temperature, axis=-1) * w[:, None]   # (n, bins)
  mass = jnp.sum(m, axis=0)
  gap = jnp.abs(m.T @ correct - m.T @ conf) / jnp.maximum(mass, 1e-12)
  return (jnp.sum(mass * gap ** p) / jnp.sum(w)) ** (1.0 / p)


def mmce(conf, correct, weights=None, bandwidth: float = 0.4) -> jax.Array:
  """Maximum mean calibration error (Kumar et al. 2018), Laplacian kernel k(r, r') = exp(-|r - r'| / bandwidth):

      MMCE^2 = sum_ij w_i w_j (c_i - r_i)(c_j - r_j) k(r_i, r_j) / (sum w)^2,  c = correct, r = confidence.

  Returns MMCE (the square root). O(n^2) memory: meant for minibatches."""
  r = jnp.asarray(conf, jnp.float32)
  c = jnp.asarray(correct, jnp.float32)
  w = jnp.ones_like(r) if weights is None else jnp.asarray(weights, jnp.float32)
  e = w * (c - r)
  k = jnp.exp(-jnp.abs(r[:, None] - r[None, :]) / bandwidth)
  return jnp.sqrt(jnp.maximum(e @ k @ e, 0.0)) / jnp.sum(w)


# ------------------------------------------------------------------------------ uncertainty of the estimate


@functools.partial(jax.jit, static_argnames=("n_bins", "chunk"))
def _bootstrap_draws(key, conf, correct, w, n_bins: int, chunk: int) -> jax.Array:
  """ECEs of `chunk` resamples of the rows (one compiled program per shape, reused across calls)."""
  idx = jax.random.randint(key, (chunk, conf.shape[0]), 0, conf.shape[0])
  return jax.vmap(lambda i: ece(conf[i], correct[i], w[i], n_bins))(idx)


def bootstrap_ece(key, conf, correct, weights=None, n_bins: int = 15, n_boot: int = 1000, level: float = 0.95,
                  chunk: int = 50) -> tuple[float, float, float]:
  """(ECE, lower, upper): percentile bootstrap interval over resampled rows (with their weights).

  Resamples are drawn `chunk` at a time (vmapped), so memory stays at chunk x n indices."""
  conf = jnp.asarray(conf, jnp.float32)
  correct = jnp.asarray(correct, jnp.float32)
  w = jnp.ones_like(conf) if weights is None else jnp.asarray(weights, jnp.float32)
  keys = jax.random.split(key, -(-n_boot // chunk))
  values = jnp.concatenate([_bootstrap_draws(k, conf, correct, w, n_bins, chunk) for k in keys])[:n_boot]
  alpha = (1.0 - level) / 2
  lo, hi = jnp.quantile(values, jnp.array([alpha, 1.0 - alpha]))
  return float(ece(conf, correct, w, n_bins)), float(lo), float(hi)


@functools.partial(jax.jit, static_argnames=("n_bins", "n_sims"))
def _floor_draws(key, conf, weights, n_bins: int, n_sims: int) -> jax.Array:
  return jax.lax.map(lambda k: ece(conf, jax.random.bernoulli(k, conf).astype(jnp.float32), weights, n_bins),
                     jax.random.split(key, n_sims))


def calibrated_floor(key, conf, n_bins: int = 15, n_sims: int = 200, weights=None) -> tuple[float, float]:
  """(mean, sd) of the ECE of a perfectly calibrated model with these confidences: outcomes drawn as
  Bernoulli(conf), `n_sims` times. The estimator's noise floor at this sample size."""
  conf = jnp.asarray(conf, jnp.float32)
  w = jnp.ones_like(conf) if weights is None else jnp.asarray(weights, jnp.float32)
  vals = _floor_draws(key, conf, w, n_bins, n_sims)
  return float(jnp.mean(vals)), float(jnp.std(vals))


def reliability(conf, correct, weights=None, n_bins: int = 15) -> dict[str, jax.Array]:
  """Reliability-diagram data per bin: edges, weight share, mean confidence, accuracy (NaN in empty bins)."""
  s = bin_stats(conf, correct, weights, n_bins)
  empty = s.weight <= 0
  safe = jnp.where(empty, 1.0, s.weight)
  return {"edges": jnp.linspace(0.0, 1.0, n_bins + 1), "share": s.weight / jnp.sum(s.weight),
          "conf": jnp.where(empty, jnp.nan, s.conf / safe), "acc": jnp.where(empty, jnp.nan, s.acc / safe)}
