"""A new user's own data, following the experiments' READMEs literally (their commands, on files this test
makes): NAVAR on a CSV with a truth file, PETS on an answer-pool JSONL, SLOT-Align on a feature file. Slow: each
is a full command-line run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow


def _main(*args):
  env = {**os.environ, "JAXLAB_PROGRESS": "0", "JAXLAB_LOGLEVEL": "WARNING"}
  r = subprocess.run([sys.executable, "-m", "jaxlab.main", *args], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=1800, check=False)
  assert r.returncode == 0, r.stderr[-3000:]
  short = json.loads(r.stdout)
  return short, json.load(open(short["summary"]))


def test_navar_on_a_csv_with_a_truth_file(tmp_path):
  """experiments/navar_ice/README.md, "your data": one CSV and a DREAM3-style truth file; a planted edge a -> b."""
  rng = np.random.default_rng(0)
  n = 400
  a, b, c = (np.zeros(n) for _ in range(3))
  for t in range(1, n):
    a[t] = 0.5 * a[t - 1] + rng.normal()
    b[t] = 0.4 * b[t - 1] + np.tanh(2 * a[t - 1]) + 0.3 * rng.normal()
    c[t] = 0.5 * c[t - 1] + rng.normal()
  (tmp_path / "mine.csv").write_text("a,b,c\n" + "".join(f"{x:.5f},{y:.5f},{z:.5f}\n" for x, y, z in zip(a, b, c)))
  (tmp_path / "gt.txt").write_text("a\tb\t1\nb\ta\t0\na\tc\t0\n")
  short, s = _main("--config", "experiments/navar_ice/config.py:variant=full,data=csv", "--workdir",
                   str(tmp_path / "run"), f"--config.data.path={tmp_path / 'mine.csv'}",
                   f"--config.data.truth_path={tmp_path / 'gt.txt'}")
  assert s["auroc"] > 0.9 and s["eval/val_r2"] > 0.1
  top = s["edges"][0]
  assert (top["source"], top["target"]) == ("a", "b") and top["null_in_band"] is False
  assert os.path.exists(tmp_path / "run" / "response_functions.png")


def test_pets_on_an_answer_pool_file(tmp_path):
  """experiments/pets/README.md, "your own pools": 80 questions with 64 answers each."""
  rng = np.random.default_rng(0)
  lines = []
  for q in range(80):
    p = rng.dirichlet(np.full(4, 0.5))
    answers = rng.choice(list("ABCD"), size=64, p=p).tolist()
    lines.append({"id": f"q{q}", "answers": answers, "answer": "ABCD"[int(np.argmax(p))],
                  "trace_confidence": [{"mean_confidence": float(x)} for x in rng.uniform(5, 20, 64)]})
  (tmp_path / "my_pools.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
  short, s = _main("--config", "experiments/pets/config.py:tiny", "--workdir", str(tmp_path / "run"),
                   f"--config.data.pool_file={tmp_path / 'my_pools.jsonl'}", "--config.data.choices=A,B,C,D",
                   "--config.method.budgets=(4,8,16,32)")
  assert s["num_questions"] == 80 and 0 <= s["sc_rate/offline/B32"] <= 1 and "acc/offline/B32" in s


def test_slot_align_on_a_feature_file(tmp_path):
  """experiments/slot_align/README.md, "Full scale": an Office-Home-named feature file (`<domain>_x`, `_y`)."""
  from jaxlab import registry
  domains, classes = registry.load("slot_align").config_module.DATASETS["office_home"]
  rng = np.random.default_rng(0)
  centres = rng.normal(size=(classes, 16)) * 3
  arrays = {}
  for k, dom in enumerate(domains):
    y = rng.integers(0, classes, 400)
    arrays[f"{dom}_x"] = (centres[y] + rng.normal(size=(400, 16)) + k).astype(np.float32)
    arrays[f"{dom}_y"] = y
  np.savez(tmp_path / "features.npz", **arrays)
  short, s = _main("--config", "experiments/slot_align/config.py:full", "--workdir", str(tmp_path / "run"),
                   f"--config.data.path={tmp_path / 'features.npz'}")
  accs = [v for k, v in s.items() if k.startswith("acc/") and isinstance(v, float)]
  assert len(accs) == 15 and all(0 <= v <= 1 for v in accs)          # alpha in {0, 0.1, 0.5} x 5 taus
