"""A damaged checkpoint (an array file zeroed or truncated) is one readable line, on every try."""

import glob
import os
import shutil
import time

import pytest

from jaxlab.errors import CheckpointError


@pytest.fixture(scope="module")
def finished(toy, tmp_path_factory):
  wd = tmp_path_factory.mktemp("damage") / "run"
  c = toy.get_config("tiny", {"train.num_steps": 10})
  toy.train_module.train_and_evaluate(c, str(wd))
  return wd


def _data_files(wd):
  """The files a restore reads array data from (OCDBT manifests and data files of each item)."""
  step = os.path.join(wd, "checkpoints", "10")
  return sorted(f for item in ("model", "train") for f in glob.glob(os.path.join(step, item, "*"))
                if os.path.isfile(f) and (f.endswith("manifest.ocdbt") or os.path.basename(f).startswith("_METADATA"))) \
      + sorted(glob.glob(os.path.join(step, "*", "d", "*")))


@pytest.mark.parametrize("attempt", range(20))
def test_damaged_array_file_is_one_line(toy, finished, tmp_path, capfd, attempt):
  files = _data_files(finished)
  target = files[attempt % len(files)]
  wd = tmp_path / "run"
  shutil.copytree(finished, wd)
  os.remove(wd / "summary.json")
  damaged = str(target).replace(str(finished), str(wd))
  size = os.path.getsize(damaged)
  with open(damaged, "r+b") as f:
    if attempt % 2:
      f.truncate(size // 2)
    else:
      f.write(b"\0" * size)
  capfd.readouterr()
  c = toy.get_config("tiny", {"train.num_steps": 12})
  with pytest.raises(CheckpointError) as e:
    toy.train_module.train_and_evaluate(c, str(wd))
  time.sleep(0.3)   # give any straggling native thread the chance to print
  msg = str(e.value)
  assert "\n" not in msg and "is damaged" in msg and "delete that step folder" in msg, msg
  assert "DATA_LOSS" not in msg and "zarr" not in msg and "coroutine" not in msg
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Event loop" not in err and "coroutine" not in err, err[-2000:]


def test_damaged_checkpoint_from_the_command_line_is_exactly_one_line(finished, tmp_path, root):
  """Also at interpreter exit (where abandoned reads report themselves), over a few processes."""
  import subprocess
  import sys
  wd = tmp_path / "run"
  shutil.copytree(finished, wd)
  os.remove(wd / "summary.json")
  for f in glob.glob(str(wd / "checkpoints" / "10" / "train" / "d" / "*")):
    with open(f, "r+b") as h:
      h.write(b"\0" * os.path.getsize(f))
  for _ in range(3):
    r = subprocess.run([sys.executable, "-m", "jaxlab.main", "--config", "tests/fixtures/toy/config.py:tiny",
                        "--workdir", str(wd), "--config.train.num_steps=12"], cwd=root, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, JAXLAB_LOGLEVEL="WARNING"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr[-3000:]
    assert r.stderr.startswith("error: checkpoint ") and "is damaged" in r.stderr
