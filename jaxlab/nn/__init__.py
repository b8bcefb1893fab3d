"""Shared Flax NNX modules, grouped by domain (papers add theirs here when a second paper can use them)."""

from jaxlab.nn.mamba import MambaBlock, MambaLayer, MambaLM, RMSNorm
from jaxlab.nn.mlp import MLP
from jaxlab.nn.multiscale import CoarseGrain, FractalMamba

__all__ = ["CoarseGrain", "FractalMamba", "MLP", "MambaBlock", "MambaLM", "MambaLayer", "RMSNorm"]
