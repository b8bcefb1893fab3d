"""Implicit graphs, GRFs and SWING: closed forms, unbiasedness, no N x N arrays, sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import mesh as mesh_lib
from jaxlab.errors import ConfigError
from jaxlab.graphs import grf, igraph, swing


def test_modulation_deconvolves_alpha():
  alpha = np.array([2.0, 1.5, 0.7, 0.3, 0.1, 0.05])
  f = grf.modulation_from_alpha(alpha)
  np.testing.assert_allclose(np.convolve(f, f)[: len(alpha)], alpha, rtol=1e-12)
  np.testing.assert_allclose(grf.modulation_from_alpha(grf.alpha_coefficients("inverse_squared", 8)), 1.0)
  diff = grf.alpha_coefficients("diffusion", 6, beta=0.5)  # f = power series of exp(beta W / 2)
  np.testing.assert_allclose(grf.modulation_from_alpha(diff),
                             [0.25 ** k / np.prod(np.arange(1, k + 1)) for k in range(7)], rtol=1e-10)


@pytest.mark.parametrize("kind", igraph.KINDS)
def test_igraph_weights_matvec_and_spectral_radius(kind):
  x = jax.random.normal(jax.random.key(0), (70, 3))
  g = igraph.IGraph(kind, bandwidth=0.8, eps=1.0, sharpness=0.2)
  w = igraph.materialise(g, x)
  assert w.shape == (70, 70) and float(jnp.max(jnp.abs(jnp.diag(w)))) == 0.0
  d = np.linalg.norm(np.asarray(x)[:, None] - np.asarray(x)[None], axis=-1)
  want = {"rbf": np.exp(-d ** 2 / (2 * 0.64)), "eps": (d <= 1.0).astype(float),
          "smooth_step": 1 / (1 + np.exp(-(1.0 - d) / 0.2))}[kind] * (1 - np.eye(70))
  np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-6)
  v = jax.random.normal(jax.random.key(1), (70,))
  np.testing.assert_allclose(igraph.matvec(g, x, v, chunk=16), w @ v, rtol=1e-4, atol=1e-4)
  if kind != "eps":
    lam = float(np.max(np.linalg.eigvalsh(np.asarray(w, np.float64))))
    assert abs(float(igraph.spectral_radius(g, x, iters=300)) - lam) < 1e-3 * lam
  with pytest.raises(ConfigError, match="use the SWING path"):
    igraph.materialise(g, x, max_bytes=1000)


def test_walk_features_matvecs_match_dense():
  x = jax.random.normal(jax.random.key(0), (30, 2))
  g = igraph.normalise(igraph.IGraph("rbf", bandwidth=0.7), x, 0.5)
  w = igraph.materialise(g, x)
  f = np.ones(7)
  a = grf.run_walks(jax.random.key(1), 30, 4, 6, 0.3, f, grf.uniform_step(w, 0.3))
  b = grf.run_walks(jax.random.key(2), 30, 4, 6, 0.3, f, grf.uniform_step(w, 0.3))
  v = jax.random.normal(jax.random.key(3), (30, 2))
  np.testing.assert_allclose(grf.kernel_matvec(a, b, v), grf.dense_estimate(a, b) @ v, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(a.rmatvec(v[:, 0]), a.dense().T @ v[:, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("estimator", ["uniform", "oracle", "swing"])
def test_grf_estimators_are_unbiased(estimator):
  """Mean of K_hat over many independent ensembles -> K = (I - W)^-2 on a small graph."""
  n = 24
  x = jax.random.normal(jax.random.key(0), (n, 2))
  g = igraph.normalise(igraph.IGraph("rbf", bandwidth=0.8), x, 0.5)
  w = igraph.materialise(g, x)
  k = grf.exact_kernel(np.asarray(w), "inverse_squared")
  f = grf.modulation_from_alpha(grf.alpha_coefficients("inverse_squared", 10))

  def features(key):
    if estimator == "swing":
      return swing.swing_features(key, x, g, f, n_walks=64, t_max=10, p_halt=0.4, m=32, sigma2=2.0, impl="xla")
    step = (grf.uniform_step if estimator == "uniform" else grf.oracle_step)(w, 0.4)
    return grf.run_walks(key, n, 64, 10, 0.4, f, step)

  @jax.jit
  def one(key):
    k1, k2 = jax.random.split(key)
    return grf.dense_estimate(features(k1), features(k2))

  reps = 40
  ests = np.asarray(jax.lax.map(one, jax.random.split(jax.random.key(5), reps)), np.float64)
  single = np.sqrt(np.mean([np.sum((e - k) ** 2) for e in ests])) / np.linalg.norm(k)
  rel = np.linalg.norm(ests.mean(0) - k) / np.linalg.norm(k)
  # Unbiased + independent: the mean's error is ~ single / sqrt(reps); a bias would not shrink.
  assert rel < 2.0 * single / np.sqrt(reps), (rel, single)
  assert rel < 0.06


def test_swing_path_never_forms_an_n_by_n_array():
  n, m = 300, 64
  x = jax.random.normal(jax.random.key(0), (n, 3))
  g = igraph.IGraph("rbf", bandwidth=0.6, scale=0.01)
  f = np.ones(6)

  def pipeline(key, v):
    k1, k2 = jax.random.split(key)
    a = swing.swing_features(k1, x, g, f, n_walks=2, t_max=5, p_halt=0.5, m=m, impl="xla")
    b = swing.swing_features(k2, x, g, f, n_walks=2, t_max=5, p_halt=0.5, m=m, impl="xla")
    return grf.kernel_matvec(a, b, v)

  jaxpr = jax.make_jaxpr(pipeline)(jax.random.key(0), jnp.ones((n,)))
  shapes = []

  def visit(jp):
    for eqn in jp.eqns:
      shapes.extend(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
      for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else []:
        visit(sub)
      for p in eqn.params.values():
        if hasattr(p, "jaxpr"):
          visit(p.jaxpr if hasattr(p.jaxpr, "eqns") else p.jaxpr.jaxpr)
  visit(jaxpr.jaxpr)
  assert shapes and not [s for s in shapes if sum(dim >= n for dim in s) >= 2], "an N x N array appears"
  assert any(s[:1] == (n,) for s in shapes)


def test_swing_sharded_over_walkers_equals_unsharded():
  n = 48
  x = jax.random.normal(jax.random.key(0), (n, 3))
  g = igraph.normalise(igraph.IGraph("rbf", bandwidth=0.7), x, 0.5)
  kw = dict(n_walks=4, t_max=6, p_halt=0.5, m=16, impl="interpret")
  one = swing.swing_features(jax.random.key(3), x, g, np.ones(7), **kw)
  m8 = mesh_lib.make_mesh((("data", 8), ("model", 1)))
  fn = jax.jit(lambda k, x: swing.swing_features(k, x, g, np.ones(7), **kw))
  with mesh_lib.use(m8):
    assert "shard_map" in str(jax.make_jaxpr(fn)(jax.random.key(3), x))
    many = fn(jax.random.key(3), x)
    assert "shard_map" not in str(jax.make_jaxpr(fn)(jax.random.key(3), x[:44]))   # 44 nodes: not split
  np.testing.assert_array_equal(many.nodes, one.nodes)
  np.testing.assert_allclose(many.values, one.values, rtol=1e-5)  # jit vs eager rounding


def test_relaxed_step_expectation_matches_hard_proposal():
  x = jax.random.normal(jax.random.key(0), (100, 2))
  t = swing.precompute(jax.random.key(1), x, 0.7, 16, sigma2=2.0)
  p = jnp.tile(x[:1], (20000, 1))
  pts = swing.relaxed_step(jax.random.key(2), p, t, tau=0.05)
  probs = jax.nn.softmax(t.log_phi[0] + t.log_s)           # P(feature) of the hard step at node 0
  np.testing.assert_allclose(pts.mean(0), probs @ t.centroids, atol=0.03)
  grad = jax.grad(lambda q: swing.relaxed_step(jax.random.key(2), q, t, tau=0.5).sum())(x[:3])
  assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("chunk", [1, 5, 16, 48])
def test_swing_walks_in_node_chunks_are_bit_identical(chunk):
  """Walking the nodes `node_chunk` at a time (a padded last chunk included; sharded over 8 devices too) gives
  exactly the features of walking them all at once."""
  n = 48
  x = jax.random.normal(jax.random.key(0), (n, 3))
  g = igraph.normalise(igraph.IGraph("rbf", bandwidth=0.7), x, 0.5)
  kw = dict(n_walks=4, t_max=6, p_halt=0.5, m=16, impl="xla")
  whole = swing.swing_features(jax.random.key(3), x, g, np.ones(7), **kw)
  parts = swing.swing_features(jax.random.key(3), x, g, np.ones(7), node_chunk=chunk, **kw)
  np.testing.assert_array_equal(parts.nodes, whole.nodes)
  np.testing.assert_array_equal(parts.values, whole.values)
  with mesh_lib.use(mesh_lib.make_mesh((("data", 8), ("model", 1)))):
    sharded = swing.swing_features(jax.random.key(3), x, g, np.ones(7), node_chunk=chunk, **kw)
    sharded_whole = swing.swing_features(jax.random.key(3), x, g, np.ones(7), **kw)
  np.testing.assert_array_equal(sharded.nodes, sharded_whole.nodes)
  np.testing.assert_array_equal(sharded.values, sharded_whole.values)


@pytest.mark.parametrize("chunk,symmetric", [(7, True), (48, False)])
def test_streamed_kernel_matvec_equals_the_one_from_stored_features(chunk, symmetric):
  """K_hat v walked chunk by chunk (features never stored) equals grf.kernel_matvec on the two ensembles'
  features (the same walks; float rounding of the sums aside)."""
  n = 48
  x = jax.random.normal(jax.random.key(0), (n, 3))
  g = igraph.normalise(igraph.IGraph("rbf", bandwidth=0.7), x, 0.5)
  kw = dict(n_walks=4, t_max=6, p_halt=0.5, m=16, impl="xla")
  v = jax.random.normal(jax.random.key(5), (n,))
  k1, k2 = jax.random.split(jax.random.key(3))
  want = grf.kernel_matvec(swing.swing_features(k1, x, g, np.ones(7), **kw),
                           swing.swing_features(k2, x, g, np.ones(7), **kw), v, symmetric=symmetric)
  got = swing.swing_kernel_matvec(jax.random.key(3), x, g, np.ones(7), v, node_chunk=chunk, symmetric=symmetric, **kw)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
