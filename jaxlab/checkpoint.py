"""Checkpoints: a thin wrapper over orbax's CheckpointManager (the only module that imports orbax).

Layout: `<workdir>/checkpoints/<step>/{model,train,meta}` for a TrainState (`model` = params and model
state, `train` = step, optimizer state and run key) or `<step>/{state,meta}` for any other state pytree.
`meta` is JSON: the step, the config, and a signature (path, shape, dtype of every leaf) that lets a
restore fail with a clear message when the checkpoint belongs to another model, before orbax is involved.
Restores take a target with shardings, so a checkpoint written on one mesh restores onto another.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp

from jaxlab.errors import CheckpointError
from jaxlab.state import TrainState


def to_items(state: Any) -> dict[str, Any]:
  """Splits a state into checkpoint items (TrainState: model + train; anything else: state)."""
  if isinstance(state, TrainState):
    return {"model": {"params": state.params, "model_state": state.model_state},
            "train": {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}}
  return {"state": state}


def from_items(items: Mapping[str, Any], like: Any) -> Any:
  """Inverse of `to_items`, rebuilding the state type of `like`."""
  if isinstance(like, TrainState):
    return TrainState(step=items["train"]["step"], params=items["model"]["params"],
                      model_state=items["model"]["model_state"], opt_state=items["train"]["opt_state"],
                      rng=items["train"]["rng"])
  return items["state"]


def signature(items: Mapping[str, Any]) -> dict[str, list]:
  """{"item/path/to/leaf": [shape, dtype]} for every leaf of the items."""
  out = {}
  for name, tree in items.items():
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      key = jax.tree_util.keystr(path, simple=True, separator="/")
      out[f"{name}/{key}"] = [list(leaf.shape), str(leaf.dtype)]
  return out


def check_signature(found: Mapping[str, list], expected: Mapping[str, list], where: str) -> None:
  """Raises CheckpointError describing the first differences between two signatures."""
  expected = {k: v for k, v in expected.items() if k.split("/")[0] in {p.split("/")[0] for p in found}}
  if dict(found) == dict(expected):
    return
  problems = []
  for k in sorted(set(found) | set(expected)):
    if k not in found:
      problems.append(f"'{k}' missing from checkpoint")
    elif k not in expected:
      problems.append(f"unexpected '{k}' in checkpoint")
    elif found[k] != expected[k]:
      problems.append(f"'{k}' is {found[k][1]}{tuple(found[k][0])} in the checkpoint but "
                      f"{expected[k][1]}{tuple(expected[k][0])} in the model")
  more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
  raise CheckpointError(
      f"checkpoint {where} was written by a different model: {'; '.join(problems[:3])}{more}. "
      "Use a fresh --workdir, or fix the config to match the checkpoint")


class Checkpointer:
  """Save/restore of training states with retention, async saving and mesh-independent restore.

  Args:
    directory: folder holding one subfolder per saved step (created if missing).
    keep: number of most recent checkpoints kept.
    async_save: write in a background thread (the step loop continues).
  """

  def __init__(self, directory: str, *, keep: int = 2, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    self._mgr = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    """Step of the newest complete checkpoint, or None."""
    return self._mgr.latest_step()

  def save(self, step: int, state: Any, meta: Mapping[str, Any] | None = None, force: bool = False) -> None:
    """Saves `state` (any pytree; TrainState is split into model/train items) with JSON `meta`."""
    items = to_items(state)
    meta = dict(meta or {}, step=int(step), signature=signature(items))
    args = {k: ocp.args.StandardSave(v) for k, v in items.items()}
    args["meta"] = ocp.args.JsonSave(meta)
    self._mgr.save(int(step), args=ocp.args.Composite(**args), force=force)

  def read_meta(self, step: int) -> dict:
    """The JSON meta of a checkpoint (raises CheckpointError when missing or unreadable)."""
    where = os.path.join(self.directory, str(step))
    try:
      meta = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # orbax raises various types for missing / corrupt files
      raise CheckpointError(f"checkpoint {where} is corrupt or incomplete ({type(e).__name__}); delete that "
                            "step folder to fall back to the previous one, or use a fresh --workdir") from None
    if not isinstance(meta, dict) or "signature" not in meta:
      raise CheckpointError(f"checkpoint {where} has no jaxlab meta; it was not written by jaxlab")
    return meta

  def restore(self, step: int, target: Any, items: tuple[str, ...] | None = None) -> tuple[Any, dict]:
    """Restores a checkpoint onto the shardings of `target`.

    Args:
      step: the step to restore.
      target: pytree like the saved state whose leaves are `jax.ShapeDtypeStruct(..., sharding=...)`
        (see `jaxlab.state.abstract_with_shardings`); the restored arrays get those shardings.
      items: restore only these items (e.g. ("model",) to take parameters only); the others keep the
        target's leaves in the returned dict.

    Returns:
      (items dict, meta dict). Use `from_items` to rebuild a state.

    Raises:
      CheckpointError: when the checkpoint belongs to another model or cannot be read.
    """
    meta = self.read_meta(step)
    wanted = to_items(target)
    if items is not None:
      wanted = {k: v for k, v in wanted.items() if k in items}
    where = os.path.join(self.directory, str(step))
    found = {k: v for k, v in meta["signature"].items() if k.split("/")[0] in wanted}
    check_signature(found, signature(wanted), where)
    args = {k: ocp.args.StandardRestore(v) for k, v in wanted.items()}
    try:
      restored = self._mgr.restore(step, args=ocp.args.Composite(**args))
    except Exception as e:
      raise CheckpointError(f"checkpoint {where} could not be restored ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:200] if str(e) else ''}); delete that step folder "
                            "or use a fresh --workdir") from None
    return {k: restored[k] for k in wanted}, meta

  def wait(self) -> None:
    """Blocks until pending async saves are written."""
    self._mgr.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases resources."""
    self._mgr.wait_until_finished()
    self._mgr.close()


def resolve_init_from(path: str) -> tuple[Checkpointer, int]:
  """Finds the newest checkpoint under `path` (a workdir or its checkpoints/ folder).

  Raises:
    CheckpointError: when no checkpoint is there.
  """
  for cand in (os.path.join(path, "checkpoints"), path):
    if os.path.isdir(cand):
      ckpt = Checkpointer(cand, async_save=False)
      step = ckpt.latest_step()
      if step is not None:
        return ckpt, step
      ckpt.close()
  raise CheckpointError(f"config.init_from={path!r} holds no checkpoint; give a workdir of a finished run "
                        "or its checkpoints/ folder")


def load_params(path: str, modeldef) -> tuple[Any, Any]:
  """The newest checkpoint's (params, model_state) under `path` (a workdir or its checkpoints/ folder).

  For inference after training: `modeldef.merge(*load_params(workdir, modeldef))` is the trained module.
  Arrays are placed on the first device.

  Raises:
    CheckpointError: no checkpoint, or one written by a different model.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  ckpt, step = resolve_init_from(path)
  dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  params, rest = modeldef.abstract()
  put = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev), t)  # noqa: E731
  scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=dev)
  target = TrainState(step=scalar, params=put(params), model_state=put(rest), opt_state=None, rng=scalar)
  items, _ = ckpt.restore(step, target, items=("model",))
  ckpt.close()
  return items["model"]["params"], items["model"]["model_state"]
