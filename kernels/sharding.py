"""Sharding context for kernels and library alike: the mesh and logical-axis rules a run entered, read back.

A run enters its mesh with `jax.set_mesh` and its logical-axis rules with flax's `nnx.logical_axis_rules`
(`jaxlab.mesh.use`). Code that must shard by itself (a Pallas call is not partitioned by the compiler, so the
kernels' wrappers run it per shard in `jax.shard_map`) reads them here: `current_mesh()` (concrete outside
`jax.jit`, abstract inside, None without one), `current_rules()`, and `logical_to_mesh` / `axis_of` /
`dividing_axes` for the mesh axes a logical name (batch, embed, mlp, heads, kv, vocab, state, length) maps to.
This module depends on jax and flax only, so the kernels (which sit below the library) can use it;
`jaxlab.mesh` re-exports it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
from flax.core import spmd
from jax.sharding import Mesh, PartitionSpec as P

# Logical axis names used across the library: batch, embed (model width), mlp (hidden of MLPs / Mamba's
# d_inner), heads (query heads), kv (key/value heads), vocab, state (SSM state), length (sequence).
def _rules(embed, mlp, heads, vocab):
  return (("batch", "data"), ("embed", embed), ("mlp", mlp), ("heads", heads), ("kv", None), ("vocab", vocab),
          ("state", None), ("length", None))


RULES: dict[str, tuple[tuple[str, Any], ...]] = {
    # Pure data parallelism: the batch over "data", every parameter replicated.
    "data_parallel": _rules(None, None, None, None),
    # Data parallel over "data" plus Megatron-style tensor parallelism over "model" (MLP hidden, attention
    # heads, vocabulary split; a no-op while the model axis has size 1). The default of every config.
    "tensor_parallel": _rules(None, "model", "model", "model"),
    # FSDP over "data" (the model width of every parameter is split over the data axis, gathered per use)
    # on top of tensor parallelism over "model".
    "fsdp": _rules("data", "model", "model", "model"),
}
DEFAULT_RULES = RULES["tensor_parallel"]


def current_mesh() -> Mesh | jax.sharding.AbstractMesh | None:
  """The mesh in context: concrete outside `jax.jit`, abstract inside; None when no mesh is set."""
  try:
    mesh = jax.sharding.get_mesh()
  except ValueError:          # inside jit: only the abstract mesh is known
    mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or getattr(mesh, "empty", False) or not mesh.axis_names:
    return None
  return mesh


def current_rules() -> tuple:
  """The logical-axis rules in context (`DEFAULT_RULES` when none are set)."""
  return tuple(spmd.get_logical_axis_rules()) or DEFAULT_RULES


def multi_device(mesh=None) -> bool:
  """Whether `mesh` (default: the one in context) spans more than one device that the code sees as separate.

  False without a mesh, on a one-device mesh, and inside a `shard_map` over all axes (the arrays there are
  already per shard).
  """
  mesh = current_mesh() if mesh is None else mesh
  if mesh is None:
    return False
  manual = set(getattr(mesh, "manual_axes", ()) or ())
  return math.prod(n for a, n in dict(mesh.shape).items() if a not in manual) > 1


def logical_to_mesh(spec: P | Sequence[Any] | None, rules: Sequence[Sequence[Any]] | None = None,
                    mesh: Mesh | None = None) -> P:
  """Maps a PartitionSpec of logical names to one of mesh axes.

  Logical names missing from `rules` are replicated; a mesh axis of size 1 is dropped; a mesh axis is
  used at most once per spec (later dims fall back to replicated).

  Args:
    spec: logical spec, e.g. `P("embed", "mlp")`, or None (replicated).
    rules: pairs (logical_name, mesh_axis or tuple of axes or None); default: the rules in context.
    mesh: when given (default: the mesh in context), axes missing from it or of size 1 are dropped.

  Returns:
    The mesh-axis PartitionSpec.
  """
  if spec is None:
    return P()
  rules = current_rules() if rules is None else rules
  mesh = current_mesh() if mesh is None else mesh
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
        if ax in used or (mesh is not None and dict(mesh.shape).get(ax, 1) == 1):
          continue
        axes.append(ax)
        used.add(ax)
    out.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
  while out and out[-1] is None:
    out.pop()
  return P(*out)


def axis_of(logical: str, rules: Sequence[Sequence[Any]] | None = None, mesh=None) -> str | tuple | None:
  """The mesh axis (or axes) logical name `logical` maps to under the rules and mesh in context, or None."""
  spec = logical_to_mesh(P(logical), rules, mesh)
  return spec[0] if len(spec) else None


def dividing_axes(logical: str, size: int, mesh=None, rules=None) -> str | tuple[str, ...] | None:
  """The mesh axes of logical name `logical` (rules and mesh in context by default) when a dimension of
  `size` splits evenly over them; None when it does not, when the name maps to no axis, or when there is no
  multi-device mesh (or the code already runs inside a `shard_map`)."""
  mesh = current_mesh() if mesh is None else mesh
  if not multi_device(mesh) or getattr(mesh, "manual_axes", ()):
    return None
  axes = axis_of(logical, rules, mesh)
  names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  split = math.prod(dict(mesh.shape)[a] for a in names)
  return axes if names and size % split == 0 else None
