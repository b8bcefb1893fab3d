"""Run directories: checked before anything is written, so a refused run leaves the workdir as it was.

Every runner (`fit`, `run_loop`, `run_stages`) calls `check(config, workdir)` first, and `claim(config, workdir)`
only once everything that can refuse the run (the workdir's owner, its config, its checkpoint's signature)
has passed. `claim` writes `config.json` and `run.json` (`{"experiment": name}`).

`claim` also takes the workdir's lock (`.lock`: host, pid, process start and date), which the runner gives back
(`release`) when it ends; a second process on the same workdir is refused in one line ("W is in use by pid N on
HOST since T"), and a lock left by a process that no longer runs (killed) is taken over with one warning.

Refusals, each one line that names the workdir and the way out:
* the path is a file, or cannot be created / written;
* the workdir holds a run of another experiment ("W holds a run of experiment X; use another --workdir");
* the workdir was started with another config, differing in keys that change the computation (the model, the
  data, the method, the optimizer, the seed, ...). Keys that only change how a run is executed or how long it
  goes on may differ on resume (`RESUMABLE`: the mesh and sharding rules, num_steps, logging / eval /
  checkpoint cadence, TensorBoard);
* the workdir's config.json lacks a key added since its run started: taken with today's value when that equals
  the value the code used before the key existed (`ADDED`, one info line), refused naming the key otherwise.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import socket
import tempfile
from typing import Any

import ml_collections

from jaxlab import configs, faults
from jaxlab import metrics as metrics_lib
from jaxlab.errors import CheckpointError, ConfigError

# Keys that may change between a run and its resumption (they change execution, not the computed results).
RESUMABLE = ("mesh", "sharding_rules", "tensorboard", "train.num_steps", "train.log_every", "train.eval_every",
             "train.checkpoint_every", "train.keep_checkpoints", "train.async_checkpoint", "train.eval_batch_size")


# Keys added to the configs after runs could have started, with the value the code used before each existed (a
# dotted suffix matches the key in any section). A workdir whose config.json lacks such a key resumes when today's
# value equals the old one; otherwise the refusal names the key and the value that resumes it.
ADDED: dict[str, Any] = {
    "optimizer.nesterov": False,   # before the key, `sgd` with momentum was optax.sgd's default: no Nesterov
    "optimizer.clip_norm": 0.0,    # before the key, gradients were not clipped
}


def _added_before(key: str) -> tuple[Any] | None:
  """(the value the code used before `key` existed,) when `ADDED` records it, else None."""
  for suffix, value in ADDED.items():
    if key == suffix or key.endswith("." + suffix):
      return (value,)
  return None


def check(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any] | None:
  """Checks that `config` may run in `workdir`; writes nothing.

  Returns:
    The workdir's previous config (as a dict) when it holds one, else None.

  Raises:
    ConfigError: the path is not a usable directory, or the workdir was started with another config.
    CheckpointError: the workdir holds a run of another experiment.
  """
  _check_path(workdir)
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return None
  run = _read(os.path.join(workdir, "run.json")) or {}
  this = configs.experiment_name(config)
  if run.get("experiment") and this and run["experiment"] != this:
    raise CheckpointError(f"{workdir} holds a run of experiment {run['experiment']}, not {this}; use another --workdir")
  old = _read(path)
  if old is None:
    old = _checkpoint_config(workdir)    # a damaged config.json: the newest checkpoint holds the run's config
    if old is None:
      raise CheckpointError(f"{path} is not readable JSON and no checkpoint holds the run's config; it was not "
                            "written by jaxlab, or it is damaged: use another --workdir")
    logging.getLogger("jaxlab").warning("%s is damaged; checking against the config of the newest checkpoint "
                                        "(the file is rewritten when the run starts)", path)
  changed = changed_keys(old, config.to_dict())
  blocking = [k for k in changed if not any(k == r or k.startswith(r + ".") for r in RESUMABLE)]
  flat_old, flat_new = configs.flatten(old), configs.flatten(config.to_dict())
  added = [k for k in blocking if k not in flat_old and k in flat_new]
  taken = [k for k in added if _added_before(k) is not None and _norm(_added_before(k)[0]) == _norm(flat_new[k])]
  blocking = [k for k in blocking if k not in taken]
  for k in (k for k in blocking if k in added):
    if _added_before(k) is None:
      raise ConfigError(f"{workdir}'s config.json has no '{k}': the key was added since the run started, and the "
                        "value the code used before it is not recorded (jaxlab.workdir.ADDED); resume the run with "
                        "the code that started it, or use another --workdir")
    before = _added_before(k)[0]
    raise ConfigError(f"{workdir} was started before '{k}' existed, when the code ran as {k}={before!r}; rerun with "
                      f"--config.{k}={before!r} to resume it, or use another --workdir")
  if taken:
    logging.getLogger("jaxlab").info("%s: %s added since the run started; resuming with the value the code used "
                                     "before (%s)", workdir, ", ".join(taken),
                                     ", ".join(f"{k}={flat_new[k]!r}" for k in taken))
  if blocking:
    shown = ", ".join(f"{k}: {_short(flat_old.get(k, '(absent)'))} -> {_short(flat_new.get(k, '(absent)'))}"
                      for k in blocking[:3])
    more = f" (+{len(blocking) - 3} more)" if len(blocking) > 3 else ""
    raise ConfigError(f"{workdir} was started with a different config ({shown}{more}); rerun with the same "
                      "config to resume it, or use another --workdir")
  return old


def claim(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Takes the workdir's lock and writes `config.json` and `run.json` into `workdir` (process 0), creating it.

  Raises:
    ConfigError: another live process holds the workdir.
  """
  if not metrics_lib.is_main_process():
    return
  os.makedirs(workdir, exist_ok=True)
  lock(workdir)
  metrics_lib.write_json(os.path.join(workdir, "run.json"), {"experiment": configs.experiment_name(config)})
  metrics_lib.write_text(os.path.join(workdir, "config.json"), configs.to_json(config))


def changed_keys(old: dict, new: dict) -> list[str]:
  """Dotted keys whose values differ between two config dicts (tuples and lists compare equal)."""
  a, b = configs.flatten(old), configs.flatten(new)
  return sorted(k for k in set(a) | set(b) if _norm(a.get(k)) != _norm(b.get(k)))


def check_output_dir(path: str, flag: str) -> None:
  """Raises ConfigError when `path` (a CLI output directory, `--out` / `--workdir`) cannot be used."""
  _check_path(path, flag)


LOCK = ".lock"
_HELD: dict[str, int] = {}    # lock path -> how many runners of this process hold it (a stage's own fit, say)


def lock(workdir: str) -> None:
  """Takes `workdir`'s lock for this process (re-entrant); see the module docstring."""
  path = os.path.abspath(os.path.join(workdir, LOCK))
  if path in _HELD:
    _HELD[path] += 1
    return
  me = {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid()),
        "since": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
  faults.boundary("lock")
  for _ in range(3):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      other = _read(path)
      if other is not None and _running(other):
        raise ConfigError(f"{workdir} is in use by pid {other.get('pid')} on {other.get('host')} since "
                          f"{other.get('since')}; wait for that run to end, or use another --workdir (if it is "
                          f"gone, delete {path})") from None
      logging.getLogger("jaxlab").warning(
          "%s: taking over the lock of pid %s on %s, which no longer runs", workdir,
          (other or {}).get("pid", "?"), (other or {}).get("host", "?"))
      try:
        os.remove(path)
      except FileNotFoundError:
        pass
      continue
    with os.fdopen(fd, "w") as f:
      json.dump(me, f)
    _HELD[path] = 1
    return
  raise ConfigError(f"{workdir}: could not take its lock {path}; another process keeps taking it: use another "
                    "--workdir")


def release(workdir: str) -> None:
  """Gives back this process's hold on `workdir`'s lock (the file goes with the last hold)."""
  path = os.path.abspath(os.path.join(workdir, LOCK))
  if path not in _HELD:
    return
  _HELD[path] -= 1
  if _HELD[path] <= 0:
    del _HELD[path]
    try:
      os.remove(path)
    except FileNotFoundError:
      pass


@atexit.register
def _release_all() -> None:
  for path in list(_HELD):
    try:
      os.remove(path)
    except OSError:
      pass
  _HELD.clear()


def _process_start(pid: int) -> str | None:
  """The process's start time in clock ticks since boot (tells a reused pid apart), or None off Linux."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _running(holder: dict) -> bool:
  """Whether the lock's holder still runs (another host's holder is assumed to)."""
  if holder.get("host") != socket.gethostname():
    return True
  pid = holder.get("pid")
  if not isinstance(pid, int):
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return holder.get("start") is None or _process_start(pid) == holder.get("start")


def _checkpoint_config(workdir: str) -> dict | None:
  """The config recorded in the newest readable checkpoint's meta (`checkpoints/<step>/meta/metadata`)."""
  root = os.path.join(workdir, "checkpoints")
  steps = sorted((int(d) for d in (os.listdir(root) if os.path.isdir(root) else []) if d.isdigit()), reverse=True)
  for step in steps:
    meta = _read(os.path.join(root, str(step), "meta", "metadata"))
    if isinstance(meta, dict) and isinstance(meta.get("config"), dict):
      return meta["config"]
  return None


# ------------------------------------------------------------------------------------------- helpers


def _check_path(path: str, flag: str = "--workdir") -> None:
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f"{flag} {path} is a file, not a directory; give a directory path")
  probe = path
  while not os.path.exists(probe):
    parent = os.path.dirname(os.path.abspath(probe))
    if parent == os.path.abspath(probe):
      break
    probe = parent
  if os.path.isfile(probe):
    raise ConfigError(f"{flag} {path}: {probe} is a file, so the directory cannot be created there")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise ConfigError(f"{flag} {path}: {probe} is not writable; choose a directory you can write to")
  if not os.path.exists(path):   # permissions can say yes where the file system says no (/proc, /sys, a full disk)
    try:
      os.rmdir(tempfile.mkdtemp(prefix=".jaxlab_probe_", dir=probe))
    except OSError as e:
      raise ConfigError(f"{flag} {path}: a directory cannot be created in {probe} ({e.strerror or e}); choose a "
                        "directory you can write to") from None


def _read(path: str):
  if not os.path.exists(path):
    return None
  try:
    return metrics_lib.read_json(path)
  except (OSError, ValueError):
    return None


def _norm(v):
  return [_norm(x) for x in v] if isinstance(v, (list, tuple)) else v


def _short(v) -> str:
  text = repr(v)
  return text if len(text) <= 40 else text[:37] + "..."
