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
  r = _cli(root, "jaxlab.main", "--config", f"{TOY_CONFIG}:tiny", "--workdir", str(wd), "--config.num_steps=10",
           "--config.optimizer.learning_rate", "0.02")
  assert r.returncode == 0, r.stderr[-2000:]
  summary = json.loads(r.stdout)
  assert summary["step"] == 10 and "eval/accuracy" in summary
  assert json.load(open(wd / "config.json"))["optimizer"]["learning_rate"] == 0.02
  assert os.path.isdir(wd / "checkpoints" / "10")
  r = _cli(root, "jaxlab.main", "--config", f"{TOY_CONFIG}:tiny", "--workdir", str(wd), "--config.num_steps=15",
           "--config.optimizer.learning_rate=0.02")
  assert r.returncode == 0 and json.loads(r.stdout)["step"] == 15
  steps = [json.loads(line)["step"] for line in open(wd / "metrics.jsonl") if "train/loss" in line]
  assert steps == [5, 10, 15]


@pytest.mark.parametrize("args,match", [
    (["--config.optimizer.learnig_rate=0.1"], "did you mean 'learning_rate'"),
    (["--config.batch_size=12"], "batch_size=12 is not divisible by the 8-way data split"),
    (["--config.num_steps=many"], "expects int"),
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
           "--config.num_steps=1", "--config.optimizer.learning_rate=1e-6")
  assert r.returncode == 1 and "FAIL" in r.stdout


def test_reproduce_list(root):
  r = _cli(root, "jaxlab.reproduce", "--list")
  names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
  assert r.returncode == 0 and "quickstart" in names and names == sorted(names)


def test_sweep_dry_run_and_index(root, tmp_path):
  r = _cli(root, "jaxlab.sweep", "--config", f"{TOY_CONFIG}:tiny", "--dry_run")
  assert r.returncode == 0 and "2 points" in r.stdout and "optimizer.learning_rate=0.03" in r.stdout
  r = _cli(root, "jaxlab.sweep", "--config", f"{TOY_CONFIG}:tiny", "--workdir", str(tmp_path), "--index", "1",
           "--config.num_steps=5")
  assert r.returncode == 0, r.stderr[-2000:]
  assert json.load(open(tmp_path / "1" / "config.json"))["optimizer"]["learning_rate"] == 0.03
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
