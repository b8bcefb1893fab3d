"""Graphs: implicit graphs, graph random features (GRFs) and SWING."""

from jaxlab.graphs import grf, igraph, swing
from jaxlab.graphs.grf import (WalkFeatures, alpha_coefficients, dense_estimate, exact_kernel, kernel_matvec,
                               modulation_from_alpha)
from jaxlab.graphs.igraph import IGraph, materialise
from jaxlab.graphs.swing import SwingTables, precompute, swing_features

__all__ = ["grf", "igraph", "swing", "WalkFeatures", "alpha_coefficients", "dense_estimate", "exact_kernel", "kernel_matvec",
           "modulation_from_alpha", "IGraph", "materialise", "SwingTables", "precompute", "swing_features"]
