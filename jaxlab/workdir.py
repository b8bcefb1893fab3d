"""Run directories: checked before anything is written, so a refused run leaves the workdir as it was.

Every runner (`fit`, `run_loop`, `run_stages`) calls `check(config, workdir)` first, and `claim(config, workdir)`
only once everything that can refuse the run (the workdir's owner, its config, its checkpoint's signature)
has passed. `claim` writes `config.json` and `run.json` (`{"experiment": name}`).

Refusals, each one line that names the workdir and the way out:
* the path is a file, or cannot be created / written;
* the workdir holds a run of another experiment ("W holds a run of experiment X; use another --workdir");
* the workdir was started with another config, differing in keys that change the computation (the model, the
  data, the method, the optimizer, the seed, ...). Keys that only change how a run is executed or how long it
  goes on may differ on resume (`RESUMABLE`: the mesh and sharding rules, num_steps, logging / eval /
  checkpoint cadence, TensorBoard).
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections

from jaxlab import configs
from jaxlab import metrics as metrics_lib
from jaxlab.errors import CheckpointError, ConfigError

# Keys that may change between a run and its resumption (they change execution, not the computed results).
RESUMABLE = ("mesh", "sharding_rules", "tensorboard", "train.num_steps", "train.log_every", "train.eval_every",
             "train.checkpoint_every", "train.keep_checkpoints", "train.async_checkpoint", "train.eval_batch_size")


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
    raise CheckpointError(f"{path} is not readable JSON; it was not written by jaxlab, or it is damaged: use "
                          "another --workdir")
  changed = changed_keys(old, config.to_dict())
  blocking = [k for k in changed if not any(k == r or k.startswith(r + ".") for r in RESUMABLE)]
  if blocking:
    flat_old, flat_new = configs.flatten(old), configs.flatten(config.to_dict())
    shown = ", ".join(f"{k}: {_short(flat_old.get(k, '(absent)'))} -> {_short(flat_new.get(k, '(absent)'))}"
                      for k in blocking[:3])
    more = f" (+{len(blocking) - 3} more)" if len(blocking) > 3 else ""
    raise ConfigError(f"{workdir} was started with a different config ({shown}{more}); rerun with the same "
                      "config to resume it, or use another --workdir")
  return old


def claim(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes `config.json` and `run.json` into `workdir` (process 0), creating it."""
  if not metrics_lib.is_main_process():
    return
  os.makedirs(workdir, exist_ok=True)
  metrics_lib.write_json(os.path.join(workdir, "run.json"), {"experiment": configs.experiment_name(config)})
  tmp = os.path.join(workdir, "config.json.tmp")
  with open(tmp, "w") as f:
    f.write(configs.to_json(config))
  os.replace(tmp, os.path.join(workdir, "config.json"))


def changed_keys(old: dict, new: dict) -> list[str]:
  """Dotted keys whose values differ between two config dicts (tuples and lists compare equal)."""
  a, b = configs.flatten(old), configs.flatten(new)
  return sorted(k for k in set(a) | set(b) if _norm(a.get(k)) != _norm(b.get(k)))


def check_output_dir(path: str, flag: str) -> None:
  """Raises ConfigError when `path` (a CLI output directory, `--out` / `--workdir`) cannot be used."""
  _check_path(path, flag)


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
