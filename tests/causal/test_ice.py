"""ICE / PD / centred-ICE / dispersion against a brute-force loop over windows and grid values."""

import jax
import numpy as np
import pytest

from jaxlab.causal import ice
from jaxlab.causal.navar import Navar


@pytest.mark.parametrize("kind,lag", [("mlp", 1), pytest.param("mlp", 2, marks=pytest.mark.slow),
                                      pytest.param("lstm", 1, marks=pytest.mark.slow)])
def test_response_curves_match_brute_force(kind, lag):
  m = Navar(n=3, lags=3, hidden=5, kind=kind)
  params = m.init(jax.random.key(0))
  x = np.random.default_rng(0).normal(size=(11, 3, 3)).astype(np.float32)
  grid = ice.grids(x, lag, 7)
  # max_elements small enough to force one source per chunk
  out = ice.response_curves(m, params, x, grid, lag, keep_ice=4, max_elements=7 * 11 * 3)
  n, g, b = 3, 7, 11
  windows, where = [], []
  for i in range(n):
    for gi in range(g):
      for r in range(b):
        xm = x[r].copy()
        xm[i, 3 - lag] = grid[i, gi]
        windows.append(xm)
        where.append((i, r, gi))
  c = np.asarray(jax.jit(m.contributions)(params, np.stack(windows)))    # the full model on every modified window
  brute = np.zeros((n, n, b, g))
  for (i, r, gi), row in zip(where, c):
    brute[i, :, r, gi] = row[i, :]
  pd = brute.mean(2)
  ref = g // 2
  cice = brute - brute[..., ref:ref + 1]
  disp = np.sqrt(cice.var(2).mean(-1))
  np.testing.assert_allclose(out["pd"], pd, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out["cpd"], pd - pd[..., ref:ref + 1], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out["dispersion"], disp, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(out["ice"], brute[:, :, :4], rtol=1e-5, atol=1e-6)


def test_grid_spans_the_quantiles():
  x = np.random.default_rng(1).normal(size=(500, 2, 3))
  g = ice.grids(x, 1, 11, (0.05, 0.95))
  np.testing.assert_allclose(g[:, 0], np.quantile(x[:, :, -1], 0.05, axis=0), rtol=1e-5)
  np.testing.assert_allclose(g[:, -1], np.quantile(x[:, :, -1], 0.95, axis=0), rtol=1e-5)
  assert np.allclose(np.diff(g, axis=1), np.diff(g, axis=1)[:, :1], rtol=1e-4)


def test_bands_are_pointwise_quantiles():
  pd = np.random.default_rng(2).normal(size=(9, 2, 2, 5))
  lo, hi = ice.bands(pd, (0.1, 0.9), centre=2)
  c = pd - pd[..., 2:3]
  for idx in np.ndindex(2, 2, 5):
    vals = c[(slice(None),) + idx]
    assert lo[idx] == pytest.approx(np.percentile(vals, 10)) and hi[idx] == pytest.approx(np.percentile(vals, 90))
  assert np.all(lo[..., 2] == 0)


def test_homogeneous_additive_function_has_zero_dispersion():
  """A source network that ignores the other lags gives parallel ICE curves (dispersion 0)."""
  m = Navar(n=2, lags=2, hidden=4)
  params = m.init(jax.random.key(5))
  params["src"]["w1"] = params["src"]["w1"].at[:, 0, :].set(0.0)   # lag 2 unused -> no state dependence
  x = np.random.default_rng(5).normal(size=(30, 2, 2)).astype(np.float32)
  out = ice.response_curves(m, params, x, ice.grids(x, 1, 9), 1)
  assert np.max(out["dispersion"]) < 1e-6
