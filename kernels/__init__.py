"""Pallas kernels beside their pure-JAX references (installed as `jaxlab.kernels`).

Each kernel lives in `kernels/<op>/`: `reference.py` (pure jnp, the spec), `kernel.py` (Pallas with
BlockSizes), `ops.py` (dispatcher: impl in auto|xla|pallas|interpret, custom_vjp), `bench.py`
(`BENCHMARKS` for `python -m jaxlab.bench`), and `__init__.py` re-exporting the op. `sharding.py` reads the
run's mesh and logical-axis rules from the context (the wrappers that shard a Pallas call need them; the
kernels never import the library).
"""
