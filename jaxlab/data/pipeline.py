"""Deterministic, index-based input pipeline with per-process slicing.

A batch is a pure function of (seed, step): sample position `step * B + j` reads element
`perm_e[(step * B + j) mod N]` of epoch `e`'s permutation. A resumed run therefore sees exactly the batches
an uninterrupted one would, with no iterator state to checkpoint. Each process reads only the rows of the
global batch that its devices hold (`process_rows`) and `to_global` assembles the sharded global array with
`jax.make_array_from_process_local_data`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Protocol

import jax
import numpy as np
from jax.sharding import NamedSharding

from jaxlab.errors import DataError


class Source(Protocol):
  """Random-access dataset: `len(source)` and `source[indices] -> {name: array (len(indices), ...)}`."""

  def __len__(self) -> int: ...

  def __getitem__(self, indices: np.ndarray) -> dict[str, np.ndarray]: ...


class ArraySource:
  """Random-access source over a dict of equal-length numpy arrays.

  Args:
    arrays: {name: array of shape (N, ...)}.
  """

  def __init__(self, arrays: Mapping[str, Any]):
    self.arrays = {k: np.asarray(v) for k, v in arrays.items()}
    lengths = {k: len(v) for k, v in self.arrays.items()}
    if not lengths or len(set(lengths.values())) != 1:
      raise DataError(f"ArraySource needs a non-empty dict of equal-length arrays, got lengths {lengths}")
    self._n = next(iter(lengths.values()))

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[indices] for k, v in self.arrays.items()}


class Batcher:
  """Global batches as a pure function of the step (shuffled epochs, seeded).

  Args:
    source: random-access dataset.
    global_batch: examples per step over all processes.
    seed: shuffling seed.
    shuffle: permute each epoch (else sequential order).
    transform: optional `batch dict -> batch dict` applied on the host (per process slice).
  """

  def __init__(self, source: Source, global_batch: int, *, seed: int = 0, shuffle: bool = True,
               transform: Callable[[dict], dict] | None = None):
    if len(source) == 0:
      raise DataError("the training source is empty")
    self.source, self.global_batch, self.seed, self.shuffle = source, global_batch, seed, shuffle
    self.transform = transform
    self._perms: dict[int, np.ndarray] = {}

  def _perm(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      n = len(self.source)
      if len(self._perms) > 4:
        self._perms.clear()
      self._perms[epoch] = (np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle
                            else np.arange(n))
    return self._perms[epoch]

  def indices(self, step: int) -> np.ndarray:
    """Dataset indices of the global batch of `step` (shape (global_batch,))."""
    n = len(self.source)
    pos = step * self.global_batch + np.arange(self.global_batch)
    epochs, within = np.divmod(pos, n)
    return np.concatenate([self._perm(int(e))[within[epochs == e]] for e in np.unique(epochs)])

  def local_batch(self, step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
    """The rows `rows` of the global batch of `step` (this process's part), transformed."""
    batch = self.source[self.indices(step)[rows]]
    return self.transform(batch) if self.transform else batch


def process_rows(sharding: NamedSharding, global_batch: int) -> slice:
  """Rows of a global batch that this process's devices hold under `sharding` (leading dim).

  Raises:
    DataError: when the rows are not one contiguous range (an unusual device order).
  """
  index_map = sharding.addressable_devices_indices_map((global_batch,))
  spans = sorted({(idx[0].start or 0, global_batch if idx[0].stop is None else idx[0].stop)
                  for idx in index_map.values()})
  lo, hi = spans[0][0], spans[-1][1]
  covered = sum(b - a for a, b in spans)
  if covered != hi - lo and not all(s == spans[0] for s in spans):
    raise DataError(f"this process's devices hold non-contiguous batch rows {spans}; use a mesh whose "
                    "data axis is laid out process by process (jax.make_mesh does this)")
  return slice(lo, hi)


def to_global(local: Mapping[str, np.ndarray], sharding: NamedSharding, global_batch: int) -> dict[str, jax.Array]:
  """Assembles process-local rows into global arrays sharded over the batch axis."""
  out = {}
  for k, v in local.items():
    v = np.asarray(v)
    out[k] = jax.make_array_from_process_local_data(sharding, v, (global_batch,) + v.shape[1:])
  return out


def eval_batches(source: Source, batch_size: int, rows: slice,
                 transform: Callable[[dict], dict] | None = None) -> Iterator[tuple[dict, np.ndarray]]:
  """Yields (local batch, local mask) covering every example once; the last batch is padded (mask 0).

  Args:
    source: random-access dataset.
    batch_size: global eval batch size.
    rows: this process's rows (from `process_rows`).
    transform: optional host-side transform.
  """
  n = len(source)
  for start in range(0, n, batch_size):
    idx = np.arange(start, start + batch_size)
    mask = (idx < n).astype(np.float32)
    idx = np.where(idx < n, idx, 0)
    batch = source[idx[rows]]
    yield (transform(batch) if transform else batch), mask[rows]
