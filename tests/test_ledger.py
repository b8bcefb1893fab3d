"""Claims ledgers: the import graph, staleness from content hashes, the README table generated from them."""

import json
import os

import pytest

from jaxlab import ledger, registry, reproduce


def _write(root, rel, text):
  path = os.path.join(root, rel)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


@pytest.fixture()
def repo(tmp_path):
  """A miniature repository: two library modules, a kernel, two experiments."""
  root = str(tmp_path)
  _write(root, "jaxlab/__init__.py", "")
  _write(root, "jaxlab/core.py", "from jaxlab.kernels.op import ops\n")
  _write(root, "jaxlab/extra.py", "import numpy\n")
  _write(root, "jaxlab/pkg/__init__.py", "")
  _write(root, "jaxlab/pkg/deep.py", "X = 1\n")
  _write(root, "kernels/__init__.py", "")
  _write(root, "kernels/op/__init__.py", "")
  _write(root, "kernels/op/ops.py", "from . import ref\n")
  _write(root, "kernels/op/ref.py", "")
  _write(root, "experiments/__init__.py", "")
  _write(root, "experiments/a/__init__.py", "")
  _write(root, "experiments/a/config.py", "from jaxlab import core\n")
  _write(root, "experiments/a/train.py", "def f():\n  from jaxlab.pkg import deep\n  from . import config\n")
  _write(root, "experiments/b/__init__.py", "")
  _write(root, "experiments/b/config.py", "import jaxlab.extra\n")
  return root


def test_import_closure_follows_every_import_into_the_repository(repo):
  got = ledger.import_closure("a", repo)
  assert got == sorted(["experiments/__init__.py", "experiments/a/__init__.py", "experiments/a/config.py",
                        "experiments/a/train.py", "jaxlab/__init__.py", "jaxlab/core.py", "jaxlab/pkg/__init__.py",
                        "jaxlab/pkg/deep.py", "kernels/__init__.py", "kernels/op/__init__.py", "kernels/op/ops.py",
                        "kernels/op/ref.py"])
  assert "jaxlab/extra.py" in ledger.import_closure("b", repo) and "jaxlab/core.py" not in ledger.import_closure("b", repo)


def test_stale_names_the_changed_sources(repo):
  for paper in ("a", "b"):
    led = {"paper": paper, "claims": [], "sources": ledger.digests(ledger.import_closure(paper, repo), repo)}
    with open(ledger.ledger_path(paper, repo), "w") as f:
      json.dump(led, f)
  assert ledger.stale(["a", "b"], repo) == {}
  _write(repo, "kernels/op/ref.py", "Y = 2\n")                      # used by a only, through the import graph
  assert ledger.stale(["a", "b"], repo) == {"a": ["kernels/op/ref.py"]}
  _write(repo, "jaxlab/new.py", "")
  _write(repo, "experiments/b/config.py", "import jaxlab.extra\nimport jaxlab.new\n")
  assert ledger.stale(["b"], repo) == {"b": ["experiments/b/config.py", "jaxlab/new.py"]}
  os.remove(ledger.ledger_path("a", repo))
  assert ledger.stale(["a"], repo) == {"a": ["experiments/a/claims.json (missing)"]}


def test_comments_and_docstrings_do_not_make_a_ledger_stale(repo):
  _write(repo, "kernels/op/ref.py", "def f(x):\n  return x + 1\n")
  led = {"paper": "a", "claims": [], "sources": ledger.digests(ledger.import_closure("a", repo), repo)}
  with open(ledger.ledger_path("a", repo), "w") as f:
    json.dump(led, f)
  _write(repo, "kernels/op/ref.py", '"""Cites a paper."""\n\n\ndef f(x):  # one more\n  """Adds one."""\n  return x + 1\n')
  assert ledger.stale(["a"], repo) == {}
  _write(repo, "kernels/op/ref.py", "def f(x):\n  return x + 2\n")
  assert ledger.stale(["a"], repo) == {"a": ["kernels/op/ref.py"]}


def test_a_row_shows_measured_values_and_status():
  led = {"claims": [{"name": "acc", "measured": 0.9675, "passed": True}, {"name": "gain", "measured": 0.0079,
                                                                          "passed": False}]}
  row = ledger.row("x", {"experiment": "`x`", "claim": "c", "note": "see README"}, led)
  assert row == "| `x` | c | acc 0.9675; gain **0.0079** | FAIL (1/2): see README |"


def test_every_experiment_has_a_results_row_and_a_ledger(root):
  for name in registry.names():
    exp = registry.load(name)
    meta = getattr(exp.config_module, "RESULTS", None)
    assert meta and {"experiment", "claim"} <= set(meta), f"{name}/config.py has no RESULTS row metadata"
    led = ledger.read(name)
    assert led is not None, f"experiments/{name}/claims.json is missing: run python -m jaxlab.reproduce {name}"
    assert [c["name"] for c in led["claims"]] == [c.name for c in exp.claims], \
        f"experiments/{name}/claims.json does not hold the config's claims: rerun python -m jaxlab.reproduce {name}"
    for key in ("commit", "versions", "machine", "sources", "seeds", "wall_s"):
      assert key in led, f"experiments/{name}/claims.json has no {key!r}"


def test_readme_results_table_is_the_one_the_ledgers_give(root):
  with open(os.path.join(root, "README.md")) as f:
    readme = f.read()
  block = ledger.readme_table(readme)
  assert block is not None, "README.md has no generated results table (markers missing)"
  assert block == reproduce.results_table(), \
      "README.md's results table differs from the ledgers: paste the output of python -m jaxlab.reproduce --table"


def test_a_claim_that_needs_an_accelerator_shows_the_accelerator_ledger(repo, monkeypatch):
  """A CPU ledger records it unchecked; a GPU run writes claims.accelerator.json; the row shows that value, its
  machine and commit, and counts the claim neither as a pass nor as a failure."""
  results = {"variant": "tiny", "seeds": [0], "wall_s": 1.0,
             "claims": [{"name": "acc", "text": "t", "measured": 0.97, "target": ">= 0.9", "passed": True},
                        {"name": "speed", "text": "s", "measured": 2.4, "target": ">= 2.5", "passed": None,
                         "requires": "accelerator", "status": "not checked here: needs an accelerator"}]}
  meta = {"experiment": "`a`", "claim": "c"}
  prov = {"commit": "0123456789abcdef", "dirty": False, "versions": {}, "date": "2026-12-04T10:00:00Z",
          "machine": {"cpu": "x", "threads": 2, "backend": "cpu", "devices": 1}}
  monkeypatch.setattr(ledger, "provenance", lambda *a, **k: prov)
  path = ledger.write("a", results, repo)
  assert path.endswith("experiments/a/claims.json")
  row = ledger.row("a", meta, ledger.read("a", repo), repo)
  assert "speed not checked here (needs an accelerator; no accelerator ledger yet)" in row
  assert row.endswith("| PASS (1/1; 1 needs an accelerator) |")
  gpu = dict(prov, machine={"cpu": "x", "threads": 16, "backend": "gpu", "devices": 1, "device": "NVIDIA H200"},
             commit="fedcba9876543210", date="2026-12-05T10:00:00Z")
  monkeypatch.setattr(ledger, "provenance", lambda *a, **k: gpu)
  on_gpu = dict(results, claims=[results["claims"][0], dict(results["claims"][1], measured=4.4, passed=True)])
  on_gpu["claims"][1].pop("status")
  path = ledger.write("a", on_gpu, repo)
  assert path.endswith("experiments/a/claims.accelerator.json")
  assert ledger.read("a", repo)["claims"][1]["passed"] is None          # the CPU ledger is left as it was
  row = ledger.row("a", meta, ledger.read("a", repo), repo)
  assert ("speed not checked here (needs an accelerator; last accelerator ledger: 4.4 (PASS) on NVIDIA H200, "
          "2026-12-05, commit fedcba9)") in row
  assert "PASS" in row and "FAIL" not in row


def test_the_printed_table_says_not_checked_here():
  res = [{"paper": "a", "wall_s": 3.0, "claims": [
      {"name": "speed", "measured": 2.4, "target": ">= 2.5", "passed": None, "requires": "accelerator",
       "accelerator": None}]}]
  out = reproduce.format_table(res)
  assert "not checked here" in out and "a/speed: needs an accelerator; no accelerator ledger yet" in out
