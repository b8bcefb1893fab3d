"""Zeroth-order optimisation: MeZO / SPSA, random-mask sparse ZO and CurvZO over parameter pytrees.

Built on the `jaxlab.kernels.zo_perturb` kernel (z regenerated from a counter-based generator: the seed trick).
"""

from jaxlab.zo.blocks import (BlockLayout, bernoulli_blocks, block_sumsq_z, fixed_budget, make_budget, make_layout,
                              optimal_inclusion_probs, participation_budget)
from jaxlab.zo.estimators import directional_derivative, perturb_params, sparse_estimate, spsa
from jaxlab.zo.optim import METHODS, ZOOptimizer, ZOState, curvzo, make_step, mezo, sparse_zo, state_size

__all__ = ["BlockLayout", "METHODS", "ZOOptimizer", "ZOState", "bernoulli_blocks", "block_sumsq_z", "curvzo",
           "directional_derivative", "fixed_budget", "make_budget", "make_layout", "make_step", "mezo",
           "optimal_inclusion_probs", "participation_budget", "perturb_params", "sparse_estimate", "sparse_zo", "spsa",
           "state_size"]
