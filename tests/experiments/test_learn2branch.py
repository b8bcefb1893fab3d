"""Learned-branching experiment: end to end on small set-cover instances (collection in workers, GCNN training,
acc@k, the policy inside SCIP), resume with the collection and baseline caches, config errors; behind the slow
marker: sharded == single device."""

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("pyscipopt", reason="pyscipopt is not installed: pip install 'jaxlab[milp]'")

import jax  # noqa: E402
from experiment_checks import _run, _strip, canary_covered, check_end_to_end  # noqa: E402
from jaxlab import mesh as mesh_lib  # noqa: E402
from jaxlab import registry  # noqa: E402
from jaxlab.errors import ConfigError  # noqa: E402

NAME = "learn2branch"
# Timings depend on the machine's load: everything else in a resumed run is bit-identical.
TIMES = ("solve/gcnn/time_sgm", "solve/gcnn/policy_ms_per_node")


def short(tmp_path, **extra):
  """Set cover 100 x 200, 14 / 4 / 6 instances, 20 steps of 8 nodes, 3 held-out solves."""
  return {"data.sizes": {"n_rows": 100, "n_cols": 200, "density": 0.05}, "data.train_instances": 14,
          "data.valid_instances": 4, "data.test_instances": 6, "data.p_expert": 0.5, "data.max_samples": 6,
          "data.cache_dir": str(tmp_path / "cache"), "model.emb": 16, "model.prenorm_batches": 2,
          "train.num_steps": 20, "train.checkpoint_every": 10, "train.log_every": 10, "solve.instances": 3,
          "solve.rules": ("random", "mostinf"), **extra}


def _same(a, b):
  a, b = _strip(a), _strip(b)
  for k in TIMES:
    a.pop(k, None)
    b.pop(k, None)
  assert a == b


@canary_covered
def test_end_to_end_and_resume(tmp_path):
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, short(tmp_path))
  assert s["stages"] == ["collect", "train", "evaluate", "solve"]
  assert s["collect/jax_in_workers"] is False and s["collect/train/samples"] >= 8
  assert s["collect/samples_per_s_per_core"] > 0
  for arm in ("gcnn", "mostfrac", "random"):
    for k in (1, 5, 10):
      assert 0 <= s[f"{arm}/acc{k}"] <= 1
      assert len(s[f"{arm}/acc{k}/depth"]) == 11
    assert s[f"{arm}/acc1"] <= s[f"{arm}/acc5"] <= s[f"{arm}/acc10"]
  assert sum(s["test/depth_counts"]) == s["test/samples"] == s["collect/test/samples"]
  for r in ("gcnn", "random", "mostinf"):
    assert len(s[f"solve/{r}/nodes"]) == 3 and s[f"solve/{r}/solved"] == 1.0
  lr = np.log((np.array(s["solve/random/nodes"]) + 1) / (np.array(s["solve/gcnn/nodes"]) + 1))
  np.testing.assert_allclose(s["solve/log_ratio/random"], lr)
  cache = tmp_path / "cache" / "milp"
  (data,) = os.listdir(cache)
  assert sorted(os.listdir(cache / data)) == ["solves", "test", "train", "valid"]
  # A second seed reuses the collected samples and the baseline solves (no new worker, no new solve file).
  files = {p: os.path.getmtime(os.path.join(r, p)) for r, _, fs in os.walk(cache) for p in fs}
  s1 = _run(NAME, tmp_path / "seed1", short(tmp_path, seed=1))
  assert {p: os.path.getmtime(os.path.join(r, p)) for r, _, fs in os.walk(cache) for p in fs} == files
  assert s1["solve/random/nodes"] == s["solve/random/nodes"] and s1["collect/test/samples"] == s["collect/test/samples"]
  # Resume: drop the last stage's checkpoint and the summary; the rerun redoes the solve stage only.
  ckpt = wd / "checkpoints"
  last = max(int(p) for p in os.listdir(ckpt) if p.isdigit())
  shutil.rmtree(ckpt / str(last))
  os.remove(wd / "summary.json")
  _same(_run(NAME, wd, short(tmp_path)), s)
  # An interrupted training stage resumes from its own step checkpoints (20 steps, one every 10).
  wd2 = tmp_path / "run2"
  ref = _run(NAME, wd2, short(tmp_path))
  inner = wd2 / "stages" / "train" / "checkpoints"
  steps = sorted(int(p) for p in os.listdir(inner) if p.isdigit())
  assert steps[-2:] == [10, 20], steps             # the train stage keeps its own step checkpoints
  ck = wd2 / "checkpoints"
  for step in sorted(int(p) for p in os.listdir(ck) if p.isdigit())[1:]:
    shutil.rmtree(ck / str(step))                  # keep only the collect stage's checkpoint
  shutil.rmtree(inner / "20")                      # and training killed between steps 10 and 20
  os.remove(wd2 / "stages" / "train" / "summary.json")
  os.remove(wd2 / "summary.json")
  _same(_run(NAME, wd2, short(tmp_path)), ref)


def test_heuristic_accuracy_against_brute_force():
  from math import comb
  from jaxlab.milp import imitation
  from jaxlab.milp.scip_env import COL_FEATURES
  rng = np.random.default_rng(0)
  samples = []
  for _ in range(20):
    k = int(rng.integers(2, 12))
    cf = np.zeros((15, len(COL_FEATURES)), np.float32)
    cands = rng.choice(15, k, replace=False).astype(np.int32)
    cf[cands, COL_FEATURES.index("sol_frac")] = rng.uniform(0.01, 0.99, k)
    scores = rng.integers(0, 3, k).astype(np.float32)        # many ties
    samples.append({"col_feats": cf, "cands": cands, "scores": scores})
  got = imitation.heuristic_accuracy(samples, (1, 3))
  for i, s in enumerate(samples):
    best = s["scores"] == s["scores"].max()
    frac = s["col_feats"][s["cands"], COL_FEATURES.index("sol_frac")]
    order = sorted(range(len(frac)), key=lambda j: -min(frac[j], 1 - frac[j]))
    for k in (1, 3):
      assert got[f"mostfrac/acc{k}"][i] == float(any(best[j] for j in order[:k]))
      n, t = len(best), int(best.sum())       # random: P(a random k-subset holds a best one), by enumeration
      from itertools import combinations
      subsets = list(combinations(range(n), min(k, n)))
      assert got[f"random/acc{k}"][i] == pytest.approx(np.mean([any(best[j] for j in c) for c in subsets]))
      assert got[f"random/acc{k}"][i] == pytest.approx(1 - comb(n - t, min(k, n)) / comb(n, min(k, n)))


@pytest.mark.parametrize("override,match", [
    ({"data.generator": "tsp"}, "config.data.generator='tsp'"),
    ({"data.p_expert": 0.0}, "p_expert=0.0 must be in"),
    ({"scip.cuts": "some"}, "config.scip.cuts='some'"),
    ({"solve.rules": ("random", "gurobi")}, "config.solve.rules has \\['gurobi'\\]"),
    ({"solve.instances": 1}, "must be >= 2"),
    ({"eval.ks": (5, 10)}, "must be positive and include 1"),
])
def test_bad_config_is_a_clear_error(override, match):
  with pytest.raises(ConfigError, match=match):
    registry.load(NAME).get_config("tiny", override)


def test_too_few_samples_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match="training samples < batch size 8"):
    _run(NAME, tmp_path / "run", short(tmp_path, **{"data.train_instances": 1, "data.max_samples": 1}))


def _one_gradient(config):
  """The train stage's first gradient and loss under the config's mesh (from the same seed: the same state)."""
  train = registry.load(NAME).train_module
  with mesh_lib.use_config(config) as mesh:
    t = train.setup_training(config, mesh)

    @jax.jit
    def grad(params, model_state, batch):
      def objective(p):
        model = t.modeldef.merge(p, model_state)
        model.train()
        return t.loss_fn(model, batch, None)[0]
      return jax.value_and_grad(objective)(params)

    return jax.device_get(grad(t.state.params, t.state.model_state, jax.device_put(t.batches(0), t.batch_sharding)))


@pytest.mark.slow
def test_sharded_equals_single(tmp_path):
  """A 4x2 (data, model) mesh computes the same GCNN training as one device.

  1. One gradient from the same state: each parameter's gradient agrees to 1e-5 of its norm.
  2. The whole run (train stage metrics, test accuracies) at 1e-5, with Adam's eps raised to 1e-6. Why: a head
     unit that is active on every candidate of a sample shifts all that sample's logits equally, which the
     softmax ignores, so its bias has an analytically zero gradient; float rounding leaves ~1e-9 there, different
     for each reduction order, and Adam with eps 1e-8 turns that into steps of order lr (measured: head1's bias
     differs by 2e-4 between the meshes after two steps, the grad norm by 2e-4 after ten). With eps 1e-6 such a
     step is ~1e-3 lr and the runs agree to ~2e-7. (The solve stage's times are wall-clock: not compared.)
  """
  from jaxlab import metrics  # pylint: disable=g-import-not-at-top
  meshes = (("sharded", (("data", 4), ("model", 2))), ("single", (("data", 1), ("model", 1))))
  runs = {}
  for label, mesh in meshes:
    runs[label] = _run(NAME, tmp_path / label, short(tmp_path, mesh=mesh, **{"train.optimizer.eps": 1e-6}))
    runs[label + "/rows"] = metrics.read_metrics(str(tmp_path / label / "stages" / "train"))
  a, b = runs["sharded/rows"], runs["single/rows"]
  assert len(a) == len(b) > 0
  for x, y in zip(a, b):
    keys = [k for k in x if k.startswith("train/") and k != "train/steps_per_sec"]
    np.testing.assert_allclose([x[k] for k in keys], [y[k] for k in keys], rtol=1e-5, atol=1e-6)
  for k in ("gcnn/acc1", "gcnn/acc5", "valid/acc1"):
    assert runs["sharded"][k] == pytest.approx(runs["single"][k], abs=1e-6), k
  # The default optimizer: the first gradient (the collection is cached by the runs above).
  (la, ga), (lb, gb) = (_one_gradient(registry.load(NAME).get_config("tiny", short(tmp_path, mesh=m)))
                        for _, m in meshes)
  assert la == pytest.approx(lb, rel=1e-6)
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(ga)[0], jax.tree.leaves(gb)):
    assert np.linalg.norm(x - y) <= 1e-5 * np.linalg.norm(y) + 1e-9, jax.tree_util.keystr(path)
