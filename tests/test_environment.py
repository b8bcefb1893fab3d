"""What a user's process gets from the environment the README installs: no TPU start-up noise on a machine without
TPUs (libtpu comes with the test extras), and no torch import for TensorBoard logging."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stderr(code):
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}     # as a user's shell has it
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  return r.stderr


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed (pip install "
                    "'jaxlab[tpu-aot]'): nothing would print TPU start-up errors")
def test_no_tpu_startup_lines_without_a_tpu():
  if any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0")):
    pytest.skip("this machine has a TPU")
  err = _stderr("import jaxlab, jax; jax.devices(); from jaxlab import reproduce")
  assert "TPU" not in err and "E0000" not in err and "host bounds" not in err, err[-2000:]


def test_tensorboard_logging_does_not_import_torch(tmp_path):
  pytest.importorskip("tensorboardX", reason="tensorboardX is not installed: pip install 'jaxlab[tensorboard]'")
  code = (f"import sys; from jaxlab import metrics; w = metrics.MetricWriter({str(tmp_path)!r}, tensorboard=True); "
          "w.write(1, {'a': 1.0}); w.close(); assert w._tb is not None; "
          "assert 'torch' not in sys.modules, 'torch was imported'; import importlib.util; "
          "assert importlib.util.find_spec('torch') is None or __import__('torch') is not None")
  _stderr(code)
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "tb"))
