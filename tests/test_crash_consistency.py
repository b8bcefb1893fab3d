"""Crash consistency of the runners: every damage a kill, a torn write or a second process can leave gives one
line or a rerun that ends identical to an uninterrupted run (`run_loop` through the toy experiment's `fit`, and
`run_stages`)."""

import json
import os
import re
import shutil
import subprocess
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import pytest

from jaxlab import configs, metrics, workdir as workdir_lib
from jaxlab.errors import CheckpointError, ConfigError
from jaxlab.train import run_stages

VOLATILE = ("wall_s", "resumes", "train/steps_per_sec")


def _strip(d):
  return {k: v for k, v in d.items() if k not in VOLATILE}


def _rows(wd):
  return [_strip(r) for r in metrics.read_metrics(str(wd))]


def _fit(toy, wd):
  c = toy.get_config("tiny", {"train.num_steps": 20, "train.log_every": 5, "train.eval_every": 10,
                              "train.checkpoint_every": 10})
  return toy.train_module.train_and_evaluate(c, str(wd))


def _stages():
  def draw(ctx):
    x = jax.random.normal(ctx.key(), (8,))
    ctx.state = {"total": ctx.state["total"] + x.sum()}
    return {"mean": float(x.mean()), "x": x}

  def report(ctx):
    return {"total": float(ctx.state["total"]), "first": float(ctx.results["draw0"]["x"][0])}
  return {"draw0": draw, "draw1": draw, "report": report}


def _staged(wd):
  c, _ = configs.variant_config("seed=0")
  return run_stages(configs.finalize(c), str(wd), _stages(), state={"total": jnp.zeros(())})


@pytest.fixture(scope="module")
def fit_ref(toy, tmp_path_factory):
  wd = tmp_path_factory.mktemp("fit") / "ref"
  return wd, _fit(toy, wd)


@pytest.fixture(scope="module")
def staged_ref(tmp_path_factory):
  wd = tmp_path_factory.mktemp("staged") / "ref"
  return wd, _staged(wd)


def test_killed_before_the_summary_the_rerun_writes_the_full_summary(toy, fit_ref, tmp_path):
  ref_wd, ref = fit_ref
  wd = tmp_path / "run"
  shutil.copytree(ref_wd, wd)
  os.remove(wd / "summary.json")                  # the state a kill after the last checkpoint leaves
  again = _fit(toy, wd)
  assert any(k.startswith("eval/") for k in again) and any(k.startswith("train/") for k in again)
  assert _strip(again) == _strip(ref) and _rows(wd) == _rows(ref_wd)


def test_a_torn_summary_or_last_row_is_dropped_and_the_rerun_ends_identical(toy, fit_ref, tmp_path, caplog):
  ref_wd, ref = fit_ref
  wd = tmp_path / "run"
  shutil.copytree(ref_wd, wd)
  shutil.rmtree(wd / "checkpoints" / "20")          # back to step 10, with a torn row after it
  with open(wd / "summary.json", "w") as f:
    f.write('{"step": 2')
  rows = (wd / "metrics.jsonl").read_text().splitlines()
  keep = [r for r in rows if json.loads(r)["step"] <= 10]
  (wd / "metrics.jsonl").write_text("\n".join(keep) + '\n{"step": 15, "train/lo')
  again = _fit(toy, wd)
  assert _strip(again) == _strip(ref) and _rows(wd) == _rows(ref_wd)
  assert "torn last row" in caplog.text and "summary.json is damaged" in caplog.text


def test_a_damaged_row_before_the_last_is_one_line(tmp_path):
  (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
  with pytest.raises(Exception, match=r"line 2 is not a JSON row"):
    metrics.read_metrics(str(tmp_path))


class _Kill(BaseException):
  """Stands for SIGKILL at a write boundary: nothing after it runs, no handler sees it."""


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_staged_run_killed_between_a_checkpoint_and_its_row_replays_the_row(staged_ref, tmp_path, stage):
  ref_wd, ref = staged_ref
  wd = tmp_path / "run"
  real = metrics.MetricWriter.write

  def write(self, step, values):
    if step == stage and "stage" in values:
      raise _Kill
    real(self, step, values)
  with mock.patch.object(metrics.MetricWriter, "write", write), pytest.raises(_Kill):
    _staged(wd)
  assert len(metrics.read_metrics(str(wd))) == stage - 1     # the stage is checkpointed, its row is not
  again = _staged(wd)
  assert _strip(again) == _strip(ref) and _rows(wd) == _rows(ref_wd)


def test_a_damaged_stage_array_file_is_one_line_naming_it(staged_ref, tmp_path):
  wd = tmp_path / "run"
  shutil.copytree(staged_ref[0], wd)
  os.remove(wd / "summary.json")
  npz = wd / "stages" / "000_draw0.npz"
  npz.write_bytes(npz.read_bytes()[:40])
  with pytest.raises(CheckpointError, match="000_draw0.npz, the arrays of stage 1 \\(draw0\\), is damaged"):
    _staged(wd)


def test_a_damaged_config_json_resumes_from_the_checkpoint(toy, fit_ref, tmp_path, caplog):
  ref_wd, ref = fit_ref
  wd = tmp_path / "run"
  shutil.copytree(ref_wd, wd)
  shutil.rmtree(wd / "checkpoints" / "20")
  os.remove(wd / "summary.json")
  (wd / "config.json").write_text('{"data": ')
  assert _strip(_fit(toy, wd)) == _strip(ref)
  assert "config.json is damaged" in caplog.text
  json.loads((wd / "config.json").read_text())


def test_a_workdir_in_use_is_refused_and_a_dead_holders_lock_taken_over(toy, fit_ref, tmp_path, caplog):
  ref_wd, ref = fit_ref
  wd = tmp_path / "run"
  shutil.copytree(ref_wd, wd)
  os.remove(wd / "summary.json")
  holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    import socket
    lock = {"host": socket.gethostname(), "pid": holder.pid, "start": workdir_lib._process_start(holder.pid),
            "since": "2026-12-07T00:00:00Z"}
    (wd / workdir_lib.LOCK).write_text(json.dumps(lock))
    listing = sorted(os.listdir(wd))
    with pytest.raises(ConfigError, match=f"is in use by pid {holder.pid} on .* since 2026-12-07T00:00:00Z"):
      _fit(toy, wd)
    assert sorted(os.listdir(wd)) == listing
  finally:
    holder.kill()
    holder.wait()
  assert _strip(_fit(toy, wd)) == _strip(ref)        # its holder is gone: taken over with a warning
  assert "no longer runs" in caplog.text and not (wd / workdir_lib.LOCK).exists()


def test_two_runs_on_one_workdir_the_second_is_refused(tmp_path):
  """A second process while the first trains: one line, exit 2; the first run's rows stay in order."""
  import signal
  import time
  toy = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "toy", "config.py")
  wd = str(tmp_path / "run")
  cmd = [sys.executable, "-m", "jaxlab.main", f"--config={toy}:tiny", f"--workdir={wd}",
         "--config.train.num_steps=1000000", "--config.train.checkpoint_every=1000000"]
  env = {**os.environ, "JAXLAB_PROGRESS": "0"}
  first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    for _ in range(1200):
      if os.path.exists(os.path.join(wd, workdir_lib.LOCK)) or first.poll() is not None:
        break
      time.sleep(0.1)
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
  finally:
    first.send_signal(signal.SIGTERM)                # preempted: it checkpoints and stops
    first.communicate(timeout=300)
  assert second.returncode == 2, second.stderr[-2000:]
  assert "is in use by pid" in second.stderr.strip().splitlines()[-1]
  steps = [r["step"] for r in metrics.read_metrics(wd)]
  assert steps == sorted(steps) and not os.path.exists(os.path.join(wd, workdir_lib.LOCK))


def test_a_full_disk_is_one_line_and_exit_1(monkeypatch, capsys):
  import errno
  from jaxlab import cli

  def main(argv):
    del argv
    try:
      raise OSError(errno.ENOSPC, "No space left on device", "/w/checkpoints/10/model/d/abc")
    except OSError as e:
      raise RuntimeError("orbax: save failed") from e
  monkeypatch.setattr(sys, "argv", ["prog"])
  # In-process: a plain exit instead of the watchdog that ends a real process whose save threads hang (the
  # tmpfs test below runs the real one).
  monkeypatch.setattr(cli, "_exit_after_a_failed_write", sys.exit)
  with pytest.raises(SystemExit) as e:
    cli.main_wrapper(main)
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 1 and len(err) == 1
  assert err[0].startswith("error: no space left on / (") and "while writing /w/checkpoints/10/model/d/abc" in err[0]
  assert err[0].endswith("the run resumes from its last checkpoint")


TOY_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "toy", "config.py")
_FIT_FLAGS = ("--config.train.num_steps=20", "--config.train.log_every=5", "--config.train.eval_every=10",
              "--config.train.checkpoint_every=10")     # the command line of `_fit`


def _one_line(stderr: str, pattern: str) -> str:
  """The CLI's one `error:` line (matched by `pattern`) in `stderr`, checking that nothing else went wrong.

  Known residue, not yet removed: tensorstore's C++ callbacks can print "RuntimeError: Event loop is closed"
  tracebacks from their own threads when a failed save has closed orbax's event loop (past Python's hooks, and
  interleaved with other output; about one run in three under load). Those are tolerated; any other traceback
  (orbax's save threads, ours) fails the test.
  """
  assert stderr.count("error: ") == 1, stderr[-3000:]
  found = re.search(pattern, stderr)
  assert found, stderr[-3000:]
  if "Traceback" in stderr:
    assert "Event loop is closed" in stderr and "orbax" not in stderr and "jaxlab" not in stderr, stderr[-3000:]
  return found.group(0)


def _newest_checkpoint(wd):
  root = os.path.join(wd, "checkpoints")
  steps = [int(d) for d in os.listdir(root) if d.isdigit()] if os.path.isdir(root) else []
  return f"from step {max(steps)}" if steps else "from the start (no checkpoint was written)"


def _toy_cli(wd):
  """`_fit`'s run as a user starts it (`python -m jaxlab.main`), in a subprocess."""
  cmd = [sys.executable, "-m", "jaxlab.main", f"--config={TOY_CONFIG}:tiny", f"--workdir={wd}", *_FIT_FLAGS]
  return subprocess.run(cmd, env={**os.environ, "JAXLAB_PROGRESS": "0"}, capture_output=True, text=True,
                        timeout=300, check=False)


def _rerun_ends_identical(wd, fit_ref):
  again = _toy_cli(wd)
  assert again.returncode == 0, again.stderr[-2000:]
  ref_wd, ref = fit_ref
  assert _rows(wd) == _rows(ref_wd)
  assert _strip(metrics.read_json(str(wd / "summary.json"))) == _strip(metrics.jsonable(ref))


def _mount_tmpfs(path, size):
  if not sys.platform.startswith("linux") or os.geteuid() != 0:
    pytest.skip("a full-disk test mounts a small tmpfs, which needs root on Linux")
  os.makedirs(path)
  r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                     text=True, check=False)
  if r.returncode:
    pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); the container lacks CAP_SYS_ADMIN")


def test_a_full_tmpfs_is_one_line_then_the_rerun_ends_identical(toy, fit_ref, tmp_path):
  """A real full file system (a 1 MiB tmpfs with a filler file): the run stops at the checkpoint that does not
  fit with one line naming the mount, the file and the step to resume from (exit 1, no traceback, no hang); with
  the filler gone, the same command resumes and ends with an uninterrupted run's rows and summary."""
  disk = tmp_path / "disk"
  _mount_tmpfs(disk, "1m")
  try:
    st = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:      # leaves ~260 KiB: the step-10 checkpoint fits, step 20's does not
      f.write(b"\0" * (st.f_bavail * st.f_frsize - 260 * 1024))
    wd = disk / "run"
    full = _toy_cli(wd)
    assert full.returncode == 1, full.stderr[-2000:]
    line = _one_line(full.stderr, rf"error: no space left on {re.escape(str(disk))} \([0-9.]+ MiB free of [0-9.]+\)"
                                  r"[^\n]*the run resumes (from step \d+|from the start \(no checkpoint was written\))")
    assert line.endswith(f"the run resumes {_newest_checkpoint(wd)}"), line
    assert not os.path.exists(wd / workdir_lib.LOCK)
    os.remove(disk / "filler")
    _rerun_ends_identical(wd, fit_ref)
  finally:
    subprocess.run(["umount", str(disk)], check=False)


def test_a_read_only_checkpoints_directory_is_one_line_then_the_rerun_ends_identical(toy, fit_ref, tmp_path):
  """The checkpoints directory on a read-only mount: the first save fails with one line naming the path (exit
  1, no traceback, no hang in orbax's save threads); made writable, the same command runs to the end."""
  wd = tmp_path / "run"
  _mount_tmpfs(wd / "checkpoints", "4m")
  try:
    subprocess.run(["mount", "-o", "remount,ro", str(wd / "checkpoints")], check=True)
    ro = _toy_cli(wd)
    assert ro.returncode == 1, ro.stderr[-2000:]
    _one_line(ro.stderr, r"error: \S+ cannot be written \(read-only[^\n]*the run resumes from the start \(no "
                         r"checkpoint was written\)")
    assert not os.path.exists(wd / workdir_lib.LOCK)
    subprocess.run(["mount", "-o", "remount,rw", str(wd / "checkpoints")], check=True)
    _rerun_ends_identical(wd, fit_ref)
  finally:
    subprocess.run(["umount", str(wd / "checkpoints")], check=False)
