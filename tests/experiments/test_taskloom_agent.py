"""TaskLoom agent: end to end on a short dm_control run (baselines, single-task and grouped arms), the claim
statistics against a direct computation, resume after a lost stage, config errors."""

import os
import shutil

import numpy as np
import pytest

from experiment_checks import _run, _strip, canary_covered, check_end_to_end
from jaxlab import registry
from jaxlab.multitask import grouping
from jaxlab.errors import ConfigError

NAME = "taskloom_agent"
SHORT = {"env.env_steps": 1200, "agent.prefill": 100, "agent.train_every": 6.0, "agent.batch_size": 2,
         "agent.seq_len": 16, "model.deter": 16, "model.hidden": 16, "behavior.hidden": 16, "behavior.horizon": 5,
         "grouping.group_at": 800, "grouping.measure_every": 200, "grouping.grad_batches": 1,
         "method.baseline_episodes": 1, "method.eval_episodes": 1, "method.balance_steps": 1200,
         "agent.checkpoint_every": 400}


@canary_covered
def test_end_to_end_claims_and_resume(tmp_path):
  pytest.importorskip("dm_control", reason="dm_control is not installed: pip install 'jaxlab[rl]'")
  exp = registry.load(NAME)
  cfg = exp.config_module
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, SHORT)
  assert s["stages"] == ["baseline", "balance", "single", "shared", "grouped"]
  assert s["task_names"] == list(cfg.SUITE_V2) and s["task_family"] == [0, 0, 1, 1]
  rnd, zero, pd = s["baseline/random"], s["baseline/zero"], s["baseline/scripted"]
  assert pd[2] is None and pd[0] > 900 and rnd[0] < 600 and 600 < zero[0] < 900   # PD balances; zero action drifts
  for arm in cfg.ARMS:
    eps = np.array(s[f"{arm}/episodes"])
    assert sorted(eps[:, 0].tolist()) == [0, 1, 2, 3]               # 1200 steps: one 1000-step episode per task
    assert len(s[f"{arm}/eval"]) == 4
  groups = s["grouped/groupings"]
  # affinities measured at the prefill's end (400 env steps) and at 600, averaged with the one at 800: 2 groups
  assert len(groups) == 1 and groups[0][0] == 800 and len(set(s["grouped/assign"])) == 2
  assert s["grouped/ari"] == pytest.approx(grouping.adjusted_rand_index(groups[0][1], [0, 0, 1, 1]))
  assert s["single/ari"] is None and s["shared/ari"] is None
  for claim in exp.claims:
    assert claim.check([s, s])["measured"] is not None
  # The statistics against a direct computation.
  assert len(s["balance/eval"]) == 1 and {e[0] for e in s["balance/episodes"]} == {0}
  ev = s["balance/eval"][0]
  assert cfg.eval_vs_pd([s]) == pytest.approx(ev / pd[0])
  assert cfg.eval_vs_zero([s]) == pytest.approx(ev / zero[0])
  g, one, sh = (np.array(s[f"{a}/episodes"]) for a in ("grouped", "single", "shared"))
  want = np.mean([g[g[:, 0] == t, 2].mean() - one[one[:, 0] == t, 2].mean() for t in range(4)])
  assert cfg.auc_gain([s]) == pytest.approx(want)
  assert cfg.auc_gain_low([s, s]) == pytest.approx(want)           # zero spread: the interval is the point
  fam = np.mean([g[g[:, 0] == t, 2].mean() - sh[sh[:, 0] == t, 2].mean() for t in (0, 1)])
  assert cfg.grouped_vs_shared_family([s]) == pytest.approx(fam)
  # Resume after losing the last stage: the grouped arm restarts from its own latest checkpoint (the episode
  # boundary at 1000 env steps) and ends bit-identical.
  os.remove(os.path.join(wd, "summary.json"))
  ckpts = sorted(int(x) for x in os.listdir(os.path.join(wd, "checkpoints")) if x.isdigit())
  shutil.rmtree(os.path.join(wd, "checkpoints", str(ckpts[-1])))
  again = _run(NAME, wd, SHORT)
  for k in ("single/episodes", "grouped/episodes", "grouped/eval", "grouped/groupings", "grouped/updates"):
    assert _strip(again)[k] == _strip(s)[k], k


def test_claim_statistics_against_a_direct_computation():
  """The claims' statistics on made-up summaries (the end-to-end run above checks them on a real one)."""
  from scipy import stats
  cfg = registry.load(NAME).config_module
  rng = np.random.default_rng(0)
  runs = []
  names = list(cfg.SUITE_V2)
  for _ in range(3):     # (task, step, return) rows: 4 episodes per task and arm
    eps = {arm: [[t, 250 * (i + 1), float(rng.uniform(100, 900))] for t in range(4) for i in range(4)]
           for arm in cfg.ARMS}
    runs.append({"task_names": names, "baseline/random": [float(rng.uniform(50, 150)), 0.0, 1.0, 1.0],
                 "baseline/zero": [float(rng.uniform(700, 800)), 0.0, 1.0, 1.0],
                 "baseline/scripted": [float(rng.uniform(800, 1000)), 0.0, None, None],
                 "balance/eval": [float(rng.uniform(500, 1000))],
                 "grouped/ari": float(rng.choice([1.0, 0.0])),
                 **{f"{a}/episodes": eps[a] for a in cfg.ARMS}})
  assert cfg.eval_vs_pd(runs) == pytest.approx(min(r["balance/eval"][0] / r["baseline/scripted"][0] for r in runs))
  assert cfg.eval_vs_zero(runs) == pytest.approx(min(r["balance/eval"][0] / r["baseline/zero"][0] for r in runs))
  no_stage = [{**r, "single/eval": [0.5, 0.0, 0.0, 0.0]} for r in runs]      # no "balance" stage: the single arm's
  for r in no_stage:
    del r["balance/eval"]
  assert cfg.eval_vs_pd(no_stage) == pytest.approx(min(0.5 / r["baseline/scripted"][0] for r in runs))

  def auc(r, arm, tasks):
    e = np.array(r[f"{arm}/episodes"])
    return np.mean([e[e[:, 0] == t, 2].mean() for t in tasks])

  def low(d):
    return np.mean(d) - stats.t.ppf(0.975, len(d) - 1) * np.std(d, ddof=1) / np.sqrt(len(d))
  gains = [auc(r, "grouped", range(4)) - auc(r, "single", range(4)) for r in runs]
  assert cfg.auc_gain(runs) == pytest.approx(np.mean(gains))
  assert cfg.auc_gain_low(runs) == pytest.approx(low(gains))
  assert np.isnan(cfg.auc_gain_low(runs[:1]))
  pen = [auc(r, "single", (0, 1)) - auc(r, "shared", (0, 1)) for r in runs]
  assert cfg.shared_penalty_low(runs) == pytest.approx(low(pen))
  assert cfg.grouped_vs_shared_family(runs) == pytest.approx(
      np.mean([auc(r, "grouped", (0, 1)) - auc(r, "shared", (0, 1)) for r in runs]))
  assert cfg.ari_exact(runs) == pytest.approx(np.mean([r["grouped/ari"] == 1.0 for r in runs]))
  # v1's statistics (variant tiny_v1), on the first task
  finals = [np.array(r["single/episodes"]) for r in runs]
  finals = [e[e[:, 0] == 0, 2][-2:].mean() for e in finals]
  assert cfg.vs_random(runs) == pytest.approx(min(f / r["baseline/random"][0] for f, r in zip(finals, runs)))
  assert cfg.vs_scripted(runs) == pytest.approx(min(f / r["baseline/scripted"][0] for f, r in zip(finals, runs)))


@pytest.mark.parametrize("overrides, match", [
    ({"method.arms": ("single", "mixture")}, "config.method.arms has"),
    ({"behavior.actor_grad": "sde"}, "actor_grad='sde'"),
    ({"env.action_repeat": 3}, "must divide the 1000-step"),
    ({"env.env_steps": 800}, "raise env_steps or lower the prefill"),
    ({"grouping.tau": 2.0}, "grouping.tau=2.0 must be in"),
    ({"agent.optimizer": "sgd"}, "agent.optimizer='sgd'"),
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
  v1 = exp.get_config("tiny_v1")   # the v1 claim setting: the cartpole family, the v1 agent
  assert tuple(v1.env.names) == cfg_names() and v1.grouping.num_groups == 1 and not v1.agent.replay_context


def cfg_names():
  return tuple(registry.load(NAME).config_module.CARTPOLE)
