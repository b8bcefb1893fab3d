"""A local cache of small trained modules (judges, frozen encoders): trained once, keyed by what they depend on.

    path = cache.path("judges", f"digits_judge_{cache.digest(spec)}.npz", root=config.judge.cache_dir)
    judge, cached = cache.load_or_build(path, abstract=lambda: make(nnx.Rngs(0)), build=lambda: train(...))

The root is the given directory, else `$JAXLAB_CACHE_DIR`, else `~/.cache/jaxlab`. A module is stored as an
.npz of its state (one array per variable path), written to a temporary file and renamed, so an interrupted
write leaves no partial file; a file whose variables or shapes do not match the module is a `DataError` (delete
it to rebuild) rather than a silent retrain.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util

from jaxlab.errors import DataError


def root(override: str = "") -> str:
  """`override`, else $JAXLAB_CACHE_DIR, else ~/.cache/jaxlab."""
  return override or os.environ.get("JAXLAB_CACHE_DIR") or os.path.expanduser("~/.cache/jaxlab")


def path(sub: str, name: str, root_dir: str = "") -> str:
  """root(root_dir)/sub/name."""
  return os.path.join(root(root_dir), sub, name)


def digest(spec: Any) -> str:
  """16 hex digits of the sha256 of `spec` as sorted JSON (non-JSON values by their str)."""
  return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _flat(state) -> dict[str, Any]:
  return {"/".join(map(str, k)): v for k, v in traverse_util.flatten_dict(state.to_pure_dict()).items()}


def save_module(file: str, module: nnx.Module) -> None:
  """The module's state as an .npz (atomically: a temporary file in the same folder, then renamed)."""
  os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(file) or ".", suffix=".npz")
  os.close(fd)
  try:
    np.savez(tmp, **{k: np.asarray(v) for k, v in _flat(nnx.state(module)).items()})
    os.replace(tmp, file)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def load_module(file: str, abstract: Callable[[], nnx.Module], what: str = "module") -> nnx.Module:
  """The module built by `abstract` (evaluated by shape only) with the state stored in `file`."""
  graphdef, state = nnx.split(nnx.eval_shape(abstract))
  want = traverse_util.flatten_dict(state.to_pure_dict())
  keys = {"/".join(map(str, k)): k for k in want}
  with np.load(file) as f:
    stored = {k: f[k] for k in f.files}
  if set(stored) != set(keys) or any(stored[k].shape != want[keys[k]].shape for k in keys):
    raise DataError(f"{what} cache {file} does not match the current settings (delete it to rebuild)")
  state.replace_by_pure_dict(traverse_util.unflatten_dict({keys[k]: jnp.asarray(v) for k, v in stored.items()}))
  return nnx.merge(graphdef, state)


def load_or_build(file: str, abstract: Callable[[], nnx.Module], build: Callable[[], nnx.Module],
                  what: str = "module") -> tuple[nnx.Module, bool]:
  """(module, loaded from the cache): `file` when it exists, else `build()` saved to `file`."""
  if os.path.exists(file):
    return load_module(file, abstract, what), True
  module = build()
  jax.block_until_ready(nnx.state(module))
  save_module(file, module)
  return module, False
