"""Parameter sharing across group models stacked on a leading axis: subsets by path, soft averaging.

    mask = select(params, r"^(enc/0|dec/\\d+)/")         # a pytree of bools: which leaves are exchanged
    stacked = soft_average(stacked, mask, tau=0.1)        # theta_m <- (1 - tau) theta_m + tau mean_m' theta_m'

Paths join dict keys and list indices with "/" ("enc/0/w"). TaskLoom's second stage exchanges such a coarse
subset across the group models; `tau` = 1 makes the subset fully shared.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np


def paths(tree) -> list[str]:
  """The "/"-joined path of every leaf, in `jax.tree.leaves` order."""
  out = []
  for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
    parts = []
    for p in path:
      parts.append(str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", p)))))
    out.append("/".join(parts))
  return out


def select(tree, pattern: str):
  """A pytree of Python bools: True for the leaves whose path matches `pattern` (re.search)."""
  rx = re.compile(pattern)
  flags = [bool(rx.search(p)) for p in paths(tree)]
  return jax.tree.unflatten(jax.tree.structure(tree), flags)


def soft_average(stacked, mask, tau: float):
  """Moves the selected leaves of each model (leading axis) towards their mean over the models by `tau`."""
  def mix(x, m):
    if not m:
      return x
    return (1.0 - tau) * x + tau * jnp.mean(x, axis=0, keepdims=True)
  return jax.tree.map(mix, stacked, mask)


def count(tree, mask=None) -> int:
  """Number of scalars in the (selected) leaves."""
  leaves = jax.tree.leaves(tree)
  flags = [True] * len(leaves) if mask is None else jax.tree.leaves(mask)
  return int(sum(x.size for x, f in zip(leaves, flags) if f))


def regroup(stacked, old_assign, new_assign):
  """Models for a new grouping of the tasks: new model m is the mean of the old models of its tasks (a task's
  old model counted once per task, so a model shared by several tasks weighs more).

  Args:
    stacked: pytree whose leaves have a leading model axis (old groups).
    old_assign, new_assign: (T,) group of every task before and after.
  """
  old_assign, new_assign = np.asarray(old_assign), np.asarray(new_assign)
  rows = []
  for m in range(int(new_assign.max()) + 1):
    members = jnp.asarray(old_assign[new_assign == m])
    rows.append(jax.tree.map(lambda x, i=members: jnp.mean(x[i].astype(jnp.float32), axis=0).astype(x.dtype),
                             stacked))
  return jax.tree.map(lambda *xs: jnp.stack(xs), *rows)
