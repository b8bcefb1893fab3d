"""Gaussian OT (jaxlab.ot) against independent references: scipy, sklearn, POT's ot.gaussian, ott-jax, closed forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from jaxlab import ot as jot
from jaxlab.errors import DataError

pot = pytest.importorskip("ot")


def _spd(rng, d, ridge=0.1):
  a = rng.normal(size=(d, d))
  return a @ a.T / d + ridge * np.eye(d)


def _gaussians(seed, k=4, d=5):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(k, d)), np.stack([_spd(rng, d) for _ in range(k)]), rng.dirichlet(np.ones(k))


def test_sqrtm_psd_matches_scipy():
  c = _spd(np.random.default_rng(0), 6)
  with jax.enable_x64(True):
    r, r_inv = jot.sqrtm_psd(jnp.asarray(c))
  ref = scipy.linalg.sqrtm(c).real
  np.testing.assert_allclose(r, ref, atol=1e-10)
  np.testing.assert_allclose(np.asarray(r_inv) @ ref, np.eye(6), atol=1e-9)


def test_sqrtm_psd_of_singular_matrix_stays_finite():
  v = np.random.default_rng(1).normal(size=(5, 2))
  r, r_inv = jot.sqrtm_psd(jnp.asarray(v @ v.T, jnp.float32))
  assert np.all(np.isfinite(r)) and np.all(np.isfinite(r_inv))
  np.testing.assert_allclose(np.asarray(r) @ np.asarray(r), v @ v.T, atol=1e-4)


def test_ledoit_wolf_matches_sklearn_and_ignores_masked_rows():
  from sklearn.covariance import LedoitWolf
  rng = np.random.default_rng(2)
  x = rng.normal(size=(40, 7)) @ rng.normal(size=(7, 7)) + 2.0
  ref = LedoitWolf().fit(x)
  with jax.enable_x64(True):
    m, c, s = jot.ledoit_wolf(jnp.asarray(x), spd_eps=None)
    padded = np.concatenate([x, 100 * rng.normal(size=(9, 7))])
    mask = np.r_[np.ones(40), np.zeros(9)]
    m2, c2, _ = jot.ledoit_wolf(jnp.asarray(padded), jnp.asarray(mask), spd_eps=None)
  np.testing.assert_allclose(m, ref.location_, atol=1e-12)
  np.testing.assert_allclose(c, ref.covariance_, atol=1e-10)
  np.testing.assert_allclose(s, ref.shrinkage_, atol=1e-12)
  np.testing.assert_allclose(c2, ref.covariance_, atol=1e-10)
  np.testing.assert_allclose(m2, ref.location_, atol=1e-12)


def test_spd_floor_raises_small_eigenvalues_only():
  c = np.diag([4.0, 1.0, 1e-14, 0.0])
  with jax.enable_x64(True):
    f = np.asarray(jot.spd_floor(jnp.asarray(c), 1e-3))
  floor = 1e-3 * max(1.0, 5.0 / 4)
  np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(f)), [floor, floor, 1.0, 4.0], atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_barycenter_matches_pot(seed):
  ms, cs, w = _gaussians(seed)
  ref_m, ref_c = pot.gaussian.bures_wasserstein_barycenter(ms, cs, w, num_iter=1000, eps=1e-12)
  with jax.enable_x64(True):
    b = jot.bures_barycenter(ms, cs, w, tol=1e-13)
  np.testing.assert_allclose(b.mean, ref_m, atol=1e-12)
  np.testing.assert_allclose(b.cov, ref_c, atol=1e-9)
  assert 1 < int(b.iterations) < 1000


def test_ott_backend_matches_pot():
  pytest.importorskip("ott")
  ms, cs, w = _gaussians(3)
  ref_m, ref_c = pot.gaussian.bures_wasserstein_barycenter(ms, cs, w, num_iter=1000, eps=1e-12)
  with jax.enable_x64(True):
    b = jot.bures_barycenter(ms, cs, w, num_iters=40, backend="ott")
  np.testing.assert_allclose(b.cov, ref_c, atol=1e-7)
  np.testing.assert_allclose(b.mean, ref_m, atol=1e-12)


def test_barycenter_closed_forms():
  # Commuting (diagonal) covariances: C_bar = (sum_k w_k C_k^{1/2})^2; equal Gaussians: their common value.
  rng = np.random.default_rng(4)
  diag = rng.uniform(0.2, 3.0, size=(3, 4))
  w = np.array([0.2, 0.3, 0.5])
  cs = np.stack([np.diag(d) for d in diag])
  with jax.enable_x64(True):
    b = jot.bures_barycenter(np.zeros((3, 4)), cs, w, tol=1e-14)
    np.testing.assert_allclose(np.diag(b.cov), (w @ np.sqrt(diag)) ** 2, rtol=1e-10)
    c = _spd(rng, 4)
    same = jot.bures_barycenter(np.ones((2, 4)), np.stack([c, c]))
  np.testing.assert_allclose(same.cov, c, atol=1e-10)


def test_barycenter_minimises_weighted_w2():
  # The barycenter's objective sum_k w_k W2^2(N_k, B) is below that of perturbed candidates (POT's distance).
  ms, cs, w = _gaussians(5, k=3, d=3)
  with jax.enable_x64(True):
    b = jot.bures_barycenter(ms, cs, w, tol=1e-13)
  def obj(m, c):
    return sum(wk * pot.gaussian.bures_wasserstein_distance(mk, m, ck, c) ** 2 for wk, mk, ck in zip(w, ms, cs))
  best = obj(np.asarray(b.mean), np.asarray(b.cov))
  rng = np.random.default_rng(0)
  for _ in range(5):
    e = rng.normal(size=(3, 3)) * 0.05
    assert obj(np.asarray(b.mean) + 0.05 * rng.normal(size=3), np.asarray(b.cov) + e @ e.T) > best


def test_gaussian_map_matches_pot_and_ott():
  ms, cs, _ = _gaussians(6, k=2, d=4)
  ref_a, ref_b = pot.gaussian.bures_wasserstein_mapping(ms[0], ms[1], cs[0], cs[1])
  with jax.enable_x64(True):
    a, b = jot.gaussian_map(ms[0], cs[0], ms[1], cs[1])
    m, c = jot.push_forward(ms[0], cs[0], a, b)
    pts = np.random.default_rng(0).normal(size=(8, 4))
    ours = np.asarray(jot.partial_transport(jnp.asarray(pts), a, b, 1.0))
    gmod = pytest.importorskip("ott.tools.gaussian_mixture.gaussian")
    g0 = gmod.Gaussian.from_mean_and_cov(jnp.asarray(ms[0]), jnp.asarray(cs[0]))
    g1 = gmod.Gaussian.from_mean_and_cov(jnp.asarray(ms[1]), jnp.asarray(cs[1]))
    ott_pts = np.asarray(g0.transport(g1, jnp.asarray(pts)))
  np.testing.assert_allclose(a, ref_a, atol=1e-10)
  np.testing.assert_allclose(b, ref_b, atol=1e-10)
  np.testing.assert_allclose(m, ms[1], atol=1e-12)
  np.testing.assert_allclose(c, cs[1], atol=1e-10)
  np.testing.assert_allclose(ours, ott_pts, atol=1e-5)


def test_geodesic_has_constant_speed():
  # W2(N_tau, target) = (1 - tau) W2(source, target) along the McCann geodesic (POT's distance as reference).
  ms, cs, _ = _gaussians(7, k=2, d=3)
  full = pot.gaussian.bures_wasserstein_distance(ms[0], ms[1], cs[0], cs[1])
  with jax.enable_x64(True):
    a, b = jot.gaussian_map(ms[0], cs[0], ms[1], cs[1])
    for tau in (0.0, 0.3, 0.7, 1.0):
      at, bt = jot.geodesic_map(a, b, tau)
      m, c = jot.push_forward(ms[0], cs[0], at, bt)
      rest = pot.gaussian.bures_wasserstein_distance(np.asarray(m), ms[1], np.asarray(c), cs[1])
      np.testing.assert_allclose(rest, (1 - tau) * full, atol=1e-6)
      np.testing.assert_allclose(jot.bures_wasserstein2(ms[0], cs[0], ms[1], cs[1]), full ** 2, rtol=1e-9)


def test_pooled_pca_matches_sklearn_on_pooled_data():
  from sklearn.decomposition import PCA
  rng = np.random.default_rng(8)
  xs = [rng.normal(size=(n, 6)) @ np.diag([3, 2, 1, 0.3, 0.1, 0.01]) + rng.normal(size=6) for n in (30, 50, 20)]
  stats = [(len(x), x.mean(0), (x - x.mean(0)).T @ (x - x.mean(0))) for x in xs]
  with jax.enable_x64(True):
    mean, basis, r = jot.pooled_pca(np.array([s[0] for s in stats]), np.stack([s[1] for s in stats]),
                                    np.stack([s[2] for s in stats]), 0.99)
  pca = PCA(n_components=0.99, svd_solver="full").fit(np.concatenate(xs))
  assert r == pca.n_components_
  np.testing.assert_allclose(mean, pca.mean_, atol=1e-12)
  np.testing.assert_allclose(np.abs(np.asarray(basis).T @ pca.components_.T), np.eye(r), atol=1e-8)


def test_bad_shapes_are_clear_errors():
  with pytest.raises(DataError, match="need means"):
    jot.bures_barycenter(np.zeros((3, 2)), np.zeros((3, 3, 3)))
  with pytest.raises(DataError, match="weights must have shape"):
    jot.bures_barycenter(np.zeros((3, 2)), np.stack([np.eye(2)] * 3), np.ones(2))
  with pytest.raises(DataError, match="non-negative"):
    jot.bures_barycenter(np.zeros((2, 2)), np.stack([np.eye(2)] * 2), np.array([1.0, -1.0]))
