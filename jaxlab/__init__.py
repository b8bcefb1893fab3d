"""jaxlab: an accelerator-first JAX/Flax research codebase for a set of ICML 2026 papers.

The shared library (configs, meshes, sharded train states, the resumable loop, checkpoints, metrics,
data pipelines) lives here; Pallas kernels under `jaxlab.kernels`; one experiment per paper under
`jaxlab.experiments`. The library never imports the experiments.
"""

__version__ = "0.1.0"
