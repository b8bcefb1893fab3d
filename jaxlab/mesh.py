"""Device meshes and the mapping from logical axis names to mesh axes.

Models annotate parameters with LOGICAL axis names (`nnx.with_partitioning(init, ("embed", "mlp"))`);
`config.sharding_rules` maps each logical name to a mesh axis (or None = replicated), so the same model
runs data-parallel, tensor-parallel or FSDP by changing the config only.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxlab import configs
from jaxlab.errors import ConfigError


def make_mesh(mesh_spec: Sequence[Sequence[Any]] = (("data", -1), ("model", 1)), devices=None) -> Mesh:
  """Builds a `Mesh` from `config.mesh`, resolving one -1 to the remaining devices.

  Args:
    mesh_spec: pairs (axis_name, size), e.g. `(("data", -1), ("model", 2))`.
    devices: devices to use (default: all global devices, in the topology-aware order of
      `jax.make_mesh`); a mesh smaller than them takes the first ones (single-process runs only).

  Returns:
    A mesh whose axes are of type Auto (sharding propagated by the compiler).
  """
  devices = list(jax.devices() if devices is None else devices)
  pairs = configs.mesh_shape(mesh_spec, len(devices))
  names = tuple(n for n, _ in pairs)
  shape = tuple(s for _, s in pairs)
  if math.prod(shape) < len(devices):
    if jax.process_count() > 1:
      raise ConfigError(f"config.mesh {dict(pairs)} uses {math.prod(shape)} of {len(devices)} devices; a "
                        "multi-process run must use all of them (set one axis to -1)")
    devices = devices[: math.prod(shape)]
  auto = (jax.sharding.AxisType.Auto,) * len(names)
  if len(devices) == jax.device_count():
    return jax.make_mesh(shape, names, axis_types=auto, devices=devices)
  return Mesh(np.asarray(devices).reshape(shape), names, axis_types=auto)


def logical_to_mesh(spec: P | Sequence[Any] | None, rules: Sequence[Sequence[Any]], mesh: Mesh | None = None) -> P:
  """Maps a PartitionSpec of logical names to one of mesh axes.

  Logical names missing from `rules` are replicated; a mesh axis of size 1 is dropped; a mesh axis is
  used at most once per spec (later dims fall back to replicated).

  Args:
    spec: logical spec, e.g. `P("embed", "mlp")`, or None (replicated).
    rules: `config.sharding_rules`, pairs (logical_name, mesh_axis or tuple of axes or None).
    mesh: when given, axes missing from it or of size 1 are dropped.

  Returns:
    The mesh-axis PartitionSpec.
  """
  if spec is None:
    return P()
  table = {str(k): v for k, v in rules}
  used: set[str] = set()
  out = []
  for entry in spec:
    names = entry if isinstance(entry, (tuple, list)) else (entry,)
    axes = []
    for name in names:
      if name is None:
        continue
      target = table.get(name)
      for ax in (target,) if isinstance(target, str) else (target or ()):
        if ax in used or (mesh is not None and mesh.shape.get(ax, 1) == 1):
          continue
        axes.append(ax)
        used.add(ax)
    out.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
  while out and out[-1] is None:
    out.pop()
  return P(*out)


def batch_spec(rules: Sequence[Sequence[Any]], mesh: Mesh) -> P:
  """PartitionSpec of a batch array: leading dim over the mesh axes of logical 'batch'."""
  return logical_to_mesh(P("batch"), rules, mesh)


def batch_sharding(mesh: Mesh, rules: Sequence[Sequence[Any]]) -> NamedSharding:
  """NamedSharding for arrays whose leading dim is the (global) batch."""
  return NamedSharding(mesh, batch_spec(rules, mesh))


def replicated(mesh: Mesh) -> NamedSharding:
  """NamedSharding that replicates an array on every device of the mesh."""
  return NamedSharding(mesh, P())


def data_split(mesh: Mesh, rules: Sequence[Sequence[Any]]) -> int:
  """Number of ways the batch dimension is split over the mesh."""
  spec = batch_spec(rules, mesh)
  if not spec or spec[0] is None:
    return 1
  axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
  return math.prod(mesh.shape[a] for a in axes)


def check_divisible(path: str, shape: Sequence[int], spec: P, mesh: Mesh) -> None:
  """Raises a ConfigError when a dimension does not split evenly over its mesh axes."""
  for dim, entry in enumerate(spec):
    if entry is None:
      continue
    axes = entry if isinstance(entry, tuple) else (entry,)
    n = math.prod(mesh.shape[a] for a in axes)
    if dim >= len(shape) or shape[dim] % n:
      size = shape[dim] if dim < len(shape) else "missing"
      raise ConfigError(
          f"'{path}' dim {dim} (size {size}) does not split over mesh axes {axes} ({n} devices); "
          "change config.sharding_rules or the model size")
