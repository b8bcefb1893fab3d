"""Checks every experiment must pass (DESIGN.md, Testing); each tests/experiments/test_<paper>.py calls them.

* `check_end_to_end`: the tiny variant (shortened) trains and writes config.json, metrics.jsonl,
  summary.json and a checkpoint; returns the summary.
* `check_resume`: deleting the final checkpoint and summary and rerunning resumes from the previous
  checkpoint and ends with the same summary (bit-identical metrics on CPU).
* `check_sharded_equals_single`: a 4x2 (data, model) mesh logs the same metrics as one device.
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from jaxlab import configs, metrics, registry

VOLATILE = ("wall_s", "train/steps_per_sec", "mesh", "num_devices")


def _run(name, workdir, overrides):
  exp = registry.load(name)
  c = exp.get_config("tiny")
  configs.apply_overrides(c, overrides)
  configs.validate(c, num_devices=8)
  return exp.train_module.train_and_evaluate(c, str(workdir))


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
  a = {k: v for k, v in first.items() if k not in VOLATILE}
  b = {k: v for k, v in second.items() if k not in VOLATILE}
  assert a == b, f"{name}: resumed run differs: {a} vs {b}"


def check_sharded_equals_single(name: str, tmp_path, overrides: dict, rtol: float = 1e-5) -> None:
  runs = {}
  for label, mesh in (("sharded", (("data", 4), ("model", 2))), ("single", (("data", 1), ("model", 1)))):
    wd = os.path.join(tmp_path, label)
    _run(name, wd, {**overrides, "mesh": mesh})
    runs[label] = metrics.read_metrics(wd)
  assert len(runs["sharded"]) == len(runs["single"]) > 0
  for a, b in zip(runs["sharded"], runs["single"]):
    keys = [k for k in a if k not in VOLATILE and k != "step" and isinstance(a[k], (int, float))]
    assert keys and a["step"] == b["step"]
    np.testing.assert_allclose([a[k] for k in keys], [b[k] for k in keys], rtol=rtol, atol=1e-7,
                               err_msg=f"{name}: sharded vs single device at step {a['step']}")
