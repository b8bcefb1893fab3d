"""The multi-task Dreamer agent: row layout per group, regrouping, one update per grouping mode with the stage-2
exchange, and the online loop on dm_control (episodes, grouping, checkpoints and resume)."""

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.errors import ConfigError, Preempted
from jaxlab.multitask import param_sharing
from jaxlab.rl import replay
from jaxlab.rl.dreamer import agent as agent_lib
from jaxlab.rl.dreamer import behavior, online, rssm


def _agent(num_tasks=3, obs_dim=5, act_dim=1, exchange=r"^gru/", obs_mask=None, **kw):
  w = rssm.WorldModelConfig(obs_dim=obs_dim, act_dim=act_dim, num_tasks=num_tasks, deter=16, stoch=4, classes=4,
                            hidden=16, layers=1, emb=2, num_bins=21)
  b = behavior.BehaviorConfig(act_dim=act_dim, hidden=16, layers=1, horizon=5, gamma=0.99, num_bins=21)
  c = agent_lib.AgentConfig(**{"batch_size": 2, "seq_len": 8, "model_lr": 1e-3, "actor_lr": 1e-3, "critic_lr": 1e-3,
                               "train_every": 4, "prefill": 30, "action_repeat": 4, "imag_starts": 8, **kw})
  return agent_lib.Agent(w, b, c, obs_mask=obs_mask, exchange=exchange)


# The online test's tasks: their observation sizes (5, 5, 4: padded to 5, the mask zeroes the pad) and action
# sizes (1, 1, 2: padded to 2). The online test checks these against the environment.
ONLINE_TASKS = ["cartpole-balance", "cartpole-swingup", "point_mass-easy"]
ONLINE_OBS_MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], np.float32)
ONLINE_STEPS = 2000                                       # env steps per task of the online run
REPEAT = 8


@pytest.fixture(scope="module")
def agent():
  """One agent for the whole file, shaped like the online test's (3 tasks, obs 5 with the point_mass mask, act 2):
  jax compiles `update` once per grouping (the `members` rows), so the update tests' [0, 0, 0] and [0, 1, 1]
  groupings and the task-gradient test compile the programs the online run then reuses (its shared model,
  then its two groups: it finds the labels [0, 1, 1]; other labels would only cost one more compile)."""
  return _agent(num_tasks=3, obs_dim=5, act_dim=2, obs_mask=ONLINE_OBS_MASK, checkpoint_every=600,
                action_repeat=REPEAT)


def test_member_rows_and_regroup():
  rows = agent_lib.member_rows(np.array([0, 0, 1]), 2)
  np.testing.assert_array_equal(rows, [[0, 1, 0], [2, 2, 2]])       # 2 rows per task, 3 tasks, 2 models
  np.testing.assert_array_equal(agent_lib.member_rows(np.array([0, 1, 2]), 2), [[0, 0], [1, 1], [2, 2]])
  stacked = {"a": jnp.arange(3.0)[:, None] * jnp.ones((3, 2))}
  out = param_sharing.regroup(stacked, np.array([0, 1, 2]), np.array([0, 1, 0]))
  np.testing.assert_allclose(out["a"], [[1.0, 1.0], [1.0, 1.0]])    # new group 0 = mean of old models 0 and 2
  out = param_sharing.regroup(stacked, np.array([0, 0, 1]), np.array([0, 0, 0]))
  np.testing.assert_allclose(out["a"], [[1 / 3, 1 / 3]])            # a model shared by two tasks counts twice


def _buffer(num_tasks, obs_dim=5, act_dim=2, n=40, capacity=ONLINE_STEPS // REPEAT + 1):
  """`n` random steps per task in rings of the online run's capacity (its agent steps + 1: the same program)."""
  buf = replay.init(num_tasks, capacity, obs_dim, act_dim)
  rng = np.random.default_rng(0)
  for t in range(num_tasks):
    first = np.arange(n) % 20 == 0
    buf = replay.add(buf, np.full(n, t, np.int32), rng.normal(size=(n, obs_dim)), rng.uniform(-1, 1, (n, act_dim)),
                     rng.uniform(size=n), np.ones(n), first)
  return buf


@pytest.mark.parametrize("assign", [[0, 1, 2], [0, 0, 0], [0, 1, 1]])
def test_update_runs_for_every_grouping_and_exchange_ties_the_subset(agent, assign):
  assign = np.array(assign)
  ag = agent
  st = ag.init(jax.random.key(0), assign)
  buf = _buffer(3)
  members = agent_lib.member_rows(assign, 2)
  st, _, met = ag.update(st, buf, members, jax.random.key(1), do_exchange=True, tau=1.0)
  assert all(np.isfinite(float(v)) for v in met.values())
  m = int(assign.max()) + 1
  assert st["wm"]["gru"]["w"].shape[0] == m and st["ac"]["actor"][0]["w"].shape[0] == 3
  if m > 1:   # tau = 1: the exchanged subset (the GRU) is identical across the group models, the rest is not
    np.testing.assert_allclose(st["wm"]["gru"]["w"][0], st["wm"]["gru"]["w"][1], atol=1e-6)
    assert not np.allclose(st["wm"]["img_out"][0]["w"][0], st["wm"]["img_out"][0]["w"][1])
  # Each task's actor moved (its rows drove an imagination step).
  fresh = ag.init(jax.random.key(0), assign)
  for t in range(3):
    assert not np.allclose(st["ac"]["actor"][0]["w"][t], fresh["ac"]["actor"][0]["w"][t])


def test_task_gradients_and_grouping_config_errors(agent):
  ag = agent
  st = ag.init(jax.random.key(0), np.zeros(3, int))
  g = ag.task_gradients(st, _buffer(3), jax.random.key(2), batches=1)     # the online run's grad_batches
  assert g.shape[0] == 3 and np.all(np.isfinite(g)) and np.all(np.linalg.norm(g, axis=1) > 0)
  with pytest.raises(ConfigError, match="grouping.mode='mixture'"):
    agent_lib.GroupingConfig(mode="mixture")
  with pytest.raises(ConfigError, match="grouping.tau=1.5"):
    agent_lib.GroupingConfig(tau=1.5)


class _Crash(Exception):
  pass


class _CrashingEnv:
  """Delegates to an environment; on the `at`-th call of `step` raises _Crash (a crash) or, with `signal_at`,
  sends this process SIGTERM (a preemption) and carries on."""

  def __init__(self, env, at, sigterm=False):
    self.env, self.at, self.sigterm, self.calls = env, at, sigterm, 0

  def __getattr__(self, name):
    return getattr(self.env, name)

  def step(self, actions):
    self.calls += 1
    if self.calls == self.at:
      if not self.sigterm:
        raise _Crash()
      os.kill(os.getpid(), signal.SIGTERM)
    return self.env.step(actions)


def test_online_run_groups_checkpoints_and_resumes_bit_identical(agent, tmp_path):
  """SIGTERM mid-episode stops the run at the next episode boundary after a checkpoint; a crash after that loses
  what came after the checkpoint; the final rerun ends exactly where an uninterrupted run ends."""
  pytest.importorskip("dm_control", reason="dm_control is not installed: pip install 'jaxlab[rl]'")
  from jaxlab.rl.envs.dm_control import DMControlTasks  # pylint: disable=g-import-not-at-top
  grouping = agent_lib.GroupingConfig("grouped", group_at=400, num_groups=2, grad_batches=1, exchange_every=5)
  kw = {"env_steps": ONLINE_STEPS, "key": jax.random.key(0), "grouping": grouping, "eval_episodes": 1}
  ag = agent                     # checkpoint_every=600 env steps, action_repeat=8: 250 agent steps per run

  def env():   # a fresh batch per run, as a restarted process would build it
    return DMControlTasks(ONLINE_TASKS, seed=0)
  with env() as e:
    assert (e.obs_dim, e.act_dim) == (5, 2)
    np.testing.assert_array_equal(e.obs_mask, ONLINE_OBS_MASK)
    with pytest.raises(ConfigError, match="leaves no learning after the prefill"):
      online.run(ag, e, str(tmp_path / "x"), env_steps=100, key=jax.random.key(0), grouping=grouping)
    ref = online.run(ag, e, str(tmp_path / "ref"), **kw)
  # Episodes are 125 agent steps (1000 env steps / 8) plus the reset step: the first boundary is agent step 125.
  with env() as e, pytest.raises(Preempted, match="agent step 125") as info:   # SIGTERM at agent step 50
    online.run(ag, _CrashingEnv(e, REPEAT * 50, sigterm=True), str(tmp_path / "r"), **kw)
  assert info.value.step == 125 and info.value.checkpoint == 125
  with env() as e, pytest.raises(_Crash):        # resumed at 125, crashes at 155 (the next checkpoint is due later)
    online.run(ag, _CrashingEnv(e, REPEAT * 30), str(tmp_path / "r"), **kw)
  with env() as e:
    full = online.run(ag, e, str(tmp_path / "r"), **kw)
  assert ref["resumes"] == 0 and full["resumes"] == 1   # both reruns restored the checkpoint of agent step 125
  assert full["updates"] == ref["updates"] == (250 - 30 + 1) // 4     # one update per 4 agent steps after the prefill
  # The grouping at 400 env steps happened before the checkpoint: the resumed run restores it, not redoes it.
  assert len(full["groupings"]) == 1 and full["groupings"][0][0] == 400
  labels = full["groupings"][0][1]
  assert full["assign"] == labels and len(set(labels)) == 2
  np.testing.assert_allclose(np.diag(np.array(full["groupings"][0][2])), 1.0, atol=1e-3)
  assert sorted(e[0] for e in ref["episodes"]) == [0, 1, 2]
  for k in ("episodes", "eval", "groupings", "assign", "updates", "metrics"):
    assert full[k] == ref[k], k
  for a, b in zip(jax.tree.leaves(full["state"]), jax.tree.leaves(ref["state"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_replay_context_carries_the_acting_latent_and_writes_it_back(tmp_path):
  """agent.replay_context: the replay stores the posterior computed when acting; an update trains on windows
  that start from it and writes the fresh posteriors back; LaProp and the DreamerV3 critic estimators run."""
  ag = _agent(num_tasks=2, obs_dim=5, act_dim=2, replay_context=True, optimizer="laprop", warmup=10)
  ag = agent_lib.Agent(ag.wcfg, behavior.BehaviorConfig(**{**ag.bcfg.__dict__, "slowtar": False, "slowreg": 1.0}),
                       ag.cfg, exchange=r"^gru/")
  assert ag.replay_extras() == {"deter": (16,), "stoch": (4, 4)}
  buf = replay.init(2, 64, 5, 2, extras=ag.replay_extras())
  assign = np.array([0, 1])
  st = ag.init(jax.random.key(0), assign)
  carry = ag.initial_carry(2)
  rng = np.random.default_rng(0)
  for i in range(40):
    obs = rng.normal(size=(2, 5)).astype(np.float32)
    first = np.full(2, i % 20 == 0)
    _, carry = ag.act(st, assign, np.arange(2), carry, obs, first, jax.random.key(i))
    buf = replay.add(buf, np.arange(2, dtype=np.int32), obs, rng.uniform(-1, 1, (2, 2)), np.ones(2), np.ones(2),
                     first, {"deter": carry["deter"], "stoch": carry["stoch"]})
  stored = np.asarray(buf.extra["deter"])
  np.testing.assert_array_equal(stored[:, 39], np.asarray(carry["deter"]))
  st, buf, met = ag.update(st, buf, agent_lib.member_rows(assign, 2), jax.random.key(1))
  assert all(np.isfinite(float(v)) for v in met.values())
  assert not np.array_equal(np.asarray(buf.extra["deter"]), stored)    # the sampled rows were written back
  with pytest.raises(ConfigError, match="agent.optimizer='sgd'"):
    agent_lib.AgentConfig(optimizer="sgd")


def test_online_run_can_group_at_the_initialisation_before_any_update(agent, tmp_path):
  """grouping.before_updates with group_at at the end of the prefill: the tasks are grouped on the prefill data by
  the shared model as initialised (no update yet), then trained in their groups."""
  pytest.importorskip("dm_control", reason="dm_control is not installed: pip install 'jaxlab[rl]'")
  from jaxlab.rl.envs.dm_control import DMControlTasks  # pylint: disable=g-import-not-at-top
  prefill_env = agent.cfg.prefill * REPEAT
  grouping = agent_lib.GroupingConfig("grouped", group_at=prefill_env, num_groups=2, grad_batches=1,
                                      before_updates=True)
  with DMControlTasks(ONLINE_TASKS, seed=0) as e:
    run = online.run(agent, e, str(tmp_path / "g"), env_steps=prefill_env + 8 * REPEAT, key=jax.random.key(0),
                     grouping=grouping)
  assert run["groupings"][0][0] == prefill_env and len(set(run["groupings"][0][1])) == 2
  assert run["updates"] == 2 and run["assign"] == run["groupings"][0][1]    # 8 agent steps at one update per 4


def test_first_grouping_clusters_the_mean_affinity_of_the_shared_phase(agent, tmp_path):
  """grouping.measure_every: affinity measurements during the shared phase are averaged into the first grouping."""
  pytest.importorskip("dm_control", reason="dm_control is not installed: pip install 'jaxlab[rl]'")
  from jaxlab.rl.envs.dm_control import DMControlTasks  # pylint: disable=g-import-not-at-top
  seen = []
  orig = agent.affinity

  def affinity(*args):
    seen.append(orig(*args))
    return seen[-1]
  grouping = agent_lib.GroupingConfig("grouped", group_at=640, measure_every=320, num_groups=2, grad_batches=1)
  agent.affinity = affinity
  try:
    with DMControlTasks(ONLINE_TASKS, seed=0) as e:   # prefill 30 agent steps = 240 env steps; 80 steps = 640
      run = online.run(agent, e, str(tmp_path / "m"), env_steps=640 + REPEAT, key=jax.random.key(0),
                       grouping=grouping)
  finally:
    del agent.affinity
  # measured at the prefill's end (240 env steps), at 320, and at the grouping (640)
  assert len(seen) == 3 and len(run["groupings"]) == 1 and run["groupings"][0][0] == 640
  np.testing.assert_allclose(run["groupings"][0][2], np.mean(seen, 0), atol=1e-4)
  with pytest.raises(ConfigError, match="grouping.measure_every=-1"):
    agent_lib.GroupingConfig(measure_every=-1)

