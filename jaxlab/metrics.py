"""Metrics and run records: `metrics.jsonl`, `config.json`, `summary.json` (process 0 writes).

`metrics.jsonl` holds one JSON object per logged step: `{"step": 100, "train/loss": 0.3, ...}`. When a run
resumes from a checkpoint at step s, rows after s (logged by the interrupted run but not covered by the
checkpoint) are dropped, so the file always reads as one uninterrupted run.

A step may report a metric as `Weighted(value, weight)`: a mean over `weight` units (tokens, examples).
Over a logging window the loop reports sum(value * weight) / sum(weight) (`aggregate`), so steps with more
tokens count more; plain scalars are averaged over the steps.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from typing import Any, Mapping

import flax
import jax
import numpy as np

from jaxlab import faults


@flax.struct.dataclass
class Weighted:
  """A metric that is a mean over `weight` units (a pytree, returned from jitted steps).

  Attributes:
    value: the mean (scalar).
    weight: the number of units it averages over (scalar, e.g. loss tokens).
  """
  value: Any
  weight: Any


def aggregate(rows: list[Mapping[str, Any]]) -> dict[str, float]:
  """Combines per-step metric rows (host values) into one: weighted means for `Weighted`, means otherwise.

  Args:
    rows: one dict per step, values scalars or `Weighted` (fetched to the host).

  Returns:
    {name: float}: sum(value * weight) / sum(weight) in float64 for `Weighted` metrics, the mean over the
    steps for the others.
  """
  out = {}
  for k in (rows[0] if rows else {}):
    vals = [r[k] for r in rows]
    if isinstance(vals[0], Weighted):
      v = np.array([float(np.asarray(x.value)) for x in vals], np.float64)
      w = np.array([float(np.asarray(x.weight)) for x in vals], np.float64)
      out[k] = float(np.sum(v * w) / np.sum(w)) if np.sum(w) > 0 else float(np.mean(v))
    else:
      out[k] = float(np.mean(vals))
  return out


def is_main_process() -> bool:
  """True on the process that writes files (process 0)."""
  return jax.process_index() == 0


def write_json(path: str, obj: Any) -> None:
  """Writes JSON atomically (temp file + rename) from process 0; NaN/inf become null."""
  write_text(path, json.dumps(_jsonable(obj), indent=2, sort_keys=True), kind="json")


def write_text(path: str, text: str, kind: str = "text") -> None:
  """Writes a text file atomically (temp file + rename) from process 0; `kind` names its write boundary
  (`jaxlab.faults`: "<kind>:<file name>")."""
  if not is_main_process():
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp"
  faults.boundary(f"{kind}:{os.path.basename(path)}")
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)
  faults.boundary(f"{kind}:{os.path.basename(path)}/done")


def file_sha256(path: str) -> str:
  """Hex SHA-256 of a file's bytes (read in 1 MiB blocks)."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def read_json(path: str) -> Any:
  """Reads a JSON file."""
  with open(path) as f:
    return json.load(f)


def read_json_or_none(path: str, what: str = "") -> Any:
  """A JSON file's content; None when it is missing, or damaged (a write cut short: warned once, in one line)."""
  if not os.path.exists(path):
    return None
  try:
    return read_json(path)
  except (OSError, ValueError) as e:
    logging.getLogger("jaxlab").warning("%s is damaged (%s); %s", path, type(e).__name__,
                                        what or "it is treated as missing")
    return None


def read_metrics(workdir: str) -> list[dict]:
  """Rows of `workdir/metrics.jsonl` (empty list when missing).

  A torn last row (a write cut short by a kill or a full disk) is dropped with one warning; a damaged row
  before the last is a DataError naming the line.
  """
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = f.read().split("\n")
  rows = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except ValueError:
      if any(rest.strip() for rest in lines[i + 1:]):
        from jaxlab.errors import DataError  # pylint: disable=g-import-not-at-top
        raise DataError(f"{path}: line {i + 1} is not a JSON row (the file is damaged); delete that line, or use "
                        "another --workdir") from None
      logging.getLogger("jaxlab").warning("%s: dropped a torn last row (a write cut short by a kill or a full "
                                          "disk); the run goes on from its checkpoint", path)
  return rows


class MetricWriter:
  """Appends metrics to `workdir/metrics.jsonl` (and TensorBoard when asked); no-op off process 0.

  Args:
    workdir: run directory.
    resume_step: the step the run restarts from; rows with a larger step are dropped (None or 0: a fresh
      run, the file is started anew).
    replay: optional `kept rows -> missing rows`: rows of steps the checkpoint covers that the file lacks
      (e.g. a staged run killed between a stage's checkpoint and its row), merged in step order.
    tensorboard: also write TensorBoard events to `workdir/tb` when tensorboardX is installed
      (pip install 'jaxlab[tensorboard]'); without it only metrics.jsonl is written.
  """

  def __init__(self, workdir: str, resume_step: int | None = None, tensorboard: bool = False,
               replay: Any = None):
    self.enabled = is_main_process()
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    rows = [r for r in read_metrics(workdir) if resume_step and r.get("step", 0) <= resume_step]
    if replay is not None:        # rows the checkpoint covers but the file lost: put back in step order
      rows = sorted(rows + [_jsonable(dict(r)) for r in replay(rows)], key=lambda r: r.get("step", 0))
    tmp = self.path + ".tmp"      # the kept rows replace the file whole (a kill here loses none)
    faults.boundary("metrics:rewrite")
    with open(tmp, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, self.path)
    faults.boundary("metrics:rewrite/done")
    if tensorboard:
      tensorboardX = _import_tensorboardx()
      if tensorboardX is None:
        logging.getLogger("jaxlab").info("tensorboardX not installed; writing metrics.jsonl only")
      else:
        self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, "tb"))

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Appends one row `{"step": step, **metrics}` (values converted to Python floats)."""
    if not self.enabled:
      return
    row = {"step": int(step), **_jsonable(dict(metrics))}
    faults.boundary("metrics:row")
    with open(self.path, "a") as f:   # one write per row: a kill leaves at most a torn last row (see read_metrics)
      f.write(json.dumps(row) + "\n")
    if self._tb is not None:
      for k, v in row.items():
        if k != "step" and isinstance(v, (int, float)):
          self._tb.add_scalar(k, v, step)

  def close(self) -> None:
    """Flushes TensorBoard events."""
    if self._tb is not None:
      self._tb.close()


def _import_tensorboardx():
  """tensorboardX, or None when it is not installed.

  tensorboardX's writer imports torch at import time when torch is installed, only to accept torch tensors as
  values (about 1.4 s and 300 MB per process); the rows logged here are Python floats, so unless the process
  has imported torch already, torch is kept out of that import (and stays importable afterwards).
  """
  import sys  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  blocked = "torch" not in sys.modules
  if blocked:
    sys.modules["torch"] = None     # `import torch` raises ImportError, which tensorboardX handles
  try:
    return importlib.import_module("tensorboardX")
  except ImportError:
    return None
  finally:
    if blocked and sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]


def jsonable(obj: Any) -> Any:
  """`obj` with arrays / numpy scalars as Python values and NaN / inf as None (what the JSON files hold)."""
  return _jsonable(obj)


def _jsonable(obj: Any) -> Any:
  if isinstance(obj, Mapping):
    return {str(k): _jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_jsonable(v) for v in obj]
  if hasattr(obj, "tolist"):  # numpy / jax arrays and scalars
    return _jsonable(obj.tolist())
  if isinstance(obj, float) and not math.isfinite(obj):
    return None
  return obj
