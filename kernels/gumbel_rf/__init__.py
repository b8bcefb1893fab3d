"""SWING's fused Gumbel-max random-feature walk step: pure-JAX reference and Pallas kernel."""

from jaxlab.kernels.gumbel_rf.ops import IMPLS, walk_step
from jaxlab.kernels.gumbel_rf.reference import hash_uniform, walk_step_ref

__all__ = ["IMPLS", "walk_step", "walk_step_ref", "hash_uniform"]
