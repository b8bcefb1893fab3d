"""Calibrated MoEs under shift: the Gaussian-regions world, its shifts, and the routing-theory arms.

The world (ours, as the spec's CPU experiment describes it): x in R^2 from K = 4 unit-variance Gaussian clusters
centred at sep * (+-1, +-1) (source prior uniform); the region of x is its most probable cluster (a quadrant);
the label is binary with a region-specific logistic law P(y = 1 | x) = sigmoid(a_r . x + b_r), slopes a_k ~
N(0, slope^2 I) and offsets b_k ~ N(0, 1) drawn per world seed, so p(y | x) jumps at the region borders.

The router is the world's cluster posterior g(x) (exact, known: the claims are about routing and aggregation,
not about estimating the router). The arms:

* hard: route = argmax g; expert k = logistic regression on the rows routed to k; per-expert temperature
  scaling on the routed validation rows (calibrated experts, the paper's sufficiency setting).
* soft: expert k = logistic regression weighted by g_k (gate-weighted NLL); per-expert temperature scaling on
  gate-weighted validation rows; the output is sum_k g_k p_k (a mixture of calibrated experts, "MoCE").
* soft_global_ts: the same soft experts without per-expert calibration, one temperature fitted on the
  aggregate (log of the mixture) instead: calibration of the aggregate only, on the source.
* oracle: the true P(y | x) (the calibrated floor at each test set's size).

Shifts (p(y | x) unchanged, `jaxlab.calibration.shifts`): S0 the source; S1 the region-prior shift (cluster
frequencies `shift.region_prior`); S2 the boundary shift (density ratio = normalised entropy of g).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from scipy.special import expit, log_softmax, softmax
from sklearn.linear_model import LogisticRegression

from jaxlab.calibration import metrics, shifts, temperature

K = 4
SHIFTS = ("S0", "S1", "S2")
THEORY_ARMS = ("hard", "soft", "soft_global_ts", "oracle")


@dataclasses.dataclass(frozen=True)
class World:
  """One draw of the Gaussian-regions world."""
  centers: np.ndarray   # (K, 2)
  slopes: np.ndarray    # (K, 2)
  offsets: np.ndarray   # (K,)
  prior: np.ndarray     # (K,) source cluster frequencies
  noise_dims: int = 0   # extra N(0, 1) input dimensions that carry no information (the training arms)


def make_world(seed: int, sep: float, slope: float, offset: float = 1.0, noise_dims: int = 0) -> World:
  """Slopes a_k ~ N(0, slope^2 I); offsets b_k = offset * (-1)^k (+ N(0, 0.25^2)): neighbouring regions lean to
  opposite labels, so the label law jumps at every border (where soft routing mixes the experts)."""
  r = np.random.default_rng([seed, 17])
  centers = sep * np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]], np.float64)
  offsets = offset * np.array([1.0, -1.0, 1.0, -1.0]) + 0.25 * r.normal(size=K)
  return World(centers, r.normal(size=(K, 2)) * slope, offsets, np.full(K, 1.0 / K), noise_dims)


def cluster_posterior(world: World, x) -> np.ndarray:
  """g(x): (N, K) posterior of the generating cluster (the router of the theory arms)."""
  x2 = np.asarray(x, np.float64)[:, :2]
  logits = -0.5 * np.sum((x2[:, None, :] - world.centers[None]) ** 2, axis=-1) + np.log(world.prior)
  return softmax(logits, axis=1)


def region(world: World, x) -> np.ndarray:
  return np.argmax(cluster_posterior(world, x), axis=1)


def true_prob(world: World, x) -> np.ndarray:
  """P(y = 1 | x)."""
  x2 = np.asarray(x, np.float64)[:, :2]
  r = region(world, x2)
  return expit(np.sum(world.slopes[r] * x2, axis=1) + world.offsets[r])


def draw_source(world: World):
  """A sampler rng, m -> {"x", "y", "cluster"} of the source law."""
  def draw(rng: np.random.Generator, m: int) -> dict:
    c = rng.choice(K, size=m, p=world.prior)
    x = world.centers[c] + rng.normal(size=(m, 2))
    if world.noise_dims:
      x = np.concatenate([x, rng.normal(size=(m, world.noise_dims))], axis=1)
    y = (rng.random(m) < true_prob(world, x)).astype(np.int32)
    return {"x": x.astype(np.float32), "y": y, "cluster": c}
  return draw


def draw_shift(world: World, rng: np.random.Generator, name: str, n: int, region_prior) -> dict:
  """n points of shift `name` (S0 | S1 | S2) with labels."""
  draw = draw_source(world)
  if name == "S0":
    return draw(rng, n)
  if name == "S1":
    target = np.asarray(region_prior, np.float64)
    return shifts.rejection_sample(rng, draw, lambda p: shifts.region_prior_weights(p["cluster"], world.prior,
                                                                                    target),
                                   n, w_max=float(np.max(target / world.prior)))
  if name == "S2":
    return shifts.rejection_sample(rng, draw, lambda p: shifts.boundary_weights(cluster_posterior(world, p["x"])),
                                   n, w_max=1.0)
  raise ValueError(name)


# ------------------------------------------------------------------------------------------ theory arms


def _logreg(x, y, weights=None) -> LogisticRegression:
  """An unpenalised logistic regression (the well-specified expert of a region)."""
  return LogisticRegression(C=np.inf, tol=1e-6, max_iter=1000).fit(x, y, sample_weight=weights)


def _logits(model: LogisticRegression, x) -> np.ndarray:
  """(N, 2) class logits [0, z] of a fitted binary logistic regression."""
  z = model.decision_function(x)
  return np.stack([np.zeros_like(z), z], axis=1)


@dataclasses.dataclass
class TheoryArms:
  """Fitted experts and temperatures of the hard, soft and aggregate-only arms."""
  hard: list
  soft: list
  t_hard: np.ndarray
  t_soft: np.ndarray
  t_global: float


def fit_theory(world: World, train: dict, val: dict) -> TheoryArms:
  gtr, gva = cluster_posterior(world, train["x"]), cluster_posterior(world, val["x"])
  rtr, rva = np.argmax(gtr, 1), np.argmax(gva, 1)
  hard = [_logreg(train["x"][rtr == k], train["y"][rtr == k]) for k in range(K)]
  soft = [_logreg(train["x"], train["y"], gtr[:, k]) for k in range(K)]
  z_hard = np.stack([_logits(m, val["x"]) for m in hard], axis=1)      # (N, K, 2)
  z_soft = np.stack([_logits(m, val["x"]) for m in soft], axis=1)
  t_hard = temperature.fit_expert_temperatures(z_hard, val["y"], np.eye(K)[rva])
  t_soft = temperature.fit_expert_temperatures(z_soft, val["y"], gva)
  mix = np.einsum("nk,nkc->nc", gva, softmax(z_soft, axis=-1))         # the uncalibrated soft aggregate
  t_global = temperature.fit_temperature(np.log(np.maximum(mix, 1e-12)), val["y"])
  return TheoryArms(hard, soft, t_hard, t_soft, t_global)


def theory_probs(world: World, arms: TheoryArms, x) -> dict[str, np.ndarray]:
  """{arm: (N, 2) class probabilities} of every theory arm."""
  g = cluster_posterior(world, x)
  z_hard = np.stack([_logits(m, x) for m in arms.hard], axis=1)
  z_soft = np.stack([_logits(m, x) for m in arms.soft], axis=1)
  route = np.eye(K)[np.argmax(g, 1)]
  hard = np.einsum("nk,nkc->nc", route, softmax(z_hard / arms.t_hard[:, None], axis=-1))
  soft = np.einsum("nk,nkc->nc", g, softmax(z_soft / arms.t_soft[:, None], axis=-1))
  raw = np.einsum("nk,nkc->nc", g, softmax(z_soft, axis=-1))
  glob = softmax(log_softmax(np.log(np.maximum(raw, 1e-12)), axis=1) / arms.t_global, axis=1)
  p1 = true_prob(world, x)
  return {"hard": hard, "soft": soft, "soft_global_ts": glob, "oracle": np.stack([1 - p1, p1], axis=1)}


def calibration_summary(key, probs, labels, conf, correct, n_bins: int, n_boot: int) -> dict[str, float]:
  """ECE (top-label confidences `conf` against `correct`, n_bins equal-width bins) with its bootstrap 95% interval,
  and accuracy."""
  value, lo, hi = metrics.bootstrap_ece(key, conf, correct, n_bins=n_bins, n_boot=n_boot)
  return {"ece": value, "ece_lo": lo, "ece_hi": hi, "acc": float(metrics.accuracy(probs, labels))}


def evaluate_probs(probs: dict, tests: dict, key, n_bins: int, n_boot: int) -> tuple[dict, dict]:
  """({"<arm>/<shift>/<stat>": value}, {"<arm>/<shift>": reliability-diagram arrays}) of probs {shift: {arm: (N, C)}}
  against the labels of tests {shift: data}: ECE with its bootstrap interval, accuracy, reliability bins."""
  out, rel = {}, {}
  for s, data in tests.items():
    for a, p in probs[s].items():
      key, sub = jax.random.split(key)
      conf, correct = metrics.top_label(p, data["y"])
      for stat, v in calibration_summary(sub, p, data["y"], conf, correct, n_bins, n_boot).items():
        out[f"{a}/{s}/{stat}"] = v
      rel[f"{a}/{s}"] = {k: np.asarray(v) for k, v in metrics.reliability(conf, correct, n_bins=n_bins).items()}
  return out, rel


def evaluate_theory(world: World, arms: TheoryArms, tests: dict, key, n_bins: int, n_boot: int
                    ) -> tuple[dict, dict]:
  """`evaluate_probs` of every theory arm on every shift."""
  return evaluate_probs({s: theory_probs(world, arms, data["x"]) for s, data in tests.items()}, tests, key, n_bins,
                        n_boot)
