"""Closed-form empirical (KDE) score: brute-force numpy loop, autodiff of log-sum-exp, scipy log-density."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from jaxlab.diffusion import score as score_lib
from jaxlab.errors import DataError


def _brute_denoiser(x, t, train):
  """E[x0 | x_t = x] by an explicit loop over query points and training points (float64)."""
  out = np.zeros_like(x, dtype=np.float64)
  for b in range(x.shape[0]):
    tb = t[b] if np.ndim(t) else t
    a, s2 = np.exp(-tb), 1.0 - np.exp(-2.0 * tb)
    logw = np.array([-np.sum((x[b] - a * xi) ** 2) / (2 * s2) for xi in train])
    w = np.exp(logw - logw.max())
    w /= w.sum()
    out[b] = sum(wi * xi for wi, xi in zip(w, train))
  return out


@pytest.fixture
def problem():
  rng = np.random.default_rng(0)
  return rng.normal(size=(37, 5)).astype(np.float32), rng.normal(size=(10, 5)).astype(np.float32)


@pytest.mark.parametrize("chunk,batch_chunk", [(1024, 0), (8, 4)])
def test_denoiser_and_score_match_brute_force_loop(problem, chunk, batch_chunk):
  train, x = problem
  fns = jax.jit(lambda x, t, tr: (score_lib.kde_denoiser(x, t, tr, chunk=chunk, batch_chunk=batch_chunk),
                                  score_lib.kde_score(x, t, tr, chunk=chunk, batch_chunk=batch_chunk)))
  for t in (0.05, 0.7, 3.0):
    den, sc = fns(jnp.asarray(x), jnp.float32(t), jnp.asarray(train))
    ref = _brute_denoiser(x.astype(np.float64), t, train.astype(np.float64))
    np.testing.assert_allclose(np.asarray(den), ref, rtol=1e-4, atol=1e-5)
    a, s2 = np.exp(-t), 1 - np.exp(-2 * t)
    np.testing.assert_allclose(np.asarray(sc), (a * ref - x) / s2, rtol=1e-3, atol=1e-3)


def test_per_row_times(problem):
  train, x = problem
  t = np.linspace(0.01, 2.0, x.shape[0]).astype(np.float32)
  den = jax.jit(lambda x, t, tr: score_lib.kde_denoiser(x, t, tr, chunk=1, batch_chunk=3))(
      jnp.asarray(x), jnp.asarray(t), jnp.asarray(train))
  np.testing.assert_allclose(np.asarray(den), _brute_denoiser(x.astype(np.float64), t, train.astype(np.float64)),
                             rtol=1e-4, atol=1e-5)


def test_score_equals_autodiff_of_logsumexp_density(problem):
  train, x = problem
  train, x = jnp.asarray(train), jnp.asarray(x)

  def log_p(xb, t):  # independent: the mixture log-density written directly with logsumexp
    a, s2 = jnp.exp(-t), 1 - jnp.exp(-2 * t)
    return jax.nn.logsumexp(-jnp.sum((xb - a * train) ** 2, -1) / (2 * s2))

  @jax.jit
  def all_three(x, t):
    auto = jax.vmap(jax.grad(log_p), in_axes=(0, None))(x, t)
    ours = score_lib.EmpiricalScore(train, chunk=7).score(x, t)
    # the gradient of our own chunked log-density must be the score too
    g = jax.grad(lambda xx: jnp.sum(score_lib.kde_log_density(xx, t, train, chunk=7)))(x)
    return auto, ours, g

  for t in (0.1, 1.0):
    auto, ours, g = all_three(x, jnp.float32(t))
    np.testing.assert_allclose(np.asarray(ours), np.asarray(auto), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(g), np.asarray(auto), rtol=1e-4, atol=1e-4)


def test_log_density_matches_scipy_mixture(problem):
  train, x = problem
  t = 0.4
  a, s2 = np.exp(-t), 1 - np.exp(-2 * t)
  comp = np.stack([stats.multivariate_normal(a * xi.astype(np.float64), s2 * np.eye(5)).logpdf(x) for xi in train])
  ref = special.logsumexp(comp, axis=0) - np.log(len(train))
  ours = score_lib.kde_log_density(jnp.asarray(x), t, jnp.asarray(train), chunk=5, batch_chunk=3)
  np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-5, atol=1e-4)


def test_small_time_is_stable_and_picks_the_nearest_point():
  train = jnp.asarray([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
  x = jnp.asarray([[9.0, 1.0], [0.5, 8.0], [0.2, -0.3]])
  den = score_lib.kde_denoiser(x, 1e-4, train, chunk=2)
  assert np.all(np.isfinite(np.asarray(den)))
  np.testing.assert_allclose(np.asarray(den), np.asarray(train)[[1, 2, 0]], atol=1e-5)


def test_score_from_denoiser_is_tweedie(problem):
  train, x = problem
  model = score_lib.EmpiricalScore(jnp.asarray(train))
  a, b = jax.jit(lambda x: (score_lib.score_from_denoiser(model.denoise)(x, 0.3), model.score(x, 0.3)))(
      jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_clear_errors():
  with pytest.raises(DataError, match="same dim"):
    score_lib.kde_denoiser(jnp.zeros((3, 2)), 0.5, jnp.zeros((4, 3)))
  with pytest.raises(DataError, match="empty"):
    score_lib.kde_denoiser(jnp.zeros((3, 2)), 0.5, jnp.zeros((0, 2)))
