"""Arm (a): the controlled linear-Gaussian model of fine-tuning difficulty, with exact PAC-Bayes terms.

The model (our reconstruction: the paper's synthetic task is not public, see README):

* A "problem" is a random signal u with Fourier coefficients (cos, sin) at frequencies 1..L, each N(0, s);
  its answer is the response of a fixed linear filter, y = <w*, u> + noise N(0, sigma^2). A problem of
  difficulty d excites only the frequencies <= d (its higher coefficients are 0); the target distribution
  is the hardest level, d = L.
* The true filter has energy amplitude * l^-decay at frequency l with a random phase per frequency (the
  seed's world). The "pretrained" solution w0 knows the lowest `pretrained_levels` frequencies exactly and
  nothing above (0).
* Fine-tuning on n problems of difficulty d is ridge regression pulled toward w0 (weight decay toward the
  pretrained weights, strength `ridge`): the coordinates of frequencies above d are not excited, so they
  stay at w0; that is the extrapolation gap. Fitting the 2d excited coordinates from n noisy problems is
  the generalisation gap.
* PAC-Bayes: prior P = N(w0, prior_var I) (the pretrained model), posterior Q_d = N(mu_d, Sigma_d) with mu_d
  the fine-tuned weights and Sigma_d = (X^T X / sigma^2 + I / prior_var)^-1 (the Gaussian posterior
  covariance under P; Sigma_d = prior_var on the frequencies above d, which then add nothing to the KL).
  KL(Q_d || P) is exact. The loss of the bound is 1 - exp(-r^2 / (2 tau^2)) (in [0, 1)), whose Gibbs risk is
  closed form for Gaussian residuals; the target-side bound adds to Catoni's bound on the difficulty-d
  risk the extrapolation term Delta_d = R_T(Q_d) - R_d(Q_d) (population Gibbs risks by Monte Carlo over
  `target_inputs` fresh signals, shared by all cells).

Errors are excess errors (error minus the true filter's error on the same data), so that
target = train + generalisation gap + extrapolation gap holds exactly per cell and the training noise's own
variance does not blur the gaps. Each cell averages `repeats` independent training sets; the budgets of one
training set are nested (the first n of n_max problems) and its difficulties share the draws (difficulty d
masks the frequencies above d), so comparisons along n and d are paired.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.selection import pac_bayes

COORDS_PER_LEVEL = 2   # cos and sin of one frequency
METRICS = ("target_err", "id_err", "train_err", "gen_gap", "extrap_gap", "kl", "emp_gibbs", "id_gibbs",
           "target_gibbs", "bound_catoni", "bound_mcallester", "target_bound")


def levels(num_levels: int) -> np.ndarray:
  """(2 L,) frequency of each coordinate: 1, 1, 2, 2, ..., L, L."""
  return np.repeat(np.arange(1, num_levels + 1), COORDS_PER_LEVEL)


def world(key: jax.Array, s) -> tuple[jax.Array, jax.Array]:
  """(w_star, w0) of one seed: the true filter (energy amplitude * l^-decay at frequency l, random phases) and
  the pretrained filter (w_star on frequencies <= s.pretrained_levels, 0 above). `s` = config.synthetic."""
  lev = np.arange(1, s.levels + 1, dtype=np.float32)
  amp = jnp.sqrt(s.amplitude * lev ** -s.decay)
  phase = jax.random.uniform(key, (s.levels,), maxval=2 * np.pi)
  w_star = jnp.stack([amp * jnp.cos(phase), amp * jnp.sin(phase)], axis=1).reshape(-1)
  w0 = jnp.where(jnp.asarray(levels(s.levels)) <= s.pretrained_levels, w_star, 0.0)
  return w_star, w0


def _cell(u, eps, v, w_star, w0, d, n, *, s, b):
  """One (difficulty d, budget n) cell for one training set: the METRICS as scalars."""
  lev = jnp.asarray(levels(s.levels))
  p = lev.shape[0]
  mask = (lev <= d).astype(u.dtype)
  rows = (jnp.arange(u.shape[0]) < n).astype(u.dtype)
  x = u * mask
  y = x @ w_star + eps
  xw = x * rows[:, None]
  gram = xw.T @ x
  eye = jnp.eye(p, dtype=u.dtype)
  mu = w0 + jnp.linalg.solve(gram + s.ridge * eye, xw.T @ (y - x @ w0))
  err = mu - w_star
  var_s, sig2 = s.input_scale ** 2, s.noise ** 2
  train_err = jnp.sum(rows * ((y - x @ mu) ** 2 - eps ** 2)) / n        # excess over the true filter's fit
  id_err = var_s * jnp.sum(mask * err ** 2)
  target_err = var_s * jnp.sum(err ** 2)
  # PAC-Bayes: Q = N(mu, cov), P = N(w0, prior_var I)
  cov = jnp.linalg.inv(gram / sig2 + eye / b.prior_var)
  cov = 0.5 * (cov + cov.T)
  kl = pac_bayes.gaussian_kl(mu, cov, w0, b.prior_var * eye)
  resid = x @ mu - y
  emp = jnp.sum(rows * pac_bayes.gaussian_residual_loss(resid, jnp.einsum("ip,pq,iq->i", x, cov, x), b.tau)) / n

  def gibbs(vin):   # population Gibbs risk over the shared fresh signals (noise included)
    q = jnp.einsum("ip,pq,iq->i", vin, cov, vin) + sig2
    return jnp.mean(pac_bayes.gaussian_residual_loss(vin @ err, q, b.tau))

  id_gibbs, target_gibbs = gibbs(v * mask), gibbs(v)
  catoni = pac_bayes.catoni_bound(emp, kl, n, b.delta, b.catoni_c)
  mcallester = pac_bayes.mcallester_bound(emp, kl, n, b.delta)
  return dict(target_err=target_err, id_err=id_err, train_err=train_err, gen_gap=id_err - train_err,
              extrap_gap=target_err - id_err, kl=kl, emp_gibbs=emp, id_gibbs=id_gibbs, target_gibbs=target_gibbs,
              bound_catoni=catoni, bound_mcallester=mcallester, target_bound=catoni + target_gibbs - id_gibbs)


@functools.partial(jax.jit, static_argnames=("s", "b"))
def _rows_one(key, w_star, w0, v, ns, *, s, b):
  """The cells of budgets `ns` x all difficulties for one training set: {metric: (len(ns), L)}."""
  n_max = max(s.budgets)
  ku, ke = jax.random.split(key)
  p = s.levels * COORDS_PER_LEVEL
  u = s.input_scale * jax.random.normal(ku, (n_max, p))
  eps = s.noise * jax.random.normal(ke, (n_max,))
  cell = functools.partial(_cell, u, eps, v, w_star, w0, s=s, b=b)
  ds = jnp.arange(1, s.levels + 1)
  return jax.vmap(lambda n: jax.vmap(lambda d: cell(d, n))(ds))(ns)


def run_rows(config, key: jax.Array, budgets) -> dict[str, np.ndarray]:
  """Rows of the budget x difficulty grid of one seed: {metric: (len(budgets), L) mean over the training sets},
  plus the seed's world ("w_star", "w0"). Training set r is the same draw (the first n of max(budgets) problems)
  whichever rows are asked for, so rows computed separately equal rows computed together. The repeats run one
  after another (lax.map), the cells of one repeat vectorised."""
  s, b = ml_collections.FrozenConfigDict(config.synthetic), ml_collections.FrozenConfigDict(config.bound)  # hashable: jit static
  k_world, k_test, k_train = jax.random.split(key, 3)
  w_star, w0 = world(k_world, s)
  v = s.input_scale * jax.random.normal(k_test, (s.target_inputs, s.levels * COORDS_PER_LEVEL))
  keys = jax.random.split(k_train, s.repeats)
  ns = jnp.asarray(budgets, jnp.float32)
  out = jax.lax.map(lambda k: _rows_one(k, w_star, w0, v, ns, s=s, b=b), keys)
  rows = {k: np.asarray(jnp.mean(val, axis=0), np.float64) for k, val in out.items()}
  rows["w_star"], rows["w0"] = np.asarray(w_star), np.asarray(w0)
  return rows


def run_grid(config, key: jax.Array) -> dict[str, np.ndarray]:
  """The whole grid of one seed (all budgets at once; equal to stacking `run_rows` of each budget)."""
  return run_rows(config, key, config.synthetic.budgets)


def summarise_grid(grid: dict[str, np.ndarray], budgets, difficulties) -> dict:
  """The claim keys of one seed from its grid (lists are indexed by budget, then difficulty)."""
  from jaxlab.selection import gaps  # pylint: disable=g-import-not-at-top
  budgets, difficulties = list(budgets), list(difficulties)
  dstar = gaps.optimal_difficulty(grid["target_err"], difficulties)
  dbound = gaps.optimal_difficulty(grid["target_bound"], difficulties)
  gen_rho = gaps.trend_over_difficulty(grid["gen_gap"], difficulties)
  ext_rho = gaps.trend_over_difficulty(grid["extrap_gap"], difficulties)
  out = {"dstar": [int(x) for x in dstar], "dstar_bound": [int(x) for x in dbound],
         "gen_spearman": [float(x) for x in gen_rho], "extrap_spearman": [float(x) for x in ext_rho],
         "bound_valid": float(np.mean(grid["target_bound"] >= grid["target_gibbs"]))}
  for k in METRICS:
    out[f"grid/{k}"] = [[float(x) for x in row] for row in grid[k]]
  out["budgets"] = [int(n) for n in budgets]
  out["dstar/nmin"], out["dstar/nmax"] = int(dstar[0]), int(dstar[-1])
  out["dstar_bound/nmin"], out["dstar_bound/nmax"] = int(dbound[0]), int(dbound[-1])
  return out
