"""Optimal transport: closed-form Gaussian (Bures-Wasserstein) barycenters, maps and geodesics."""

from jaxlab.ot import gaussian
from jaxlab.ot.gaussian import (Barycenter, bures_barycenter, bures_wasserstein2, gaussian_map, geodesic_map,
                                ledoit_wolf, partial_transport, pooled_pca, push_forward, spd_floor, sqrtm,
                                sqrtm_psd, symmetrize)

__all__ = ["gaussian", "Barycenter", "bures_barycenter", "bures_wasserstein2", "gaussian_map", "geodesic_map",
           "ledoit_wolf", "partial_transport", "pooled_pca", "push_forward", "spd_floor", "sqrtm", "sqrtm_psd",
           "symmetrize"]
