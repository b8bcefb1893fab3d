"""Checks every experiment must pass (the project's testing rules); each tests/experiments/test_<paper>.py calls them.

* `check_end_to_end`: the tiny variant (shortened) trains and writes config.json, metrics.jsonl,
  summary.json and a checkpoint; returns the summary.
* `check_resume`: deleting the final checkpoint and summary and rerunning resumes from the previous
  checkpoint and ends with the same summary (bit-identical metrics on CPU).
* `check_sharded_equals_single`: a 4x2 (data, model) mesh logs the same metrics as one device.
* `check_sigterm_resume` (staged experiments): SIGTERM arriving inside a stage and between two stages stops
  the run after recording the stage; the rerun resumes and ends with the reference's summary.
* `sigterm_on_write(when)`: a context in which SIGTERM is sent right after a metrics row that `when` selects.
* `canary_covered`: the mark of an end-to-end test whose whole path (every stage, arm and claim) the experiment's
  canary runs; such a test runs with `pytest -m slow`, not in the default run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from unittest import mock

import numpy as np
import pytest

from jaxlab import configs, metrics, registry

canary_covered = pytest.mark.slow
"""Marks an end-to-end run of an experiment's tiny variant with every arm and stage: out of the default run.

Its path is the canary's (`CANARY` in experiments/<paper>/config.py; `tests/test_canary.py` checks that it plans
every kind of stage the claim run does). Every landed change to an experiment's code either re-ran its claims or
ran its canary at both commits with bit-identical outputs (`python -m jaxlab.reproduce --verify`), and CI refuses
a stale ledger (`reproduce --stale`), so the code on main has run this path. The finer assertions of such a test
run with `python -m pytest -m slow FILE`: run them with `--verify` before landing a change to the experiment.
"""

VOLATILE = ("wall_s", "resumes", "train/steps_per_sec", "mesh", "num_devices")
VOLATILE_PREFIXES = ("speed/", "speedup/")    # measured throughputs (timings differ from run to run)


def _volatile(key: str) -> bool:
  return key in VOLATILE or key.startswith(VOLATILE_PREFIXES)


def _run(name, workdir, overrides):
  exp = registry.load(name)
  c = exp.get_config("tiny", overrides)
  configs.check_devices(c, 8)
  return exp.train_module.train_and_evaluate(c, str(workdir))


def _strip(summary):
  return {k: v for k, v in summary.items() if not _volatile(k)}


def check_end_to_end(name: str, workdir, overrides: dict) -> dict:
  summary = _run(name, workdir, overrides)
  for f in ("config.json", "metrics.jsonl", "summary.json"):
    assert os.path.exists(os.path.join(workdir, f)), f"{name}: no {f}"
  steps = [s for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit()]
  assert steps, f"{name}: no checkpoint written"
  assert metrics.read_metrics(str(workdir)), f"{name}: metrics.jsonl is empty"
  return summary


def check_resume(name: str, workdir, overrides: dict) -> None:
  """Needs `overrides` with checkpoint_every < num_steps so an earlier checkpoint exists."""
  first = _run(name, workdir, overrides)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  steps = sorted(int(s) for s in os.listdir(ckpt_dir) if s.isdigit())
  assert len(steps) >= 2, f"{name}: need two checkpoints to test resume, got {steps}"
  shutil.rmtree(os.path.join(ckpt_dir, str(steps[-1])))
  os.remove(os.path.join(workdir, "summary.json"))
  second = _run(name, workdir, overrides)
  a, b = _strip(first), _strip(second)
  assert a == b, f"{name}: resumed run differs: {a} vs {b}"


def check_sharded_equals_single(name: str, tmp_path, overrides: dict, rtol: float = 1e-5) -> None:
  runs = {}
  for label, mesh in (("sharded", (("data", 4), ("model", 2))), ("single", (("data", 1), ("model", 1)))):
    wd = os.path.join(tmp_path, label)
    _run(name, wd, {**overrides, "mesh": mesh})
    runs[label] = metrics.read_metrics(wd)
  assert len(runs["sharded"]) == len(runs["single"]) > 0
  for a, b in zip(runs["sharded"], runs["single"]):
    keys = [k for k in a if not _volatile(k) and k != "step" and isinstance(a[k], (int, float))]
    assert keys and a["step"] == b["step"]
    np.testing.assert_allclose([a[k] for k in keys], [b[k] for k in keys], rtol=rtol, atol=1e-7,
                               err_msg=f"{name}: sharded vs single device at step {a['step']}")


@contextlib.contextmanager
def sigterm_on_write(when):
  """Within the block, every metrics row is written as usual, then SIGTERM is sent to this process when
  `when(writer, step, values)` holds (a deterministic preemption point)."""
  real_write = metrics.MetricWriter.write

  def write(self, step, values):
    real_write(self, step, values)
    if when(self, step, values):
      os.kill(os.getpid(), signal.SIGTERM)
  with mock.patch.object(metrics.MetricWriter, "write", write):
    yield


def check_sigterm_resume(name: str, tmp_path, overrides: dict, inside: int = 1, reference: dict | None = None) -> None:
  """SIGTERM inside stage `inside`, then (in the resumed run) between stages `inside + 1` and `inside + 2`:
  each run stops after recording the stage it was in, the reruns resume, and the final summary equals an
  uninterrupted run's. Needs at least `inside + 3` stages.

  The signal is sent deterministically: when the progress bar names stage `inside` (its start), and when
  stage `inside + 1`'s metrics row is written (after its checkpoint).
  """
  from jaxlab import progress
  from jaxlab.train import Preempted
  ref = reference if reference is not None else _run(name, os.path.join(tmp_path, "reference"), overrides)
  real_bar = progress.bar

  def bar_sending_at(stage_index):
    def make(*args, **kwargs):
      b = real_bar(*args, **kwargs)
      count = {"n": kwargs.get("initial", 0)}
      real_set = b.set_description

      def set_description(desc, *a, **k):
        if count["n"] == stage_index:
          os.kill(os.getpid(), signal.SIGTERM)
        count["n"] += 1
        return real_set(desc, *a, **k)
      b.set_description = set_description
      return b
    return make

  wd = os.path.join(tmp_path, "interrupted")
  with mock.patch.object(progress, "bar", bar_sending_at(inside)):
    try:
      _run(name, wd, overrides)
      raise AssertionError(f"{name}: SIGTERM inside stage {inside} did not stop the run")
    except Preempted:
      pass
  with sigterm_on_write(lambda _, step, values: "stage" in values and step == inside + 2):
    try:
      _run(name, wd, overrides)
      raise AssertionError(f"{name}: SIGTERM after stage {inside + 1} did not stop the run")
    except Preempted:
      pass
  final = _run(name, wd, overrides)
  assert _strip(final) == _strip(ref), f"{name}: interrupted + resumed run differs from the reference"
