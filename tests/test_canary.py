"""Canaries and `reproduce --verify` (jaxlab.canary), against the real tree.

* Every experiment declares a canary that passes through every kind of stage its claim run has.
* The fingerprint leaves timings out and names the first output that differs.
* On a temporary `git worktree` of HEAD: moving a helper between modules (callers updated) re-stamps every
  ledger that imports it; multiplying a constant of a shared numeric function by 1 + 1e-6 is a difference for
  the experiment whose canary executes it, and for none of those that only import it.
"""

import json
import os
import subprocess

import pytest

from jaxlab import canary, ledger, registry

NAMES = registry.names()


def _staged(name):
  with open(os.path.join(ledger.ROOT, "experiments", name, "train.py")) as f:
    return "run_stages" in f.read()


@pytest.mark.parametrize("name", [n for n in NAMES if _staged(n)])
def test_canary_covers_every_kind_of_stage_of_the_claim_run(name, tmp_path):
  claim = canary.planned_stages(name)
  shrunk = canary.planned_stages(name, canary.spec(name)["overrides"], str(tmp_path))
  assert claim, f"{name}: no stages found in its claim run"
  assert not canary.skipped_stages(claim, shrunk), (
      f"{name}: CANARY skips {canary.skipped_stages(claim, shrunk)} of the claim run's stages {claim}")


def test_every_experiment_declares_a_canary():
  for name in NAMES:
    s = canary.spec(name)
    assert s["overrides"] and s["seed"] == tuple(getattr(registry.load(name).config_module, "SEEDS", (0,)))[0]


def test_a_canary_without_a_stage_of_the_claim_run_is_caught(tmp_path):
  overrides = {**canary.spec("navar_ice")["overrides"], "eval.plots": False}    # leaves out the plots stage
  skipped = canary.skipped_stages(canary.planned_stages("navar_ice"),
                                  canary.planned_stages("navar_ice", overrides, str(tmp_path)))
  assert skipped == ["plots"]
  assert canary.stage_kind("kde/D32_k3_M3@128") == canary.stage_kind("kde/D8_k2_M2@32") == "kde/D#_k#_M#@#"


def test_fingerprint_leaves_timings_out_and_names_the_first_difference(tmp_path):
  import numpy as np

  def write(folder, loss, wall):
    os.makedirs(os.path.join(folder, "stages"), exist_ok=True)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": 1, "train/loss": 1.0, "train/steps_per_sec": wall}) + "\n")
      f.write(json.dumps({"step": 2, "train/loss": loss, "solve/gcnn/time_sgm": wall}) + "\n")
    with open(os.path.join(folder, "summary.json"), "w") as f:
      json.dump({"train/loss": loss, "wall_s": wall, "speed/tokens": wall}, f)
    np.savez(os.path.join(folder, "stages", "0_a.npz"), x=np.arange(3.0))
    with open(os.path.join(folder, "plot.png"), "wb") as f:
      f.write(os.urandom(8))

  write(tmp_path / "a", 0.5, 1.0)
  write(tmp_path / "b", 0.5, 2.0)            # other timings and plot bytes only
  write(tmp_path / "c", 0.5 + 2 ** -40, 1.0)  # one float, one ulp-scale change
  a, b, c = (canary.manifest(str(tmp_path / x)) for x in "abc")
  assert canary.fingerprint(a) == canary.fingerprint(b) and canary.first_difference(a, b) is None
  assert canary.fingerprint(a) != canary.fingerprint(c)
  assert canary.first_difference(a, c).startswith("metrics.jsonl, row 2, step 2, train/loss: ")


@pytest.mark.parametrize("args,match", [(["--verify", "nosuchpaper"], "unknown experiment 'nosuchpaper'"),
                                        (["--verify", "--jobs", "0", "quickstart"], "--jobs=0")])
def test_verify_refuses_bad_input_in_one_line_before_any_work(args, match, tmp_path):
  import sys
  r = subprocess.run([sys.executable, "-m", "jaxlab.reproduce", *args, "--out", str(tmp_path / "v")],
                     capture_output=True, text=True, timeout=120, check=False)
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: ") and match in r.stderr
  assert not os.path.exists(tmp_path / "v")


# ------------------------------------------------------------------------------------ the mechanism, end to end

# A helper of jaxlab.dynamics moved to jaxlab.nn.attention_only (both imported by focus_dilution only, whose
# canary is among the quickest), and tabular Q-learning's step size: robust_q's canary runs it; taskloom and
# taskloom_agent import jaxlab.rl, whose package imports the tabular code, and never run it.
MOVED = ("jaxlab/dynamics/instrument.py", "jaxlab/nn/attention_only.py", "def top_share(")
CALLER = ("experiments/focus_dilution/method.py", "instrument.top_share(", "ao.top_share(")
MOVER = "focus_dilution"
Q = "jaxlab/rl/tabular/q_learning.py"
RESCALED = "    return 1.0 / (1.0 + (1.0 - gamma) * k)\n"
USERS = ("robust_q", "taskloom", "taskloom_agent")


@pytest.fixture(scope="module")
def head_tree(tmp_path_factory):
  """A `git worktree` of HEAD (its ledgers are current: CI checks it), removed afterwards."""
  path = str(tmp_path_factory.mktemp("tree") / "repo")
  r = subprocess.run(["git", "worktree", "add", "--detach", path, "HEAD"], cwd=ledger.ROOT, capture_output=True,
                     text=True, check=False)
  if r.returncode != 0:
    pytest.skip(f"no git worktree of HEAD: {r.stderr.strip()}")
  if ledger.stale(NAMES, path):
    subprocess.run(["git", "worktree", "remove", "--force", path], cwd=ledger.ROOT, check=False)
    pytest.skip("HEAD has stale ledgers (commit a verified tree first)")
  yield path
  subprocess.run(["git", "worktree", "remove", "--force", path], cwd=ledger.ROOT, capture_output=True, check=False)


def _edit(root, rel, old, new):
  path = os.path.join(root, rel)
  with open(path) as f:
    text = f.read()
  assert old in text, f"{rel} no longer has {old!r}: update this test to the code"
  with open(path, "w") as f:
    f.write(text.replace(old, new))
  return text


def _reset(root):
  subprocess.run(["git", "checkout", "--", "."], cwd=root, check=True, capture_output=True)


def test_a_move_between_modules_restamps_every_ledger_that_imports_it(head_tree, tmp_path):
  _reset(head_tree)
  src, dst, definition = MOVED
  with open(os.path.join(head_tree, src)) as f:
    text = f.read()
  start = text.index("\n\n" + definition)
  end = text.find("\n\n\n", start + 2)
  helper = text[start:end if end >= 0 else len(text)].rstrip("\n")
  _edit(head_tree, src, helper, "")
  with open(os.path.join(head_tree, dst), "a") as f:
    f.write(helper + "\n")
  _edit(head_tree, *CALLER)
  affected = sorted(ledger.stale(NAMES, head_tree))
  assert affected == [MOVER]
  assert canary.verify(affected, str(tmp_path), root=head_tree) == {MOVER: "verified"}
  assert not ledger.stale(NAMES, head_tree)
  rec = ledger.read(MOVER, head_tree)["verified"][-1]
  assert rec["from"] == rec["to"] and rec["dirty"] and len(rec["canary"]) == 64
  _reset(head_tree)


@pytest.mark.slow
def test_one_float_in_a_shared_function_differs_where_it_runs_only(head_tree, tmp_path):
  _reset(head_tree)
  _edit(head_tree, Q, RESCALED, RESCALED.replace("1.0 /", "(1.0 + 1e-6) /"))
  assert sorted(ledger.stale(NAMES, head_tree)) == sorted(USERS)
  got = canary.verify(list(USERS), str(tmp_path), root=head_tree)
  assert got["robust_q"].startswith("differs: "), got
  assert got["taskloom"] == got["taskloom_agent"] == "verified", got
  assert sorted(ledger.stale(NAMES, head_tree)) == ["robust_q"]
  _reset(head_tree)
