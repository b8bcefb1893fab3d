"""Sampling many examples in fixed-size chunks sharded over the batch axis of the mesh (one compile).

    for start, x in generate.chunks(sampler, noise_fn, labels, key, mesh, batch_size=512):
      out[start:start + len(x)] = x

`sampler(noise, labels) -> samples` is the caller's jitted function (any pytree of noise, e.g. one array or a
dict of streams); `noise_fn(key, n)` draws the starting noise of a chunk of n rows from the chunk's key
`fold_in(key, chunk index)`. Chunks are padded to a multiple of the mesh's data axis (the padding rows are
dropped from what is yielded), so the sampler compiles for the full chunk and, at most, once more for the
last one.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import mesh as mesh_lib


def chunk_size(batch_size: int, mesh) -> int:
  """batch_size rounded up to a multiple of the mesh's data axis."""
  data = dict(mesh.shape).get("data", 1) if mesh is not None else 1
  return -(-int(batch_size) // data) * data


def chunks(sampler: Callable[[Any, jax.Array], Any], noise_fn: Callable[[jax.Array, int], Any], labels,
           key: jax.Array, mesh, batch_size: int) -> Iterator[tuple[int, Any]]:
  """Yields (start row, samples as numpy) for `labels` (N,) in chunks of `chunk_size(batch_size, mesh)` rows."""
  labels = np.asarray(labels, np.int32)
  bsh = mesh_lib.batch_sharding(mesh, mesh_lib.current_rules())
  chunk = chunk_size(batch_size, mesh)
  data = chunk_size(1, mesh)
  for i, start in enumerate(range(0, len(labels), chunk)):
    y = labels[start:start + chunk]
    n = len(y)
    pad = -(-n // data) * data
    y = np.concatenate([y, np.zeros(pad - n, np.int32)])
    noise = noise_fn(jax.random.fold_in(key, i), pad)
    x = sampler(jax.device_put(noise, bsh), jax.device_put(jnp.asarray(y), bsh))
    yield start, jax.tree.map(lambda a: np.asarray(a)[:n], jax.device_get(x))
