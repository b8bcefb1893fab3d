"""The multi-host path for real: 2 local processes x 4 CPU devices (gloo) == 1 process x 8 devices."""

import os
import socket
import subprocess
import sys

import numpy as np

from jaxlab import configs, metrics


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_match_one_process(toy, tmp_path, root):
  mesh = "(('data', 4), ('model', 2))"
  wd = tmp_path / "multi"
  port = _free_port()
  procs = []
  for pid in range(2):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               JAXLAB_COORDINATOR=f"localhost:{port}", JAXLAB_NUM_PROCESSES="2", JAXLAB_PROCESS_ID=str(pid))
    cmd = [sys.executable, "-m", "jaxlab.main", "--config", os.path.join(root, "tests/fixtures/toy/config.py:tiny"),
           "--workdir", str(wd), f"--config.mesh={mesh}", "--config.train.num_steps=20"]
    procs.append(subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  outs = [p.communicate(timeout=600)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  # Process 0 alone wrote the records; the checkpoint was written by both together.
  assert os.path.exists(wd / "checkpoints" / "20")
  c = toy.get_config("tiny")
  configs.apply_overrides(c, {"mesh": (("data", 4), ("model", 2)), "train.num_steps": 20})
  single = toy.train_module.train_and_evaluate(c, str(tmp_path / "single"))
  multi = metrics.read_json(str(wd / "summary.json"))
  rows = lambda w: [(r["step"], r["train/loss"]) for r in metrics.read_metrics(str(w)) if "train/loss" in r]  # noqa
  a, b = rows(wd), rows(tmp_path / "single")
  assert [s for s, _ in a] == [s for s, _ in b] == [5, 10, 15, 20]
  np.testing.assert_allclose([v for _, v in a], [v for _, v in b], rtol=1e-5)
  np.testing.assert_allclose(multi["eval/accuracy"], single["eval/accuracy"], rtol=1e-6)
  assert multi["num_devices"] == 8
