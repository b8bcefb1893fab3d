"""Reproduce as a user runs it: from a checkout it leaves the checkout as it was (the ledger is written only with
the maintainers' `--ledger`), and from a regular (non-editable) install it runs, prints its table and reads the
ledgers shipped as package data."""

import os
import subprocess
import sys

import pytest

from jaxlab import ledger, registry, reproduce
from jaxlab.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fake_quickstart(monkeypatch):
  """quickstart's training replaced by a made-up summary (the decision tested here is reproduce's, not the run's)."""
  train = registry.load("quickstart").train_module

  def fake(config, workdir):
    os.makedirs(workdir, exist_ok=True)
    return {"eval/accuracy": 0.95 + 0.001 * config.seed, "train/loss": 0.1, "step": 1}
  monkeypatch.setattr(train, "train_and_evaluate", fake)
  written = []
  monkeypatch.setattr(ledger, "write", lambda paper, results, root=ledger.ROOT: written.append(paper) or "x")
  return written


def test_the_declared_run_writes_no_ledger_unless_asked(monkeypatch, tmp_path):
  written = _fake_quickstart(monkeypatch)
  assert reproduce.main(["quickstart", "--out", str(tmp_path / "a")]) == 0
  assert written == []
  assert reproduce.main(["quickstart", "--out", str(tmp_path / "b"), "--ledger"]) == 0
  assert written == ["quickstart"]


@pytest.mark.parametrize("args", [["--seeds", "0"], ["--variant", "small"], ["--config.train.num_steps=5"],
                                  ["tests/fixtures/toy"]])
def test_ledger_for_another_run_is_refused_before_any_work(monkeypatch, tmp_path, args):
  written = _fake_quickstart(monkeypatch)
  paper = [] if args[0].startswith("tests/") else ["quickstart"]
  with pytest.raises(ConfigError, match="--ledger records the declared claim run only"):
    reproduce.main([*paper, *args, "--out", str(tmp_path / "out"), "--ledger"])
  assert written == [] and not os.path.exists(tmp_path / "out")


def _install(tmp_path):
  """jaxlab installed non-editably (a built wheel's files, no dependencies) into a folder of its own."""
  target = tmp_path / "site"
  r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                      "--target", str(target), ROOT], capture_output=True, text=True, timeout=600, check=False)
  if r.returncode:
    pytest.skip(f"cannot build and install jaxlab here: {r.stderr.strip()[-300:]}")
  return target


def _installed(target, *args, cwd):
  env = {**os.environ, "PYTHONPATH": str(target), "JAXLAB_PROGRESS": "0"}
  return subprocess.run([sys.executable, "-m", "jaxlab.reproduce", *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("install")
  return _install(tmp), tmp


def test_an_installed_copy_reads_its_ledgers_and_needs_a_checkout_for_stale(installed):
  target, tmp = installed
  r = _installed(target, "--table", cwd=tmp)
  assert r.returncode == 0 and "| `quickstart`" in r.stdout, r.stderr[-2000:]
  assert r.stdout.count("\n| `") >= len(registry.names()) - 1
  for flag in ("--stale", "--verify"):
    r = _installed(target, flag, cwd=tmp)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr[-2000:]
    assert r.stderr.startswith(f"error: {flag} needs a source checkout of jaxlab"), r.stderr
  r = _installed(target, "quickstart", "--ledger", cwd=tmp)
  assert r.returncode == 2 and "error: --ledger needs a source checkout" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_quickstart_from_an_installed_copy(installed):
  """The README's Colab route: the declared claim run of quickstart from a regular install prints its PASS table."""
  target, tmp = installed
  r = _installed(target, "quickstart", "--out", str(tmp / "results"), cwd=tmp)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "test_acc" in r.stdout and "PASS" in r.stdout and "all claims passed" in r.stdout
