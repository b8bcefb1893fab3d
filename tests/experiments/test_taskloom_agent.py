"""TaskLoom agent: end to end on a short dm_control run (baselines, single-task and grouped arms), the claim
statistics against a direct computation, resume after a lost stage, config errors."""

import os
import shutil

import numpy as np
import pytest

from experiment_checks import _run, _strip, canary_covered, check_end_to_end
from jaxlab import registry
from jaxlab.errors import ConfigError

NAME = "taskloom_agent"
SHORT = {"env.env_steps": 1200, "agent.prefill": 100, "agent.train_every": 6.0, "agent.batch_size": 2,
         "agent.seq_len": 16, "agent.imag_starts": 16, "model.deter": 16, "model.hidden": 16, "behavior.hidden": 16,
         "behavior.horizon": 5, "grouping.group_at": 400, "grouping.num_groups": 2, "grouping.grad_batches": 1,
         "method.baseline_episodes": 1, "agent.checkpoint_every": 400}


@canary_covered
def test_end_to_end_claims_and_resume(tmp_path):
  pytest.importorskip("dm_control", reason="dm_control is not installed: pip install 'jaxlab[rl]'")
  exp = registry.load(NAME)
  cfg = exp.config_module
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, SHORT)
  assert s["stages"] == ["baseline", "single", "grouped"]
  assert s["task_names"] == list(cfg.CARTPOLE)
  rnd, pd = s["baseline/random"], s["baseline/scripted"]
  assert pd[2] is None and pd[0] > 900 and rnd[0] < 600            # the PD controller balances; random does not
  for arm in ("single", "grouped"):
    eps = np.array(s[f"{arm}/episodes"])
    assert sorted(eps[:, 0].tolist()) == [0, 1, 2]                  # 1200 steps: one 1000-step episode per task
    assert len(s[f"{arm}/eval"]) == 3
  groups = s["grouped/groupings"]
  assert len(groups) == 1 and groups[0][0] == 400 and len(set(s["grouped/assign"])) == 2
  for claim in exp.claims:
    assert claim.check([s, s])["measured"] is not None
  # The statistics against a direct computation.
  eps = np.array(s["single/episodes"])
  final = eps[eps[:, 0] == 0, 2][-2:].mean()
  assert cfg.vs_random([s]) == pytest.approx(final / rnd[0])
  assert cfg.vs_scripted([s]) == pytest.approx(final / pd[0])
  g = np.array(s["grouped/episodes"])
  want = np.mean([g[g[:, 0] == t, 2].mean() - eps[eps[:, 0] == t, 2].mean() for t in range(3)])
  assert cfg.auc_gain([s]) == pytest.approx(want)
  assert cfg.auc_gain_low([s, s]) == pytest.approx(want)           # zero spread: the interval is the point
  # Resume after losing the last stage: the grouped arm restarts from its own latest checkpoint.
  os.remove(os.path.join(wd, "summary.json"))
  ckpts = sorted(int(x) for x in os.listdir(os.path.join(wd, "checkpoints")) if x.isdigit())
  shutil.rmtree(os.path.join(wd, "checkpoints", str(ckpts[-1])))
  again = _run(NAME, wd, SHORT)
  assert _strip(again)["single/episodes"] == _strip(s)["single/episodes"]
  assert again["grouped/updates"] == s["grouped/updates"]


def test_claim_statistics_against_a_direct_computation():
  """The claims' statistics on made-up summaries (the end-to-end run above checks them on a real one)."""
  from scipy import stats
  cfg = registry.load(NAME).config_module
  rng = np.random.default_rng(0)
  runs = []
  for _ in range(3):     # (task, step, return) rows: 4 episodes per task and arm
    eps = {arm: [[t, 250 * (i + 1), float(rng.uniform(100, 900))] for t in range(3) for i in range(4)]
           for arm in ("single", "grouped")}
    runs.append({"baseline/random": [float(rng.uniform(50, 150)), 0.0, None],
                 "baseline/scripted": [float(rng.uniform(800, 1000)), 0.0, None],
                 "single/episodes": eps["single"], "grouped/episodes": eps["grouped"]})
  finals = [np.array(r["single/episodes"]) for r in runs]
  finals = [e[e[:, 0] == 0, 2][-2:].mean() for e in finals]
  assert cfg.vs_random(runs) == pytest.approx(min(f / r["baseline/random"][0] for f, r in zip(finals, runs)))
  assert cfg.vs_scripted(runs) == pytest.approx(min(f / r["baseline/scripted"][0] for f, r in zip(finals, runs)))
  gains = []
  for r in runs:
    g, s = np.array(r["grouped/episodes"]), np.array(r["single/episodes"])
    gains.append(np.mean([g[g[:, 0] == t, 2].mean() - s[s[:, 0] == t, 2].mean() for t in range(3)]))
  assert cfg.auc_gain(runs) == pytest.approx(np.mean(gains))
  low = np.mean(gains) - stats.t.ppf(0.975, 2) * np.std(gains, ddof=1) / np.sqrt(3)
  assert cfg.auc_gain_low(runs) == pytest.approx(low)
  assert np.isnan(cfg.auc_gain_low(runs[:1]))


@pytest.mark.parametrize("overrides, match", [
    ({"method.arms": ("single", "mixture")}, "config.method.arms has"),
    ({"behavior.actor_grad": "sde"}, "actor_grad='sde'"),
    ({"env.action_repeat": 3}, "must divide the 1000-step"),
    ({"env.env_steps": 800}, "raise env_steps or lower the prefill"),
    ({"grouping.tau": 2.0}, "grouping.tau=2.0 must be in"),
])
def test_config_errors(overrides, match):
  with pytest.raises(ConfigError, match=match):
    registry.load(NAME).get_config("tiny", overrides)


def test_full_configs_load():
  exp = registry.load(NAME)
  full = exp.get_config("full")
  assert len(full.env.names) == 18 and full.model.stoch == 32 and full.model.classes == 32
  visual = exp.get_config("variant=full,visual=True")
  assert visual.env.pixels and len(visual.env.names) == 20
