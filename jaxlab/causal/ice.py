"""Causal response functions of an additive model: ICE, partial dependence, centred ICE, dispersion, bands.

For the edge i -> j and lag l, take every observed window x^(n), set x_i at lag l to v for each v on a grid,
and record the contribution c_{i->j}(x^(n)[x_i,l := v]); each window gives one Individual Conditional
Expectation (ICE) curve. Because NAVAR is additive, only source i's network has to be re-run, and its
output is every target's contribution at once: one ICE evaluation per (source, grid value, window) gives the
curves of all N targets.

    PD_ij(v)   = mean_n ICE_ij^(n)(v)                          (partial dependence)
    cICE^(n)(v) = ICE^(n)(v) - ICE^(n)(v_ref)                   (centred at the grid's middle point)
    disp_ij    = sqrt( mean_v var_n cICE_ij^(n)(v) )            (between-state spread of the curves)

For NAVAR the spread can only come from the source's other lags (its own state): a homogeneous edge has
parallel curves (disp ~ 0), a regime-dependent one fans out. Bands over retrainings: pointwise quantiles of
the PD across an ensemble of models (bootstrap resamples + re-initialisation).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.causal.navar import Navar, Params


def grids(x_bnk: np.ndarray, lag: int = 1, size: int = 25, quantiles: tuple[float, float] = (0.05, 0.95)) -> np.ndarray:
  """Evenly spaced grid between the quantiles of each variable's lag-`lag` values.

  Args:
    x_bnk: (B, N, K) windows.
    lag: 1 = the most recent lag.
    size: G grid points.
    quantiles: (low, high).

  Returns:
    (N, G) float32.
  """
  v = np.asarray(x_bnk)[:, :, -lag]
  lo, hi = np.quantile(v, quantiles[0], axis=0), np.quantile(v, quantiles[1], axis=0)
  return np.linspace(lo, hi, size, axis=1).astype(np.float32)


def ice_source(model: Navar, p_src: Params, x_bk: jax.Array, grid_g: jax.Array, lag: int = 1) -> jax.Array:
  """ICE curves of one source to every target.

  Args:
    model: the architecture.
    p_src: the source's parameters (`navar.source_params(params, i)`).
    x_bk: (B, K) the source's lag windows.
    grid_g: (G,) values for the lag-`lag` input.
    lag: which lag is varied.

  Returns:
    (G, B, N_tgt): [g, n, j] = c_{i->j}(x^(n) with x_i,lag := grid[g]).
  """
  col = model.lags - lag

  def at(v):
    return model.source_contributions(p_src, x_bk.at[:, col].set(v))

  return jax.vmap(at)(grid_g)


@functools.partial(jax.jit, static_argnames=("model", "lag", "ref_index", "keep"))
def _chunk_curves(model, p_chunk, x_sbk, grid_sg, *, lag, ref_index, keep):
  ice = jax.vmap(lambda p, x, g: ice_source(model, p, x, g, lag))(p_chunk, x_sbk, grid_sg)   # (S, G, B, N)
  pd = ice.mean(2)                                                                          # (S, G, N)
  cice = ice - ice[:, ref_index:ref_index + 1]
  disp = jnp.sqrt(jnp.mean(jnp.var(cice, axis=2), axis=1))                                  # (S, N)
  sample = jnp.transpose(ice[:, :, :keep], (0, 3, 2, 1))                                   # (S, N, keep, G)
  return jnp.transpose(pd, (0, 2, 1)), disp, sample


def response_curves(model: Navar, params: Params, x_bnk, grid_ng, lag: int = 1, keep_ice: int = 0,
                    max_elements: int = 2 ** 25) -> dict:
  """ICE / PD / centred-ICE summaries for every edge, sources processed in chunks that fit `max_elements`.

  Args:
    model: the architecture.
    params: its parameters.
    x_bnk: (B, N, K) windows the curves are computed on (the training windows).
    grid_ng: (N, G) grid per source (see `grids`).
    lag: the varied lag.
    keep_ice: also return the first `keep_ice` raw ICE curves of every edge (for plots).
    max_elements: bound on S * G * B * N floats evaluated at once.

  Returns:
    {"pd": (N_src, N_tgt, G), "cpd": PD minus its value at the reference point, "dispersion": (N_src, N_tgt),
     "ref_index": int, "ice": (N_src, N_tgt, keep_ice, G) when keep_ice} as numpy arrays.
  """
  x = jnp.asarray(x_bnk, jnp.float32)
  b, n, _ = x.shape
  g = grid_ng.shape[1]
  ref = g // 2
  keep = int(min(keep_ice, b))
  per_source = g * b * n
  chunk = int(max(1, min(n, max_elements // max(per_source, 1))))
  pds, disps, samples = [], [], []
  grid = jnp.asarray(grid_ng, jnp.float32)
  for s0 in range(0, n, chunk):
    s1 = min(n, s0 + chunk)
    p_chunk = jax.tree.map(lambda a: a[s0:s1], params["src"])
    pd, disp, sample = _chunk_curves(model, p_chunk, jnp.transpose(x[:, s0:s1], (1, 0, 2)), grid[s0:s1],
                                     lag=lag, ref_index=ref, keep=keep)
    pds.append(np.asarray(pd))
    disps.append(np.asarray(disp))
    samples.append(np.asarray(sample))
  pd = np.concatenate(pds)
  out = {"pd": pd, "cpd": pd - pd[:, :, ref:ref + 1], "dispersion": np.concatenate(disps), "ref_index": ref}
  if keep:
    out["ice"] = np.concatenate(samples)
  return out


def heterogeneity(dispersion: np.ndarray, pd: np.ndarray) -> np.ndarray:
  """ICE dispersion relative to the PD's own spread over the grid (0 = homogeneous edge)."""
  return dispersion / (pd.std(-1) + 1e-12)


def bands(pd_mnjg: np.ndarray, quantiles: tuple[float, float] = (0.05, 0.95), centre: int | None = None) -> tuple:
  """Pointwise quantile bands of PD curves over an ensemble of retrainings.

  Args:
    pd_mnjg: (M, N, N, G) PD curves of M models.
    quantiles: (low, high).
    centre: if given, centre each curve at this grid index first (bands of the curve's shape).

  Returns:
    (low, high), each (N, N, G).
  """
  p = np.asarray(pd_mnjg)
  if centre is not None:
    p = p - p[..., centre:centre + 1]
  return np.quantile(p, quantiles[0], axis=0), np.quantile(p, quantiles[1], axis=0)
