"""Mixed-integer linear programming: instances, benchmark generators and equivalent augmentations.

`instance` (the `Instance` arrays, LP/MPS files through HiGHS, conversion to and from PySCIPOpt), `generators`
(Gasse et al. 2019's set cover, combinatorial auction, capacitated facility location and independent set
benchmarks) and `augment` (reformulations that keep the LP relaxation and branching decisions) are numpy-only
and re-exported here. Importing this package never imports JAX or a solver: SCIP worker processes use it, and
highspy / pyscipopt are only imported by the functions that need them.

Separate submodules, imported explicitly: the SCIP branching environment (`scip_env`: observations, strong
branching, sampling and policy rules, solves), JAX-free collection workers with resumable shards (`collect`), the
graph-convolutional branching policy (`gcnn`, JAX), imitation training / evaluation helpers (`imitation`, JAX) and
node strata (`strata`: K-means with the elbow rule, scikit-learn) and SC-MILP's training pieces (`sc`: the
ramped contrastive weight, coarse-to-fine strata, the positive mask, imitation + SupCon).
"""

from __future__ import annotations

from jaxlab.milp.augment import (EquivMap, equivalent, map_candidates, permute, perturb, scale_objective, scale_rows,
                                 shift_variables)
from jaxlab.milp.generators import (GENERATORS, SIZES, barabasi_albert, capacitated_facility_location,
                                    combinatorial_auction, generate, greedy_clique_partition, independent_set,
                                    set_cover)
from jaxlab.milp.instance import Instance, from_scip, is_feasible, objective, read, to_scip, write

__all__ = [
    "Instance", "objective", "is_feasible", "read", "write", "to_scip", "from_scip",
    "GENERATORS", "SIZES", "generate", "set_cover", "combinatorial_auction", "capacitated_facility_location",
    "independent_set", "barabasi_albert", "greedy_clique_partition",
    "EquivMap", "permute", "scale_rows", "shift_variables", "scale_objective", "equivalent", "perturb",
    "map_candidates",
]
