"""Device meshes, logical-axis rules, and the mesh context a run works in.

Models annotate parameters (and activations, through `logical_spec`) with LOGICAL axis names
(`nnx.with_partitioning(init, ("embed", "mlp"))`); `config.sharding_rules` maps each logical name to a mesh
axis (or None = replicated), so the same model runs data-parallel, tensor-parallel or FSDP by changing the
config only. Named presets (`RULES`) spare configs from retyping the tuples.

A run enters its mesh and rules ONCE, as context (`use(mesh, rules)` or `use_config(config)`: `jax.set_mesh`
plus flax's `nnx.logical_axis_rules`). Library code that needs them (the LM sampler, the ZO optimizers, the
Mamba block's scan, SWING's walkers, the Pallas wrappers) reads them with `current_mesh()` /
`current_rules()` instead of taking `mesh=` / `rules=` arguments. On a one-device mesh (or with no mesh in
context) every such consumer takes its plain single-device path.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxlab.errors import ConfigError
# The context readers and the logical-to-mesh mapping live beside the kernels (which may not import the
# library but read the same context); the library re-exports them.
from jaxlab.kernels.sharding import (DEFAULT_RULES, RULES, axis_of, current_mesh, current_rules,  # noqa: F401  pylint: disable=unused-import
                                     dividing_axes, logical_to_mesh, multi_device)

DEFAULT_MESH = (("data", -1), ("model", 1))
# Every logical axis name the library's models use ("layers": the stacked-layer axis of scanned blocks).
# `use` maps the ones its rules leave out to None (replicated), as `logical_to_mesh` does.
LOGICAL_AXES = ("batch", "embed", "mlp", "heads", "kv", "vocab", "state", "length", "layers")


def rules_preset(name: str) -> tuple[tuple[str, Any], ...]:
  """The sharding rules called `name` (one of `RULES`).

  Raises:
    ConfigError: on an unknown name (lists the presets).
  """
  if name not in RULES:
    raise ConfigError(f"unknown sharding-rules preset {name!r}; use one of {', '.join(RULES)} or explicit "
                      "pairs, e.g. (('batch', 'data'), ('embed', 'data'))")
  return RULES[name]


def mesh_shape(mesh: Sequence[Sequence[Any]], num_devices: int | None) -> list[tuple[str, int]]:
  """Resolves a mesh spec `(("data", -1), ("model", 2))` to concrete sizes for `num_devices`.

  One size may be -1 (all remaining devices). Without -1 the mesh may be smaller than the machine (e.g.
  `(("data", 1), ("model", 1))` for a single-device run); it then uses the first devices.

  Raises:
    ConfigError: on malformed entries, duplicate names, several -1, or sizes that do not fit.
  """
  try:
    pairs = [(str(n), int(s)) for n, s in mesh]
  except (TypeError, ValueError):
    raise ConfigError(f"config.mesh must be pairs (axis_name, size), got {mesh!r}") from None
  names = [n for n, _ in pairs]
  if len(set(names)) != len(names) or not pairs:
    raise ConfigError(f"config.mesh needs distinct axis names, got {names}")
  if sum(s == -1 for _, s in pairs) > 1 or any(s == 0 or s < -1 for _, s in pairs):
    raise ConfigError(f"config.mesh sizes must be positive with at most one -1, got {mesh!r}")
  if num_devices is None:
    return pairs
  fixed = math.prod(s for _, s in pairs if s != -1)
  if any(s == -1 for _, s in pairs):
    if num_devices % fixed:
      raise ConfigError(f"config.mesh {dict(pairs)} does not fit {num_devices} devices ({fixed} does not divide it)")
    return [(n, num_devices // fixed if s == -1 else s) for n, s in pairs]
  if fixed > num_devices:
    raise ConfigError(f"config.mesh {dict(pairs)} needs {fixed} devices but {num_devices} are present; "
                      "shrink it or set one axis to -1")
  return pairs  # a mesh smaller than the machine uses the first `fixed` devices


def check_rules(rules, mesh_names: Sequence[str]) -> dict:
  """`{logical: mesh axes}` of sharding rules, checked against the mesh's axis names.

  Raises:
    ConfigError: malformed rules, or a rule naming an axis the mesh does not have.
  """
  out = {}
  try:
    for logical, axis in rules:
      out[str(logical)] = axis
  except (TypeError, ValueError):
    raise ConfigError(f"config.sharding_rules must be pairs (logical_name, mesh_axis or None), or a preset name "
                      f"({', '.join(RULES)}), got {rules!r}") from None
  for logical, axis in out.items():
    axes = (axis,) if isinstance(axis, str) else (axis or ())
    for a in axes:
      if a not in mesh_names:
        raise ConfigError(f"config.sharding_rules maps '{logical}' to mesh axis '{a}', which config.mesh "
                          f"does not have (axes: {list(mesh_names)})")
  return out


def make_mesh(mesh_spec: Sequence[Sequence[Any]] = DEFAULT_MESH, devices=None) -> Mesh:
  """Builds a `Mesh` from `config.mesh`, resolving one -1 to the remaining devices.

  Args:
    mesh_spec: pairs (axis_name, size), e.g. `(("data", -1), ("model", 2))`.
    devices: devices to use (default: all global devices, in the topology-aware order of
      `jax.make_mesh`); a mesh smaller than them takes the first ones (single-process runs only).

  Returns:
    A mesh whose axes are of type Auto (sharding propagated by the compiler).
  """
  devices = list(jax.devices() if devices is None else devices)
  pairs = mesh_shape(mesh_spec, len(devices))
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


# ------------------------------------------------------------------------------------------- context


@contextlib.contextmanager
def use(mesh: Mesh, rules: Sequence[Sequence[Any]] | str = DEFAULT_RULES) -> Iterator[Mesh]:
  """Enters `mesh` (`jax.set_mesh`) and logical `rules` (`nnx.logical_axis_rules`) for the block.

  The rules are read when a function is traced; jax's jit cache keys on the mesh but not on flax's rules
  context, so a function jitted once should keep being called under the same rules.

  Args:
    mesh: the device mesh of the run.
    rules: logical-to-mesh rules (`config.sharding_rules`) or a preset name of `RULES`; names of
      `LOGICAL_AXES` they leave out are replicated.

  Yields:
    The mesh.
  """
  if isinstance(rules, str):
    rules = rules_preset(rules)
  rules = tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in rules)
  given = {k for k, _ in rules}
  rules += tuple((name, None) for name in LOGICAL_AXES if name not in given)   # flax needs every name mapped
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    yield mesh


@contextlib.contextmanager
def use_config(config, devices=None) -> Iterator[Mesh]:
  """Enters the mesh and rules of a run config (`config.mesh`, `config.sharding_rules`).

  When the same mesh and rules are already in context (a runner called inside an experiment that entered
  them), the block runs in that context unchanged.

  Args:
    config: a config built on `jaxlab.configs.base_config()`.
    devices: devices of the mesh (default: all).

  Yields:
    The mesh.
  """
  rules = tuple(tuple(r) for r in config.sharding_rules)
  mesh = make_mesh(config.mesh, devices)
  outer = current_mesh()
  if isinstance(outer, Mesh) and outer == mesh and tuple(map(tuple, current_rules())) == rules:
    yield outer
    return
  with use(mesh, rules):
    yield mesh


def logical_sharding(names: Sequence[str | None], mesh: Mesh | None = None, rules=None) -> NamedSharding:
  """NamedSharding of an array whose axes carry logical `names`, on `mesh` (default: the one in context)."""
  mesh = current_mesh() if mesh is None else mesh
  if mesh is None:
    raise ValueError("logical_sharding needs a mesh: enter one with jaxlab.mesh.use(...) or pass mesh=")
  return NamedSharding(mesh, logical_to_mesh(P(*names), rules, mesh))


def batch_spec(rules: Sequence[Sequence[Any]] | None = None, mesh: Mesh | None = None) -> P:
  """PartitionSpec of a batch array: leading dim over the mesh axes of logical 'batch'."""
  return logical_to_mesh(P("batch"), rules, mesh)


def batch_sharding(mesh: Mesh | None = None, rules: Sequence[Sequence[Any]] | None = None) -> NamedSharding:
  """NamedSharding for arrays whose leading dim is the (global) batch (default: the mesh and rules in context)."""
  mesh = current_mesh() if mesh is None else mesh
  return NamedSharding(mesh, batch_spec(rules, mesh))


def replicated(mesh: Mesh | None = None) -> NamedSharding:
  """NamedSharding that replicates an array on every device of the mesh (default: the one in context)."""
  return NamedSharding(current_mesh() if mesh is None else mesh, P())


def data_split(mesh: Mesh | None = None, rules: Sequence[Sequence[Any]] | None = None) -> int:
  """Number of ways the batch dimension is split over the mesh (1 without a mesh)."""
  mesh = current_mesh() if mesh is None else mesh
  if mesh is None:
    return 1
  spec = batch_spec(rules, mesh)
  if not spec or spec[0] is None:
    return 1
  axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
  return math.prod(dict(mesh.shape)[a] for a in axes)


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
