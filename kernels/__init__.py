"""Pallas kernels beside their pure-JAX references (installed as `jaxlab.kernels`).

Each kernel lives in `kernels/<op>/`: `reference.py` (pure jnp, the spec), `kernel.py` (Pallas with
BlockSizes), `ops.py` (dispatcher: impl in auto|xla|pallas|interpret, custom_vjp), `bench.py`
(`BENCHMARKS` for `python -m jaxlab.bench`), and `__init__.py` re-exporting the op. `sharding.py` reads the
run's mesh and logical-axis rules from the context (the wrappers that shard a Pallas call need them; the
kernels never import the library).

Run from the repository root, python finds this folder as a top-level `kernels` (the working directory comes
first on sys.path), ahead of the installed package of that name (Hugging Face's `kernels`, which transformers
imports). Imported under that name, this file hands the import to the installed package, found without the
repository root on sys.path, or fails with one clear line.
"""

if __name__ == "kernels":
  import importlib, os, sys  # pylint: disable=g-import-not-at-top,multiple-imports
  _root, _path = os.path.dirname(os.path.dirname(os.path.realpath(__file__))), sys.path[:]
  sys.path[:] = [p for p in _path if os.path.realpath(p) != _root]   # '' and '.' resolve to the cwd
  del sys.modules[__name__]
  try:
    importlib.import_module(__name__)   # now sys.modules[__name__], which the import statement returns
  except ModuleNotFoundError as e:
    if e.name != __name__:
      raise
    raise ModuleNotFoundError(f"No module named {__name__!r} (the repository's kernels/ folder is jaxlab.kernels; "
                              "import that)", name=__name__) from None
  finally:
    sys.path[:] = _path
