"""The command-line tools on the test-only toy experiment (real subprocesses, as a user runs them)."""

import json
import os
import subprocess
import sys

import pytest

TOY_CONFIG = "tests/fixtures/toy/config.py"


def _cli(root, *args, env=None):
  env = dict(os.environ, **(env or {}))
  return subprocess.run([sys.executable, "-m", *args], cwd=root, env=env, capture_output=True, text=True, timeout=600)


def test_main_runs_then_resumes(root, tmp_path):
  wd = tmp_path / "run"
  r = _cli(root, "jaxlab.main", "--config", f"{TOY_CONFIG}:tiny", "--workdir", str(wd), "--config.train.num_steps=10",
           "--config.train.optimizer.learning_rate", "0.02")
  assert r.returncode == 0, r.stderr[-2000:]
  summary = json.loads(r.stdout)
  assert summary["step"] == 10 and "eval/accuracy" in summary and summary["summary"] == str(wd / "summary.json")
  assert json.load(open(wd / "config.json"))["train"]["optimizer"]["learning_rate"] == 0.02
  assert os.path.isdir(wd / "checkpoints" / "10")
  r = _cli(root, "jaxlab.main", "--config", f"{TOY_CONFIG}:tiny", "--workdir", str(wd), "--config.train.num_steps=15",
           "--config.train.optimizer.learning_rate=0.02")
  assert r.returncode == 0 and json.loads(r.stdout)["step"] == 15
  steps = [json.loads(line)["step"] for line in open(wd / "metrics.jsonl") if "train/loss" in line]
  assert steps == [5, 10, 15]


@pytest.mark.parametrize("args,match", [
    (["--config.train.optimizer.learnig_rate=0.1"], "did you mean 'learning_rate'"),
    (["--config.train.batch_size=12"], "batch_size=12 is not divisible by the 8-way data split"),
    (["--config.train.num_steps=many"], "expects int"),
])
def test_main_bad_input_is_one_line(root, tmp_path, args, match):
  r = _cli(root, "jaxlab.main", "--config", f"{TOY_CONFIG}:tiny", "--workdir", str(tmp_path / "x"), *args,
           env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
  assert r.returncode == 2
  lines = r.stderr.strip().splitlines()
  assert lines[-1].startswith("error: ") and match in lines[-1] and "Traceback" not in r.stderr


def test_main_unknown_experiment(root, tmp_path):
  r = _cli(root, "jaxlab.main", "--config", "nosuchpaper:tiny", "--workdir", str(tmp_path))
  assert r.returncode == 2 and "unknown experiment 'nosuchpaper'" in r.stderr and "quickstart" in r.stderr


def test_reproduce_writes_results_and_exit_code(root, tmp_path):
  out = tmp_path / "rep"
  r = _cli(root, "jaxlab.reproduce", "tests/fixtures/toy", "--seeds", "0,1", "--out", str(out))
  assert r.returncode == 0, r.stderr[-2000:]
  assert "PASS" in r.stdout and "acc" in r.stdout
  res = json.load(open(out / "toy" / "results.json"))
  assert set(res) >= {"paper", "variant", "seeds", "claims", "runs", "wall_s"}
  assert res["seeds"] == [0, 1] and len(res["runs"]) == 2 and res["claims"][0]["passed"]
  assert set(res["claims"][0]) >= {"name", "text", "measured", "target", "passed"}
  assert os.path.exists(out / "toy" / "curves.png")
  # A run too short to learn fails the claim -> exit 1 and FAIL in the table.
  r = _cli(root, "jaxlab.reproduce", "tests/fixtures/toy", "--seeds", "0", "--out", str(out),
           "--config.train.num_steps=1", "--config.train.optimizer.learning_rate=1e-6")
  assert r.returncode == 1 and "FAIL" in r.stdout


def test_reproduce_list(root):
  r = _cli(root, "jaxlab.reproduce", "--list")
  names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
  assert r.returncode == 0 and "quickstart" in names and names == sorted(names)


def test_sweep_dry_run_and_index(root, tmp_path):
  r = _cli(root, "jaxlab.sweep", "--config", f"{TOY_CONFIG}:tiny", "--dry_run")
  assert r.returncode == 0 and "2 points" in r.stdout and "train.optimizer.learning_rate=0.03" in r.stdout
  r = _cli(root, "jaxlab.sweep", "--config", f"{TOY_CONFIG}:tiny", "--workdir", str(tmp_path), "--index", "1",
           "--config.train.num_steps=5")
  assert r.returncode == 0, r.stderr[-2000:]
  assert json.load(open(tmp_path / "1" / "config.json"))["train"]["optimizer"]["learning_rate"] == 0.03
  r = _cli(root, "jaxlab.sweep", "--config", f"{TOY_CONFIG}:tiny", "--workdir", str(tmp_path), "--index", "7")
  assert r.returncode == 2 and "outside the sweep's 2 points" in r.stderr


def test_bench_times_and_reports(root, tmp_path):
  r = _cli(root, "jaxlab.bench", "matmul", "--iters", "2", "--peak_tflops", "1", "--peak_gbps", "10",
           "--json", str(tmp_path / "b.json"))
  assert r.returncode == 0, r.stderr[-2000:]
  row = json.load(open(tmp_path / "b.json"))[0]
  assert row["name"].startswith("matmul/") and row["median_s"] > 0 and 0 < row["roofline_fraction"]
  r = _cli(root, "jaxlab.bench", "nosuchkernel")
  assert r.returncode == 2 and "no benchmark matches" in r.stderr


def _start(root, *args):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  return subprocess.Popen([sys.executable, "-m", *args], cwd=root, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _wait_for_rows(path, proc, rows=1, timeout=300):
  import time
  t0 = time.time()
  while time.time() - t0 < timeout:
    if os.path.exists(path) and sum(1 for line in open(path) if '"train/loss"' in line) >= rows:
      return
    if proc.poll() is not None:
      raise AssertionError(f"the run ended before it was interrupted: {proc.stderr.read()[-2000:]}")
    time.sleep(0.2)
  raise AssertionError("the run logged nothing in time")


@pytest.mark.parametrize("signum,code,name", [(15, 143, "SIGTERM"), (2, 130, "Ctrl-C")])
def test_interrupted_main_prints_the_resume_command(root, tmp_path, signum, code, name):
  import shlex
  wd = tmp_path / "run"
  args = ["jaxlab.main", "--config", f"{TOY_CONFIG}:tiny", "--workdir", str(wd), "--config.train.num_steps=100000",
          "--config.train.log_every=1"]
  p = _start(root, *args)
  _wait_for_rows(wd / "metrics.jsonl", p)
  p.send_signal(signum)
  _, err = p.communicate(timeout=300)
  last = err.strip().splitlines()[-1]
  assert p.returncode == code, err[-2000:]
  assert "Traceback" not in err and last.startswith(f"stopped by {name}") and "checkpoint of step" in last, last
  command = last.split("resume with: ", 1)[1]
  assert shlex.split(command)[:3] == ["python", "-m", "jaxlab.main"] and str(wd) in command
  step = int(last.split("checkpoint of step ", 1)[1].split()[0])
  assert os.path.isdir(wd / "checkpoints" / str(step))


def test_interrupted_reproduce_names_resume(root, tmp_path):
  out = tmp_path / "rep"
  p = _start(root, "jaxlab.reproduce", "tests/fixtures/toy", "--seeds", "0", "--out", str(out),
             "--config.train.num_steps=100000", "--config.train.log_every=1")
  _wait_for_rows(out / "toy" / "tiny" / "seed_0" / "metrics.jsonl", p)
  p.send_signal(15)
  _, err = p.communicate(timeout=300)
  last = err.strip().splitlines()[-1]
  assert p.returncode == 143 and "Traceback" not in err and last.endswith("--resume"), last


def test_help_lists_overrides_variants_and_benchmarks(root):
  r = _cli(root, "jaxlab.main", "--help")
  assert r.returncode == 0 and "--config.KEY=VALUE" in r.stdout and "tiny" in r.stdout and "full" in r.stdout
  r = _cli(root, "jaxlab.sweep", "--help")
  assert r.returncode == 0 and all(opt in r.stdout for opt in ("--dry_run", "--index", "--workdir", "--config"))
  r = _cli(root, "jaxlab.bench", "--help")
  assert r.returncode == 0 and "matmul/" in r.stdout and "selective_scan/" in r.stdout


@pytest.mark.parametrize("args,match", [
    (["--seeds", "abc"], "every seed must be an integer"),
    (["--seeds", "0,,1"], "has an empty entry"),
    (["--out", "FILE/x"], "is a file, so the directory cannot be created there"),
])
def test_reproduce_bad_arguments_are_one_line(root, tmp_path, args, match):
  (tmp_path / "FILE").write_text("")
  args = [a.replace("FILE", str(tmp_path / "FILE")) for a in args]
  r = _cli(root, "jaxlab.reproduce", "tests/fixtures/toy", *args)
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: ") and match in r.stderr
  assert "Traceback" not in r.stderr


def test_main_workdir_that_is_a_file_is_one_line(root, tmp_path):
  (tmp_path / "f").write_text("")
  r = _cli(root, "jaxlab.main", "--config", f"{TOY_CONFIG}:tiny", "--workdir", str(tmp_path / "f"))
  assert r.returncode == 2 and "is a file, not a directory" in r.stderr and "Traceback" not in r.stderr


def test_main_prints_a_short_summary_and_refuses_an_uncreatable_workdir(root, tmp_path):
  """The summary printed is the claims' values and the path of summary.json (not the whole file), and a workdir
  that the file system will not create (/proc) is one line before anything is built."""
  from jaxlab import main as main_lib
  from jaxlab.claims import Claim, minimum
  summary = {"step": 9, "eval/accuracy": 0.9, "train/loss": 0.2, "curve": [1, 2], **{f"x{i}": i for i in range(40)}}
  short = main_lib.short_summary(summary, [Claim("acc", "", minimum("eval/accuracy"), ">=", 0.5)], "W/summary.json")
  assert short == {"summary": "W/summary.json", "step": 9, "eval/accuracy": 0.9,
                   "more": "42 further entries in W/summary.json"}
  if not os.path.isdir("/proc/self"):
    pytest.skip("no /proc here")
  r = _cli(root, "jaxlab.main", "--config", f"{TOY_CONFIG}:tiny", "--workdir", "/proc/jaxlab_x/run")
  assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert r.stderr.startswith("error: --workdir /proc/jaxlab_x/run: a directory cannot be created in /proc")


def test_bench_speed_up_is_over_the_first_impl_unless_a_baseline_is_named(monkeypatch):
  import jax.numpy as jnp
  from jaxlab import bench
  x = jnp.ones((64, 64))
  two = {"reference": (lambda a: a @ a, (x,)), "fast": (lambda a: a + a, (x,))}
  cases = [bench.Benchmark("t/default", lambda: dict(two), flops=1.0, bytes=1.0),
           bench.Benchmark("t/named", lambda: dict(two), flops=1.0, bytes=1.0, baseline="fast"),
           bench.Benchmark("t/single", lambda: {"only": two["fast"]}, flops=1.0, bytes=1.0)]
  monkeypatch.setattr(bench, "discover", lambda: cases)
  rows = {(r["name"], r["impl"]): r["speedup_vs_baseline"] for r in bench.run(["t"], iters=2, peak_tflops=1,
                                                                               peak_gbps=1)}
  assert rows[("t/default", "reference")] == 1.0 and rows[("t/default", "fast")] > 0
  assert rows[("t/named", "fast")] == 1.0 and rows[("t/single", "only")] is None
