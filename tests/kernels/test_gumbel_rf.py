"""SWING's fused Gumbel-max walk step: kernel == reference (same bits), correct distributions, lowering."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.graphs import swing
from jaxlab.kernels import gumbel_rf
from jaxlab.kernels.gumbel_rf import reference


def setup_case(n, d, m, walkers, seed=0):
  x = jax.random.normal(jax.random.key(seed), (n, d))
  t = swing.precompute(jax.random.key(seed + 1), x, 0.7, m, sigma2=2.0)
  cur = jax.random.randint(jax.random.key(seed + 2), (walkers,), 0, n)
  load = jax.random.uniform(jax.random.key(seed + 3), (walkers,), minval=0.5, maxval=2.0)
  wid = jnp.arange(walkers, dtype=jnp.int32) * 3 + 1
  return x, t, cur, load, wid


_STEP_CASES = [(300, 3, 64, 500, "rbf"), (97, 5, 20, 130, "eps"), (64, 2, 16, 64, "smooth_step")]


@pytest.mark.parametrize("impl,n,d,m,walkers,kind", [
    pytest.param(impl, *case, marks=[pytest.mark.slow] if impl == "xla" and case[-1] != "smooth_step" else [])
    for impl in ("xla", "interpret") for case in _STEP_CASES], ids=str)   # the slow ones: ~15 s compiles each
def test_step_matches_reference_bit_for_bit(impl, n, d, m, walkers, kind):
  x, t, cur, load, wid = setup_case(n, d, m, walkers)
  kw = dict(kind=kind, bandwidth=0.7, eps=0.9, sharpness=0.1, scale=0.2, lam=0.8, p_halt=0.5)
  want = jax.jit(lambda *a: reference.walk_step_ref(*a, **kw))(cur, load, wid, 7, 3, t.log_phi, t.log_s, t.cdf, x)
  got = gumbel_rf.walk_step(cur, load, wid, 7, 3, t.log_phi, t.log_s, t.cdf, x, impl=impl, block_walkers=64, **kw)
  np.testing.assert_array_equal(got[0], want[0])  # next node: identical random bits and choices
  np.testing.assert_array_equal(got[3], want[3])  # chosen feature
  np.testing.assert_allclose(got[1], want[1], rtol=2e-5, atol=1e-7)
  np.testing.assert_allclose(got[2], want[2], rtol=2e-5, atol=1e-9)


def test_proposal_distributions():
  """Features follow softmax(log phi(x_v) + log S); nodes follow the stated q(u | v); q sums to 1."""
  x, t, _, _, _ = setup_case(200, 3, 32, 1)
  n, walkers = 200, 40000
  f = jax.jit(lambda s: gumbel_rf.walk_step(jnp.zeros((walkers,), jnp.int32), jnp.ones((walkers,)),
                                            jnp.arange(walkers, dtype=jnp.int32), s, 0, t.log_phi, t.log_s,
                                            t.cdf, x, impl="xla", lam=0.8))
  nxt, _, q, feat = f(jnp.uint32(11))
  p_feat = np.asarray(jax.nn.softmax(t.log_phi[0] + t.log_s))
  emp = np.bincount(np.asarray(feat), minlength=32) / walkers
  assert 0.5 * np.abs(emp - p_feat).sum() < 0.02
  lphi0 = t.log_phi[0]
  q_all = 0.8 * jnp.exp(jax.nn.logsumexp(lphi0[None] + t.log_phi, 1) - jax.nn.logsumexp(lphi0 + t.log_s)) + 0.2 / n
  assert abs(float(q_all.sum()) - 1.0) < 1e-5
  np.testing.assert_allclose(q, q_all[nxt], rtol=1e-5)
  emp_n = np.bincount(np.asarray(nxt), minlength=n) / walkers
  assert 0.5 * np.abs(emp_n - np.asarray(q_all)).sum() < 0.06  # sampling noise ~0.035 at this size


def test_hash_uniforms_are_uniform_and_decorrelated():
  u = reference.hash_uniform(jnp.uint32(3), jnp.uint32(1), jnp.arange(100000, dtype=jnp.uint32)[:, None],
                             jnp.arange(2, dtype=jnp.uint32)[None, :])
  u = np.asarray(u)
  assert 0.0 < u.min() and u.max() < 1.0
  assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
  assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.01
  hist = np.histogram(u[:, 0], bins=20, range=(0, 1))[0] / 100000
  assert np.max(np.abs(hist - 0.05)) < 0.004


def test_bad_inputs_and_impls():
  x, t, cur, load, wid = setup_case(50, 2, 8, 10)
  with pytest.raises(ValueError, match="tables disagree"):
    gumbel_rf.walk_step(cur, load, wid, 1, 1, t.log_phi, t.log_s, t.cdf[:4], x, impl="xla")
  with pytest.raises(ValueError, match="must be \\(walkers,\\)"):
    gumbel_rf.walk_step(cur, load[:3], wid, 1, 1, t.log_phi, t.log_s, t.cdf, x, impl="xla")
  if jax.default_backend() == "cpu":
    with pytest.raises(ValueError, match="needs a GPU"):
      gumbel_rf.walk_step(cur, load, wid, 1, 1, t.log_phi, t.log_s, t.cdf, x, impl="pallas")


def test_kernel_lowers_to_triton_without_a_gpu():
  from jaxlab.kernels.gumbel_rf import kernel
  S = jax.ShapeDtypeStruct
  n, m, d, w = 100000, 256, 3, 400000
  args = (S((w,), jnp.int32), S((w,), jnp.float32), S((w,), jnp.int32), S((), jnp.uint32), S((), jnp.uint32),
          S((n, m), jnp.float32), S((m,), jnp.float32), S((m, n), jnp.float32), S((n, d), jnp.float32))
  text = jax.jit(lambda *a: kernel.walk_step(*a, block_walkers=128)).trace(*args).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "__gpu$xla.gpu.triton" in text
