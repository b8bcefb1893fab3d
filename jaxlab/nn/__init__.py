"""Shared Flax NNX modules, grouped by domain (papers add theirs here when a second paper can use them).

`jaxlab.nn.layers` holds the building blocks every model here uses (initialisers, logically partitioned
dense layers, norms, embeddings) and `jaxlab.nn.attention` the one attention entry point (einsum, chunked,
TPU splash, GPU flash / cuDNN); `mamba` / `mamba_lm` / `mamba_hf` the Mamba-1 block, LM and checkpoint IO.
"""

from jaxlab.nn.layers import LayerNorm, RMSNorm
from jaxlab.nn.mamba import MambaBlock, MambaLayer
from jaxlab.nn.mamba_lm import MambaLM
from jaxlab.nn.mlp import MLP
from jaxlab.nn.multiscale import CoarseGrain, FractalMamba

__all__ = ["CoarseGrain", "FractalMamba", "LayerNorm", "MLP", "MambaBlock", "MambaLM", "MambaLayer", "RMSNorm"]
