"""One folder per paper (installed as `jaxlab.experiments`): config.py, train.py, method.py, README.md.

Run from the repository root, python finds this folder as a top-level `experiments` (the working directory comes
first on sys.path), ahead of any installed package of that name. Imported under that name, this file hands the
import to the installed package, found without the repository root on sys.path, or fails with one clear line.
"""

if __name__ == "experiments":
  import importlib, os, sys  # pylint: disable=g-import-not-at-top,multiple-imports
  _root, _path = os.path.dirname(os.path.dirname(os.path.realpath(__file__))), sys.path[:]
  sys.path[:] = [p for p in _path if os.path.realpath(p) != _root]   # '' and '.' resolve to the cwd
  del sys.modules[__name__]
  try:
    importlib.import_module(__name__)   # now sys.modules[__name__], which the import statement returns
  except ModuleNotFoundError as e:
    if e.name != __name__:
      raise
    raise ModuleNotFoundError(f"No module named {__name__!r} (the repository's experiments/ folder is "
                              "jaxlab.experiments; import that)", name=__name__) from None
  finally:
    sys.path[:] = _path
