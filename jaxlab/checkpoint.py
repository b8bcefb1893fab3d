"""Checkpoints: a thin wrapper over orbax's CheckpointManager (the only module that imports orbax).

Layout: `<workdir>/checkpoints/<step>/{model,train,meta}` for a TrainState (`model` = params and model
state, `train` = step, optimizer state and run key), `<step>/{state,meta}` for any other state pytree, or
`<step>/meta` alone (state None: a staged run without carried state).
`meta` is JSON: the step, the config, and a signature (path, shape, dtype of every leaf) that lets a
restore fail with a clear message when the checkpoint belongs to another model, before orbax is involved.
Restores take a target with shardings, so a checkpoint written on one mesh restores onto another.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import time
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp

from jaxlab.errors import CheckpointError
from jaxlab.state import TrainState


def to_items(state: Any) -> dict[str, Any]:
  """Splits a state into checkpoint items (TrainState: model + train; None: none; anything else: state)."""
  if state is None:
    return {}
  if isinstance(state, TrainState):
    return {"model": {"params": state.params, "model_state": state.model_state},
            "train": {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}}
  return {"state": state}


def from_items(items: Mapping[str, Any], like: Any) -> Any:
  """Inverse of `to_items`, rebuilding the state type of `like`."""
  if like is None:
    return None
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
  differing = [k for k in sorted(set(found) | set(expected)) if found.get(k) != expected.get(k)]
  if all(k.startswith("train/opt_state") for k in differing):
    raise CheckpointError(
        f"checkpoint {where} holds the same model but another optimizer's state ({'; '.join(problems[:2])}"
        f"{more}); resume with the optimizer it was written with (config.train.optimizer), or start another "
        "--workdir from its parameters with --config.train.init_from=<that workdir>")
  raise CheckpointError(
      f"checkpoint {where} was written by a different model: {'; '.join(problems[:3])}{more}. "
      "Use another --workdir, or fix the config to match the checkpoint")


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
      raise CheckpointError(damaged_message(where, e)) from None
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
      with _native_stderr_held() as held:
        restored = self._mgr.restore(step, args=ocp.args.Composite(**args))
        held.keep = True
    except Exception as e:  # orbax / TensorStore raise many types (JSON, DATA_LOSS, OUT_OF_RANGE, ...)
      _silence_abandoned_reads()
      raise CheckpointError(damaged_message(where, e)) from None
    return {k: restored[k] for k in wanted}, meta

  def wait(self) -> None:
    """Blocks until pending async saves are written."""
    self._mgr.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases resources."""
    self._mgr.wait_until_finished()
    self._mgr.close()


def damaged_message(where: str, error: BaseException) -> str:
  """One line for a checkpoint step folder that cannot be read (truncated, zeroed or half-written files)."""
  text = str(error)
  item = re.search(r'local file "[^"]*/(\w+)/"', text)
  array = re.search(r'Error reading "([^"/]+)/', text)
  what = (f"its '{item.group(1)}' array {array.group(1)!r} cannot be read" if item and array else
          "its metadata cannot be read" if isinstance(error, ValueError) and "JSON" in type(error).__name__ + text
          else f"it cannot be read ({type(error).__name__})")
  return (f"checkpoint {where} is damaged: {what} (a file in it is truncated, zeroed or missing); delete that step "
          "folder to resume from the checkpoint before it, or use another --workdir")


@contextlib.contextmanager
def _native_stderr_held():
  """Holds what native code (TensorStore's threads) writes to file descriptor 2 during a restore.

  A failed restore leaves TensorStore reads in flight whose completion callbacks print tracebacks ("Event loop
  is closed") from their own threads; on failure they are dropped (after they settle), on success whatever
  was written is passed on to stderr.
  """
  class Held:
    keep = False
  held = Held()
  try:
    sys.stderr.flush()
    saved = os.dup(2)
  except (OSError, ValueError):   # no real fd 2 (e.g. an embedded interpreter): nothing to hold
    yield held
    return
  with tempfile.TemporaryFile() as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
      yield held
    finally:
      if not held.keep:           # let the in-flight reads of a failed restore finish printing
        size, quiet = -1, 0
        while quiet < 3:
          time.sleep(0.1)
          now = os.fstat(tmp.fileno()).st_size
          quiet, size = (quiet + 1, now) if now == size else (0, now)
      os.dup2(saved, 2)
      os.close(saved)
      if held.keep:
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
        if text:
          sys.stderr.write(text)


class _AbandonedReadFilter(logging.Filter):
  """Drops asyncio's "Future exception was never retrieved" reports of a failed restore's other reads."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "exception was never retrieved" not in record.getMessage()


def _silence_abandoned_reads() -> None:
  """After a failed restore: the reads still in flight end later, on a closed event loop, and would print
  "Event loop is closed" / "Future exception was never retrieved" reports long after the one-line error.
  Those (and only those) are dropped from then on."""
  global _SILENCED
  if _SILENCED:
    return
  _SILENCED = True
  logging.getLogger("asyncio").addFilter(_AbandonedReadFilter())
  previous = sys.unraisablehook

  def hook(unraisable):
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc):
      return
    previous(unraisable)

  sys.unraisablehook = hook


_SILENCED = False


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
