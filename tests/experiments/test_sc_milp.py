"""SC-MILP experiment: end to end on small set-cover instances (collection of training, all-upstream test and
derived-instance samples; six arms from one initialisation; per-node hits; the plain and SC policies inside SCIP),
resume, the claim statistics against a brute-force computation, config errors."""

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("pyscipopt", reason="pyscipopt is not installed: pip install 'jaxlab[milp]'")

from experiment_checks import _run, _strip, canary_covered, check_end_to_end  # noqa: E402
from jaxlab import registry  # noqa: E402
from jaxlab.errors import ConfigError  # noqa: E402

NAME = "sc_milp"
TIMES = ("solve/plain/time_sgm", "solve/sc/time_sgm")


def short(tmp_path, **extra):
  """Set cover 100 x 200, 24 training and 6 test instances, 20 steps of 8 nodes, 2 held-out solves."""
  return {"data.sizes": {"n_rows": 100, "n_cols": 200, "density": 0.05}, "data.train_instances": 24,
          "data.test_instances": 6, "data.p_expert": 0.5, "data.max_samples": 6, "data.small_share": 0.5,
          "data.cache_dir": str(tmp_path / "cache"), "model.emb": 16, "model.prenorm_batches": 2,
          "train.num_steps": 20, "train.checkpoint_every": 10, "train.log_every": 10, "solve.instances": 2,
          **extra}


def _same(a, b):
  a, b = _strip(a), _strip(b)
  for k in TIMES:
    a.pop(k, None)
    b.pop(k, None)
  assert a == b


@canary_covered
def test_end_to_end_and_resume(tmp_path):
  cfg = registry.load(NAME).config_module
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, short(tmp_path))
  arms = tuple(cfg.ARMS)
  assert s["stages"] == ["collect", "strata"] + [f"train/{a}" for a in arms] + ["evaluate", "solve"]
  assert s["collect/jax_in_workers"] is False
  # Every test node of depth <= 2 is recorded: the depth histogram has no gap above the root.
  assert s["collect/test/upstream"] == s["test/upstream"] > 0
  # The derived instances give only upstream nodes.
  assert s["collect/aug/upstream"] == s["collect/aug/samples"] > 0
  assert s["strata/k_final"] >= 2 and sum(s["strata/counts"]) == s["collect/train/samples"] + s["collect/aug/samples"]
  assert np.all(np.diff(s["strata/depth_means"]) >= 0)          # stratum 0 is the shallowest
  # Training sets: the augmented arms add the derived nodes; the small arms use half the instances.
  assert s["train/sc/samples"] == s["train/plain/samples"] + s["collect/aug/samples"]
  assert s["train/no_aug/samples"] == s["train/plain/samples"]
  assert s["train/plain_small/samples"] < s["train/plain/samples"]
  for a in arms:
    hits = np.array(s[f"{a}/hits1"])
    assert len(hits) == s["test/samples"] and set(hits.tolist()) <= {0, 1}
    assert s[f"{a}/acc1"] == pytest.approx(hits.mean(), abs=1e-6)
    up = np.array(s["test/depth"]) <= 2
    assert s[f"{a}/acc1/upstream"] == pytest.approx(hits[up].mean(), abs=1e-6)
    assert s[f"{a}/acc1"] <= s[f"{a}/acc5"]
  for a in ("plain", "sc"):
    assert len(s[f"solve/{a}/nodes"]) == 2 and s[f"solve/{a}/solved"] == 1.0
  # Resume: drop the last stage's checkpoint and the summary; the rerun redoes the solve stage only.
  ckpt = wd / "checkpoints"
  last = max(int(p) for p in os.listdir(ckpt) if p.isdigit())
  shutil.rmtree(ckpt / str(last))
  os.remove(wd / "summary.json")
  _same(_run(NAME, wd, short(tmp_path)), s)


def test_claim_statistics_against_brute_force():
  cfg = registry.load(NAME).config_module
  rng = np.random.default_rng(1)
  depth = rng.integers(0, 6, 200)
  runs = [{"test/depth": depth.tolist(), "test/upstream_depth": 2, "sc/hits1": rng.integers(0, 2, 200).tolist(),
           "plain/hits1": rng.integers(0, 2, 200).tolist()} for _ in range(3)]
  up = depth <= 2
  want = np.mean([np.mean(np.array(r["sc/hits1"])[up]) - np.mean(np.array(r["plain/hits1"])[up]) for r in runs])
  assert cfg.gain("sc", "plain", True)(runs) == pytest.approx(want)
  d = np.mean([np.array(r["sc/hits1"]) - np.array(r["plain/hits1"]) for r in runs], axis=0)[up]
  low = cfg.gain_low("sc", "plain", True, reps=20_000)(runs)
  # The bootstrap's lower end is near the normal approximation's.
  assert low == pytest.approx(d.mean() - 1.96 * d.std(ddof=1) / np.sqrt(len(d)), abs=0.01)


def test_oversample_factor():
  train = registry.load(NAME).train_module
  assert train.oversample_factor(100, 900, 0.5) == 9
  assert train.oversample_factor(100, 900, 0.0) == 1
  assert train.oversample_factor(500, 100, 0.5) == 1
  assert train.oversample_factor(0, 100, 0.5) == 1


@pytest.mark.parametrize("override,match", [
    ({"data.generator": "tsp"}, "config.data.generator='tsp'"),
    ({"method.arms": ("plain", "magic")}, "config.method.arms has \\['magic'\\]"),
    ({"aug.kind": "rotate"}, "config.aug.kind='rotate'"),
    ({"aug.upstream_share": 1.0}, "upstream_share=1.0 in"),
    ({"data.small_share": 0.0}, "small_share=0.0 must be in"),
    ({"method.tau": 0.0}, "tau=0.0 > 0"),
])
def test_bad_config_is_a_clear_error(override, match):
  with pytest.raises(ConfigError, match=match):
    registry.load(NAME).get_config("tiny", override)


@pytest.mark.slow
def test_sharded_equals_single_and_solves(tmp_path):
  """A 4x2 (data, model) mesh trains every arm as one device does (the contrastive arms' SupCon couples the
  batch members across the data shards), with Adam's eps at 1e-6 as in learn2branch's test (a softmax-invariant
  head bias has an analytically zero gradient whose rounding Adam's default eps amplifies); the plain and SC
  policies then branch inside SCIP on 6 held-out instances (reported, not compared)."""
  from jaxlab import metrics  # pylint: disable=g-import-not-at-top
  runs = {}
  for label, mesh in (("sharded", (("data", 4), ("model", 2))), ("single", (("data", 1), ("model", 1)))):
    runs[label] = _run(NAME, tmp_path / label, short(tmp_path, mesh=mesh, **{"train.optimizer.eps": 1e-6,
                                                                             "solve.instances": 6}))
  for arm in registry.load(NAME).config_module.ARMS:
    a, b = (metrics.read_metrics(str(tmp_path / label / "stages" / f"train_{arm}")) for label in runs)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
      keys = [k for k in x if k.startswith("train/") and k != "train/steps_per_sec"]
      np.testing.assert_allclose([x[k] for k in keys], [y[k] for k in keys], rtol=1e-5, atol=1e-6, err_msg=arm)
    assert runs["sharded"][f"{arm}/acc1"] == pytest.approx(runs["single"][f"{arm}/acc1"], abs=1e-6), arm
  for a in ("plain", "sc"):
    assert runs["sharded"][f"solve/{a}/solved"] == 1.0 and runs["sharded"][f"solve/{a}/nodes_sgm"] >= 1
