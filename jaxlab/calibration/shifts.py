"""Test-time shifts that keep p(y | x) fixed and move p(x): the shifts under which an MoE's calibration is tested.

Wong et al. (ICML 2026, arXiv 2606.20544) show that hard routing with calibrated experts stays calibrated under
any shift that leaves p(y | route, expert confidence) unchanged, and that soft routing does not: a shift that
only changes how often routing configurations occur (e.g. toward inputs the router splits between experts)
breaks the aggregate's calibration. Two such shifts, both covariate shifts (reweightings of x):

* `region_prior_weights`: the regions (mixture components, routes) keep their conditional input law and change
  their frequencies, w(x) = target[r(x)] / source[r(x)].
* `boundary_weights`: the mass moves toward the router's uncertain inputs, w(x) = H(g(x)) / log K (the
  normalised routing entropy, in [0, 1]).

A shifted test set is drawn from the source by rejection (`rejection_sample`): a source draw is kept with
probability w(x) / w_max, so the kept points follow p(x) w(x) / E[w] exactly, with no repeats (a resampled
set with replacement would repeat points and understate the ECE's noise).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy import special

from jaxlab.errors import ConfigError


def routing_entropy(gates) -> np.ndarray:
  """H(g) / log K per row of gates (N, K) (rows summing to 1): 0 for a one-hot route, 1 for a uniform one."""
  g = np.asarray(gates, np.float64)
  if g.ndim != 2 or g.shape[1] < 2:
    raise ConfigError(f"routing_entropy needs gates of shape (N, K) with K >= 2; got {g.shape}")
  return np.sum(special.entr(g), axis=1) / np.log(g.shape[1])


def boundary_weights(gates) -> np.ndarray:
  """The boundary shift's density ratio up to a constant: the normalised routing entropy."""
  return routing_entropy(gates)


def region_prior_weights(regions, source_prior, target_prior) -> np.ndarray:
  """target[r] / source[r] per point of region r (the region-prior shift's density ratio)."""
  src, tgt = np.asarray(source_prior, np.float64), np.asarray(target_prior, np.float64)
  if src.shape != tgt.shape or src.ndim != 1:
    raise ConfigError(f"region priors must be two vectors of one length; got {src.shape} and {tgt.shape}")
  for name, p in (("source_prior", src), ("target_prior", tgt)):
    if np.any(p < 0) or not np.isclose(p.sum(), 1.0):
      raise ConfigError(f"{name}={p.tolist()} must be a probability vector (non-negative, summing to 1)")
  if np.any((src == 0) & (tgt > 0)):
    raise ConfigError("target_prior puts mass on a region the source never draws: no reweighting reaches it")
  return tgt[np.asarray(regions)] / np.where(src > 0, src, 1.0)[np.asarray(regions)]


def rejection_sample(rng: np.random.Generator, draw: Callable[[np.random.Generator, int], dict],
                     weight: Callable[[dict], np.ndarray], n: int, w_max: float, *,
                     pool: int | None = None, max_rounds: int = 1000) -> dict:
  """n points of the shifted law p(x) w(x) / E[w] from a source sampler, by rejection.

  Args:
    rng: numpy generator.
    draw: `draw(rng, m) -> {name: array with m rows}`, m points from the source (the arrays share row order).
    weight: `weight(points) -> (m,)` density ratios, each in [0, w_max].
    n: points wanted.
    w_max: an upper bound of the weights (the acceptance probability is w / w_max).
    pool: source points drawn per round (default 4n).
    max_rounds: a bound on rounds (a weight that is almost always 0 is an error, not a hang).

  Returns:
    {name: array with n rows}: the accepted points, in draw order, plus "accept_rate" (a float).
  """
  if n < 1 or w_max <= 0:
    raise ConfigError(f"rejection_sample needs n >= 1 and w_max > 0; got n={n}, w_max={w_max}")
  pool = pool or 4 * n
  kept, have, drawn = [], 0, 0
  for _ in range(max_rounds):
    pts = draw(rng, pool)
    w = np.asarray(weight(pts), np.float64)
    if np.any(w < 0) or np.any(w > w_max * (1 + 1e-9)):
      raise ConfigError(f"rejection_sample: weights must lie in [0, w_max={w_max}]; got range "
                        f"[{w.min():.4g}, {w.max():.4g}]")
    keep = rng.random(len(w)) * w_max < w
    kept.append({k: np.asarray(v)[keep] for k, v in pts.items()})
    have, drawn = have + int(keep.sum()), drawn + len(w)
    if have >= n:
      out = {k: np.concatenate([c[k] for c in kept])[:n] for k in pts}
      out["accept_rate"] = have / drawn
      return out
  raise ConfigError(f"rejection_sample: only {have} of {n} points accepted in {max_rounds} rounds of {pool} "
                    "(the shift's weights are almost always 0; lower w_max to the weights' real maximum)")
