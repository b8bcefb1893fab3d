"""Block layouts, water-filling inclusion probabilities, budgets and block statistics (vs numpy references)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import zo
from jaxlab.errors import ConfigError
from jaxlab.kernels import zo_perturb


def _waterfill_reference(signal, sizes, k, pmin):
  """Exact water-filling by enumerating how many of the largest blocks are clipped at 1 (numpy)."""
  s = np.sqrt(signal)
  order = np.argsort(-s)
  d = sizes.sum()
  k = min(max(k, pmin * d), d)
  for n_top in range(len(s) + 1):
    top = order[:n_top]
    rest = np.setdiff1d(np.arange(len(s)), top)
    # rest: pi = max(c s, pmin); solve sum sizes pi = k - sizes[top].sum() for c by bisection on a monotone map
    target = k - sizes[top].sum()
    lo, hi = 0.0, 1e12
    for _ in range(300):
      c = 0.5 * (lo + hi)
      if (sizes[rest] * np.maximum(c * s[rest], pmin)).sum() > target:
        hi = c
      else:
        lo = c
    pi = np.ones(len(s))
    pi[rest] = np.maximum(c * s[rest], pmin)
    if np.all(pi[rest] <= 1 + 1e-9):
      return np.minimum(pi, 1.0)
  raise AssertionError("no water level")


def test_layout_rows_and_chunks():
  tree = {"a": jnp.zeros((3, 4)), "b": jnp.zeros((10,)), "c": jnp.zeros((2, 2, 5))}
  lay = zo.make_layout(tree, 4)
  assert lay.leaf_num_blocks == (3, 3, 5) and lay.leaf_starts == (0, 3, 6) and lay.num_blocks == 11
  np.testing.assert_array_equal(lay.sizes, [4, 4, 4, 4, 4, 2, 4, 4, 4, 4, 4])
  rows = zo.make_layout(tree, "row")
  assert rows.leaf_block_sizes == (4, 10, 5) and rows.leaf_num_blocks == (3, 1, 4) and rows.dim == 42
  assert list(rows.block_of_leaf()) == [0, 0, 0, 1, 2, 2, 2, 2]
  with pytest.raises(ConfigError, match="block_size"):
    zo.make_layout(tree, 0)


@pytest.mark.parametrize("pmin,density", [(0.0, 0.1), (0.05, 0.1), (0.02, 0.3)])
def test_water_filling_matches_an_exact_reference(pmin, density):
  rng = np.random.default_rng(0)
  signal = np.exp(3.0 * rng.standard_normal(50))
  sizes = rng.integers(5, 30, 50).astype(np.float64)
  k = density * sizes.sum()
  pi = np.asarray(zo.optimal_inclusion_probs(jnp.asarray(signal), jnp.asarray(sizes), k, pmin))
  want = _waterfill_reference(signal, sizes, k, pmin)
  np.testing.assert_allclose(pi, want, rtol=2e-4, atol=1e-6)
  assert abs((pi * sizes).sum() - k) < 1e-3 * k and pi.min() >= pmin - 1e-7 and pi.max() <= 1.0
  # proportional to sqrt(signal) wherever not clipped
  free = (pi > pmin + 1e-6) & (pi < 1 - 1e-6)
  ratio = pi[free] / np.sqrt(signal[free])
  np.testing.assert_allclose(ratio, ratio[0], rtol=1e-3)


def test_water_filling_edge_cases():
  sizes = jnp.full((4,), 10.0)
  np.testing.assert_allclose(zo.optimal_inclusion_probs(jnp.zeros(4), sizes, 8.0), 0.2, rtol=1e-5)   # no signal
  np.testing.assert_allclose(zo.optimal_inclusion_probs(jnp.arange(1.0, 5.0), sizes, 100.0), 1.0)     # all in
  np.testing.assert_allclose(zo.optimal_inclusion_probs(jnp.arange(4.0), sizes, 0.0, 0.1), 0.1, rtol=1e-5)  # floor


def test_budgets():
  sizes = jnp.asarray([10.0, 10.0, 20.0])
  s = jnp.asarray([4.0, 1.0, 0.0])
  assert float(zo.fixed_budget(0.25)(s, sizes)) == pytest.approx(10.0)
  r = np.sqrt([4.0, 1.0, 0.0])
  d_eff = (np.sum([10, 10, 20] * r)) ** 2 / np.sum(np.array([10, 10, 20]) * r * r)  # participation ratio
  fn = zo.participation_budget(0.5, min_density=1e-6, max_density=1.0)
  assert float(fn(s, sizes)) == pytest.approx(0.5 * d_eff, rel=1e-5)
  flat = fn(jnp.ones(3), sizes)
  assert float(flat) == pytest.approx(0.5 * 40, rel=1e-5)          # flat curvature: d_eff = d
  with pytest.raises(ConfigError):
    zo.fixed_budget(0.0)
  with pytest.raises(ConfigError):
    zo.make_budget("nope")


def test_block_sumsq_z_matches_the_perturbation_z():
  tree = {"a": jnp.zeros((7, 3)), "b": jnp.zeros((10,))}
  lay = zo.make_layout(tree, 4)
  offs = zo_perturb.leaf_offsets(tree)
  got = np.asarray(jax.jit(lambda s: zo.block_sumsq_z(lay, s, offs))(jnp.uint32(5)))
  z = np.concatenate([np.asarray(zo_perturb.normal((21,), 5, 0)), np.asarray(zo_perturb.normal((10,), 5, 21))])
  want = ([np.sum(z[:21][i:i + 4] ** 2) for i in range(0, 21, 4)]
          + [np.sum(z[21:][i:i + 4] ** 2) for i in range(0, 10, 4)])
  np.testing.assert_allclose(got, want, rtol=1e-5)
