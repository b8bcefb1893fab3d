"""ZO perturbation `x + scale * w * z` with z regenerated from a counter-based generator (Philox-4x32-10): reference and Pallas kernel."""

from jaxlab.kernels.zo_perturb.kernel import BlockSizes
from jaxlab.kernels.zo_perturb.ops import IMPLS, leaf_offsets, normal, num_blocks, perturb, perturb_tree
from jaxlab.kernels.zo_perturb.reference import normal_at, perturb_ref

__all__ = ["BlockSizes", "IMPLS", "leaf_offsets", "normal", "normal_at", "num_blocks", "perturb", "perturb_ref",
           "perturb_tree"]
