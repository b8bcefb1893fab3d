"""TaskLoom stage one: end to end on a short synthetic run (three arms, grouping, exchange), resume, the claim
statistics against a direct computation, regrouping, a dm_control run when installed, config errors."""

import os
import shutil

import numpy as np
import pytest

from experiment_checks import _run, _strip, canary_covered, check_end_to_end
from jaxlab import registry
from jaxlab.errors import ConfigError

NAME = "taskloom"
SHORT = {"train.num_steps": 40, "grouping.warmup": 10, "grouping.grad_batches": 2, "grouping.exchange_every": 10,
         "env.horizon": 12, "data.test_episodes": 2, "model.hidden": 16, "model.latent": 8}


@canary_covered
def test_end_to_end_resume_and_claims(tmp_path):
  exp = registry.load(NAME)
  cfg = exp.config_module
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, SHORT)
  assert s["stages"] == ["independent", "shared", "grouped"]
  for arm in cfg.ARMS:
    err = np.array(s[f"{arm}/open_loop"])
    assert err.shape == (6, 5) and np.all(err > 0) and s[f"{arm}/open_loop_mean"] == pytest.approx(err[:, -1].mean())
  assert s["task_family"] == [0, 0, 1, 1, 2, 2] and len(s["grouping/labels"]) == 6
  cos = np.array(s["grouping/cosine"])
  np.testing.assert_allclose(np.diag(cos), 1.0, atol=1e-3)
  np.testing.assert_allclose(cos, cos.T, atol=1e-6)
  for claim in exp.claims:
    assert claim.check([s, s])["measured"] is not None
  fam = np.array(s["task_family"])
  g = np.array(s["grouped/open_loop"])[:, 4]
  i = np.array(s["independent/open_loop"])[:, 4]
  assert cfg.grouped_vs_independent([s]) == pytest.approx(g.mean() / i.mean())
  sh = np.array(s["shared/open_loop"])[:, 4]
  worst = int(np.argmax([sh[fam == f].mean() - i[fam == f].mean() for f in range(3)]))
  assert cfg.grouped_vs_shared_worst([s]) == pytest.approx(g[fam == worst].mean() / sh[fam == worst].mean())
  # Resume after losing the last stage.
  os.remove(os.path.join(wd, "summary.json"))
  ckpts = sorted(int(x) for x in os.listdir(os.path.join(wd, "checkpoints")) if x.isdigit())
  shutil.rmtree(os.path.join(wd, "checkpoints", str(ckpts[-1])))
  assert _strip(_run(NAME, wd, SHORT)) == _strip(s)


def test_claim_statistics_against_a_direct_computation():
  """The claims' statistics on made-up summaries (the end-to-end run above checks them on a real one)."""
  cfg = registry.load(NAME).config_module
  rng = np.random.default_rng(0)
  s = {"task_family": [0, 0, 1, 1, 2, 2]}
  for arm in ("independent", "shared", "grouped"):
    s[f"{arm}/open_loop"] = rng.uniform(0.1, 2.0, (6, 5)).tolist()
  fam = np.array(s["task_family"])
  g, i, sh = (np.array(s[f"{a}/open_loop"])[:, 4] for a in ("grouped", "independent", "shared"))
  assert cfg.grouped_vs_independent([s]) == pytest.approx(g.mean() / i.mean())
  worst = int(np.argmax([sh[fam == f].mean() - i[fam == f].mean() for f in range(3)]))
  assert cfg.grouped_vs_shared_worst([s]) == pytest.approx(g[fam == worst].mean() / sh[fam == worst].mean())


def test_regrouping_runs(tmp_path):
  s = _run(NAME, tmp_path / "re", {**SHORT, "grouping.regroup_every": 10, "grouping.loss": "full",
                                   "method.arms": ("grouped",)})
  assert s["grouping/regroups"] >= 0 and np.isfinite(s["grouped/open_loop_mean"])


def test_dm_control_tasks(tmp_path):
  pytest.importorskip("dm_control", reason="dm_control is not installed: pip install 'jaxlab[rl]'")
  s = _run(NAME, tmp_path / "dmc", {**SHORT, "env.kind": "dm_control", "env.names": ("cartpole-balance",
                                    "cartpole-swingup", "point_mass-easy"), "env.state_scales": (),
                                    "data.train_episodes": 2, "grouping.num_groups": 2, "method.arms": ("grouped",)})
  assert s["task_family"] == [0, 0, 1] and np.array(s["grouped/open_loop"]).shape == (3, 5)


@pytest.mark.parametrize("overrides, match", [
    ({"method.arms": ("grouped", "mixture")}, "config.method.arms has"),
    ({"grouping.warmup": 5000}, "grouping.warmup=5000 must be in"),
    ({"env.state_dim": 5}, "must be even"),
    ({"grouping.tau": 2.0}, "grouping.tau=2.0 must be in"),
    ({"grouping.loss": "reward"}, "grouping.loss='reward': use obs"),
])
def test_config_errors(overrides, match):
  with pytest.raises(ConfigError, match=match):
    registry.load(NAME).get_config("tiny", overrides)
