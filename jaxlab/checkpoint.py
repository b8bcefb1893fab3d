"""Checkpoints: a thin wrapper over orbax's CheckpointManager (the only module that imports orbax).

Layout: `<workdir>/checkpoints/<step>/{model,train,meta}` for a TrainState (`model` = params and model
state, `train` = step, optimizer state and run key), `<step>/{state,meta}` for any other state pytree, or
`<step>/meta` alone (state None: a staged run without carried state).
`meta` is JSON: the step, the config, and a signature (path, shape, dtype of every leaf) that lets a
restore fail with a clear message when the checkpoint belongs to another model, before orbax is involved.
Restores take a target with shardings, so a checkpoint written on one mesh restores onto another.

Integrity: `meta` also holds a checksum of every array (`checksums`: a position-weighted sum of its bits modulo
2**32, computed on the devices, so it is the same on any mesh), checked after every restore. A checkpoint whose
files cannot be read or whose arrays do not match is damaged (`DamagedCheckpoint`); `restore_newest` then moves it
aside (to `<checkpoints>.damaged/<step>`, nothing is deleted), says so in one warning line, and resumes from the
newest checkpoint that reads back whole. A save that fails for any reason but the disk raises `SaveFailed`.
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
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxlab import faults
from jaxlab.errors import CheckpointError, DamagedCheckpoint, JaxlabError, SaveFailed
from jaxlab.state import TrainState

log = logging.getLogger("jaxlab")


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


def _words(x: jax.Array) -> jax.Array:
  """The bits of an array as a flat uint32 vector (PRNG keys by their key data; 8-byte types as two words)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  x = jnp.ravel(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  size = jnp.dtype(x.dtype).itemsize
  info = jnp.finfo if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo
  if info(x.dtype).bits != 8 * size:   # sub-byte types (int4, float4): every value is exact in float32
    x, size = x.astype(jnp.float32), 4
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[size]
  return jnp.ravel(jax.lax.bitcast_convert_type(x, unsigned)).astype(jnp.uint32)


@jax.jit
def _sums(leaves: list) -> jax.Array:
  """uint32[len(leaves)]: sum_i bits_i * (odd weight of position i) mod 2**32 per leaf. Any one flipped bit
  changes it (an odd multiple of a power of two is not 0 modulo 2**32), and integer sums do not depend on the
  order of the reduction, so the value does not depend on the mesh."""
  out = []
  for x in leaves:
    w = _words(x)
    weight = jax.lax.iota(jnp.uint32, w.size) * jnp.uint32(0x9E3779B1) | jnp.uint32(1)
    out.append(jnp.sum(w * weight, dtype=jnp.uint32))
  return jnp.stack(out)


def checksums(items: Mapping[str, Any]) -> dict[str, int]:
  """{"item/path/to/leaf": checksum} for every leaf of the items (the keys of `signature`)."""
  keys, leaves = [], []
  for name, tree in items.items():
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      keys.append(f"{name}/{jax.tree_util.keystr(path, simple=True, separator='/')}")
      leaves.append(leaf)
  if not leaves:
    return {}
  out = _sums(leaves)
  values = np.asarray(out if out.is_fully_addressable else out.addressable_data(0))
  return {k: int(v) for k, v in zip(keys, values)}


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
    meta = dict(meta or {}, step=int(step), signature=signature(items), checksums=checksums(items))
    args = {k: ocp.args.StandardSave(v) for k, v in items.items()}
    args["meta"] = ocp.args.JsonSave(meta)
    with self._saving(f"saving checkpoint {os.path.join(self.directory, str(step))}"):
      faults.boundary("checkpoint")
      self._mgr.save(int(step), args=ocp.args.Composite(**args), force=force)
    faults.boundary("checkpoint/done")

  @contextlib.contextmanager
  def _saving(self, what: str):
    """Turns any failure of a save (orbax's background threads' too, which surface at the next save, `wait` or
    `close`) other than a failed write to the disk (the command-line tools' own one line) into `SaveFailed`."""
    from jaxlab import cli  # pylint: disable=g-import-not-at-top
    try:
      yield
    except (JaxlabError, KeyboardInterrupt):
      raise
    except Exception as e:  # pylint: disable=broad-except
      if cli.write_failure(e) is not None:
        raise
      steps = [s for s in self._mgr.all_steps() if os.path.isdir(os.path.join(self.directory, str(s)))]
      resume = f"step {max(steps)}" if steps else "the start"
      first = (str(e).strip().splitlines() or [""])[0][:200]
      raise SaveFailed(f"{what} failed ({type(e).__name__}: {first}); rerun the same command: the run resumes "
                       f"from {resume}") from e

  def read_meta(self, step: int) -> dict:
    """The JSON meta of a checkpoint (raises CheckpointError when missing or unreadable)."""
    where = os.path.join(self.directory, str(step))
    try:
      meta = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # orbax raises various types for missing / corrupt files
      raise DamagedCheckpoint(damaged_message(where, e)) from None
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
      raise DamagedCheckpoint(damaged_message(where, e)) from None
    restored = {k: restored[k] for k in wanted}
    expected = meta.get("checksums") or {}     # absent in checkpoints written before checksums were recorded
    bad = [k for k, v in checksums(restored).items() if k in expected and expected[k] != v]
    if bad:
      more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
      raise DamagedCheckpoint(damaged_message(where, None, f"its array '{bad[0]}'{more} does not match the checksum "
                                                          "recorded when it was saved"))
    return restored, meta

  def restore_newest(self, target: Any, items: tuple[str, ...] | None = None,
                     check_meta: Any = None) -> tuple[int, dict, dict] | None:
    """(step, items, meta) of the newest checkpoint that reads back whole, or None when there is no checkpoint.

    A damaged checkpoint (`DamagedCheckpoint`: files that cannot be read, arrays that do not match their
    checksums) is passed over for the one before it; once one restores, the damaged newer ones are moved aside
    to `<checkpoints>.damaged/<step>` (kept for inspection), each with one warning line. When none restores,
    the newest one's error is raised and nothing is moved. On several hosts a checksum mismatch is seen by every
    process (the sums are global), but a file that only some processes fail to read is not agreed on: those
    would fall back alone and the processes disagree on the step (a known limit; delete the damaged step folder).

    Args:
      target: as in `restore`; None: no arrays (a state-less checkpoint), only the meta is read.
      items: as in `restore`.
      check_meta: optional `meta -> None` that raises CheckpointError when the checkpoint belongs to another
        run (checked before its arrays are read); that error is raised at once.
    """
    damaged, first = [], None
    for step in sorted(self._mgr.all_steps(), reverse=True):
      try:
        if target is None:
          found = ({}, self.read_meta(step))
          if check_meta is not None:
            check_meta(found[1])
        else:
          if check_meta is not None:
            check_meta(self.read_meta(step))
          found = self.restore(step, target, items)
      except DamagedCheckpoint as e:
        first = first or e
        damaged.append((step, e))
        continue
      for bad, error in damaged:
        self._set_aside(bad, error, step)
      return (step, *found)
    if first is not None:
      raise DamagedCheckpoint(str(first).replace(
          "delete that step folder to resume from the checkpoint before it",
          "no older checkpoint reads back whole: delete that step folder to start the run over" if len(damaged) == 1
          else f"neither do the {len(damaged) - 1} older ones: delete {self.directory} to start the run over"))
    return None

  def _set_aside(self, step: int, error: BaseException, good: int) -> None:
    """Moves a damaged step folder out of the manager's sight (process 0; every process waits for it)."""
    from jaxlab import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
    src = os.path.join(self.directory, str(step))
    aside = os.path.join(self.directory + ".damaged", str(step))
    if metrics_lib.is_main_process():
      if os.path.exists(aside):
        aside += time.strftime("-%Y%m%dT%H%M%S")
      os.makedirs(os.path.dirname(aside), exist_ok=True)
      os.replace(src, aside)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices(f"jaxlab_checkpoint_aside_{step}")
    self._mgr.reload()
    reason = str(error).split(": ", 1)[-1].split(" (a file in it")[0].split("; delete")[0]
    log.warning("checkpoint %s is damaged (%s); moved to %s, resuming from step %d, the newest checkpoint that "
                "reads back whole", src, reason, aside, good)

  def wait(self) -> None:
    """Blocks until pending async saves are written."""
    with self._saving(f"saving a checkpoint in {self.directory}"):
      self._mgr.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases resources."""
    with self._saving(f"saving a checkpoint in {self.directory}"):
      self._mgr.wait_until_finished()
      self._mgr.close()


def damaged_message(where: str, error: BaseException | None, what: str = "") -> str:
  """One line for a checkpoint step folder that cannot be read (truncated, zeroed or half-written files) or whose
  arrays do not match their checksums (`what`)."""
  if not what:
    text = str(error)
    item = re.search(r'local file "[^"]*/(\w+)/"', text)
    array = re.search(r'Error reading "([^"/]+)/', text)
    what = (f"its '{item.group(1)}' array {array.group(1)!r} cannot be read" if item and array else
            "its metadata cannot be read" if isinstance(error, ValueError) and "JSON" in type(error).__name__ + text
            else f"it cannot be read ({type(error).__name__})")
  return (f"checkpoint {where} is damaged: {what} (a file in it is truncated, zeroed, changed or missing); delete "
          "that step folder to resume from the checkpoint before it, or use another --workdir")


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
