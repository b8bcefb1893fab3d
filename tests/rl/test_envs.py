"""Multi-task environment adapters: padding, masks, task ids, seeding, worker processes, auto-reset, gymnax."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from jaxlab.errors import ConfigError, DataError, MissingDependencyError
from jaxlab.rl.envs import base
from jaxlab.rl.envs import gymnax as gx

MIXED = ["cartpole-balance", "point_mass-easy", "reacher-easy"]


def _rollout(env, steps, seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  out = [env.reset()]
  for _ in range(steps):
    out.append(env.step(scale * env.sample_actions(rng)))
  return out


def _same(a, b):
  for x, y in zip(a, b):
    for f in ("obs", "reward", "discount", "first", "last", "task_id"):
      np.testing.assert_array_equal(getattr(x, f), getattr(y, f), err_msg=f)


def test_pad():
  np.testing.assert_array_equal(base.pad(np.ones((2, 3)), 5), [[1, 1, 1, 0, 0]] * 2)
  assert base.pad(np.ones(4), 4).shape == (4,)
  with pytest.raises(DataError):
    base.pad(np.ones(4), 3)


# ---- dm_control ----


@pytest.fixture(scope="module")
def dmc():
  pytest.importorskip("dm_control")
  from jaxlab.rl.envs import dm_control
  return dm_control


def test_dm_control_padding_masks_task_ids(dmc):
  with dmc.DMControlTasks(MIXED, envs_per_task=2, seed=0) as env:
    assert [(t.obs_dim, t.act_dim) for t in env.tasks] == [(5, 1), (4, 2), (6, 2)]
    assert (env.obs_dim, env.act_dim, env.num_envs) == (6, 2, 6)
    np.testing.assert_array_equal(env.obs_mask, [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [1] * 6])
    np.testing.assert_array_equal(env.act_mask, [[1, 0], [1, 1], [1, 1]])
    np.testing.assert_array_equal(env.task_ids, [0, 0, 1, 1, 2, 2])
    assert env.obs_keys[0] == ["position", "velocity"] and env.obs_keys[2] == ["position", "to_target", "velocity"]
    ts = env.reset()
    assert ts.obs.shape == (6, 6) and ts.obs.dtype == np.float32 and ts.task_id.dtype == np.int32
    assert ts.first.all() and not ts.last.any() and ts.pixels is None
    np.testing.assert_array_equal(ts.obs * (1 - env.obs_mask[ts.task_id]), 0)   # padding is zero
    np.testing.assert_array_equal(ts.task_id, env.task_ids)
    ts = env.step(env.sample_actions(np.random.default_rng(0)))
    assert not ts.first.any() and ts.reward.shape == (6,) and ts.discount.dtype == np.float32
    with pytest.raises(DataError, match="expected"):
      env.step(np.zeros((6, 3)))


def test_dm_control_seeding_clipping_and_padded_actions(dmc):
  names = ["cartpole-balance", "point_mass-easy"]
  with dmc.DMControlTasks(names, envs_per_task=2, seed=3) as a, dmc.DMControlTasks(names, 2, seed=3) as b, \
      dmc.DMControlTasks(names, 2, seed=4) as c:
    ra, rb, rc = _rollout(a, 10), _rollout(b, 10), _rollout(c, 10)
    _same(ra, rb)
    assert not np.array_equal(ra[0].obs, rc[0].obs)
    assert not np.array_equal(ra[0].obs[0], ra[0].obs[1])   # copies of a task get different seeds
    # Out-of-bound actions are clipped to [-1, 1]; cartpole's padded second entry is ignored.
    rng = np.random.default_rng(1)
    a.reset(), b.reset()
    for _ in range(5):
      act = np.sign(rng.normal(size=(4, 2))).astype(np.float32)
      wild = act * 50.0
      wild[:2, 1] = rng.normal(size=2) * 7.0
      _same([a.step(act)], [b.step(wild)])


def test_dm_control_auto_reset_after_last(dmc):
  with dmc.DMControlTasks(["cartpole-balance"], envs_per_task=2, seed=0, time_limit=0.05) as env:   # 5 steps
    ts = env.reset()
    lasts = []
    for i in range(12):
      ts = env.step(np.full((2, 1), 0.5, np.float32))
      lasts.append(ts.last[0])
      if i == 4:
        assert ts.last.all() and (ts.discount == 1).all()   # a time-limit cut: discount stays 1
      if i == 5:
        assert ts.first.all() and not ts.last.any() and (ts.reward == 0).all()
    assert [i for i, x in enumerate(lasts) if x] == [4, 10]


def test_dm_control_workers_match_in_process(dmc):
  with dmc.DMControlTasks(MIXED, envs_per_task=2, seed=1, time_limit=0.1) as local, \
      dmc.DMControlTasks(MIXED, envs_per_task=2, seed=1, time_limit=0.1, workers=2) as pooled:
    assert pooled.tasks == local.tasks and pooled.workers == 2
    info = pooled.worker_info()
    assert len(info) == 2 and not any(i["jax_imported"] for i in info)
    _same(_rollout(local, 12, scale=1.5), _rollout(pooled, 12, scale=1.5))   # crosses episode ends too
    procs = list(pooled._pool.procs)
  assert not any(p.is_alive() for p in procs)   # close() ends the workers


def test_dm_control_unknown_task_and_mujoco4(dmc, monkeypatch):
  with pytest.raises(ConfigError) as e:
    dmc.DMControlTasks(["cartpole-balanse"])
  msg = str(e.value)
  assert "\n" not in msg and "cartpole-balanse" in msg and "cartpole-balance" in msg and "walker-walk" in msg
  monkeypatch.setattr(dmc, "_mujoco_major", lambda: 4)
  with pytest.raises(MissingDependencyError, match=r"pip install mujoco==3\.17\.0"):
    dmc.DMControlTasks(["cartpole-balance"])


def test_dm_control_pixels(dmc, monkeypatch):
  monkeypatch.setenv("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl"))   # restored after the test
  try:   # a fresh worker process, so that MUJOCO_GL applies even though dm_control is imported here already
    env = dmc.DMControlTasks(["cartpole-balance", "point_mass-easy"], seed=0, workers=1, pixels=True, image_size=32)
  except RuntimeError as e:
    pytest.skip(f"rendering does not work here: {e}")
  with env:
    ts = env.reset()
    assert ts.pixels.shape == (2, 32, 32, 3) and ts.pixels.dtype == np.uint8 and ts.pixels.std() > 0
    ts = env.step(np.zeros((2, 2), np.float32))
    assert ts.pixels.shape == (2, 32, 32, 3)


def test_dm_control_missing_is_one_line(monkeypatch):
  from jaxlab.rl.envs import dm_control
  monkeypatch.setattr(dm_control, "_mujoco_major", lambda: None)
  monkeypatch.setitem(sys.modules, "dm_control", None)
  with pytest.raises(MissingDependencyError, match=r"jaxlab\[rl\]") as e:
    dm_control.DMControlTasks(["cartpole-balance"])
  assert "\n" not in str(e.value)


def test_bench_rows(dmc, capsys):
  from jaxlab.rl.envs import bench
  assert bench.main(["--names", "cartpole-balance", "--steps", "3", "--envs_per_task", "1", "--workers", "0"]) == 0
  out = capsys.readouterr().out
  assert "steps/s" in out and "cartpole-balance" in out


# ---- gymnax (fake environments stand in when gymnax is absent) ----


class _Box:
  def __init__(self, low, high, shape):
    self.low, self.high, self.shape = low, high, shape


class _Discrete:
  def __init__(self, n):
    self.n, self.shape = n, ()


class _CounterEnv:
  """gymnax-like: obs [x, t]; x += action; terminates (or truncates) after `horizon` steps; resets itself."""

  def __init__(self, horizon=3, discrete=False, legacy=False, truncate=False):
    self.horizon, self.discrete, self.legacy, self.truncate = horizon, discrete, legacy, truncate

  def observation_space(self, params):
    return _Box(-np.inf, np.inf, (2,))

  def action_space(self, params):
    return _Discrete(3) if self.discrete else _Box(-1.0, 1.0, (1,))

  def reset(self, key, params):
    import jax
    import jax.numpy as jnp
    state = {"x": jax.random.uniform(key), "t": jnp.int32(0)}
    return jnp.stack([state["x"], 0.0]), state

  def step(self, key, state, action, params):
    import jax
    import jax.numpy as jnp
    move = (action.astype(jnp.float32) - 1.0) if self.discrete else action[0]
    new = {"x": state["x"] + move, "t": state["t"] + 1}
    obs_st = jnp.stack([new["x"], new["t"].astype(jnp.float32)])
    done = new["t"] >= self.horizon
    obs_re, state_re = self.reset(key, params)
    obs = jnp.where(done, obs_re, obs_st)
    state = jax.tree.map(lambda r, s: jnp.where(done, r, s), state_re, new)
    if self.legacy:
      return obs, state, jnp.float32(1.0), done, {"discount": 1.0 - done}
    term, trunc = (jnp.bool_(False), done) if self.truncate else (done, jnp.bool_(False))
    return obs, state, jnp.float32(1.0), term, trunc, {"final_observation": obs_st}


def _fake(**kw):
  return lambda name: (_CounterEnv(**kw), None)


def test_gymnax_parse_step_tuples():
  obs, state, r, term, trunc, final = gx.parse_step((1, 2, 3, True, False, {"final_observation": 9}))
  assert (obs, final, bool(term), bool(trunc)) == (1, 9, True, False)
  obs, state, r, term, trunc, final = gx.parse_step((1, 2, 3, True, {"truncated": True}))
  assert (final, bool(term), bool(trunc)) == (1, False, True)
  with pytest.raises(DataError, match="returned 4 values"):
    gx.parse_step((1, 2, 3, 4))


@pytest.mark.parametrize("truncate", [False, True])
def test_gymnax_six_tuple_auto_reset(truncate):
  with gx.GymnaxTasks(["counter"], envs_per_task=2, seed=0, make=_fake(truncate=truncate)) as env:
    assert env.tasks[0] == base.TaskSpec("counter", 2, 1, (-1.0,), (1.0,))
    ts = env.reset()
    assert ts.first.all() and ts.obs.shape == (2, 2)
    for i in range(3):
      ts = env.step(np.full((2, 1), 5.0, np.float32))   # clipped to 1
      np.testing.assert_allclose(ts.obs[:, 1], i + 1)   # the final observation, not gymnax's reset one
    assert ts.last.all() and not ts.first.any()
    np.testing.assert_array_equal(ts.discount, 1.0 if truncate else 0.0)
    ts2 = env.step(np.zeros((2, 1), np.float32))
    assert ts2.first.all() and not ts2.last.any() and (ts2.reward == 0).all() and (ts2.obs[:, 1] == 0).all()


def test_gymnax_five_tuple_discrete_argmax_and_padding():
  make = lambda name: (_CounterEnv(discrete=True, legacy=True), None) if name == "d" else (_CounterEnv(), None)
  with gx.GymnaxTasks(["d", "c"], envs_per_task=1, seed=0, make=make) as env:
    assert env.tasks[0].discrete and env.tasks[0].act_dim == 3 and env.act_dim == 3
    np.testing.assert_array_equal(env.act_mask, [[1, 1, 1], [1, 0, 0]])
    ts0 = env.reset()
    acts = np.array([[0.1, 0.2, 0.9], [0.5, 99.0, -99.0]], np.float32)   # argmax 2 -> +1; padded ignored
    ts = env.step(acts)
    np.testing.assert_allclose(ts.obs[:, 0], ts0.obs[:, 0] + [1.0, 0.5], rtol=1e-6)
    env.step(acts)
    ts = env.step(acts)
    assert ts.last.all() and ts.discount[0] == 0.0   # legacy `done` counts as terminated
    assert ts.task_id.tolist() == [0, 1]


def test_gymnax_seeding():
  a = gx.GymnaxTasks(["c"], 3, seed=5, make=_fake())
  b = gx.GymnaxTasks(["c"], 3, seed=5, make=_fake())
  c = gx.GymnaxTasks(["c"], 3, seed=6, make=_fake())
  _same(_rollout(a, 7), _rollout(b, 7))
  assert not np.array_equal(a.reset().obs, c.reset().obs)


def test_gymnax_missing_is_one_line(monkeypatch):
  monkeypatch.setitem(sys.modules, "gymnax", None)
  with pytest.raises(MissingDependencyError, match="pip install gymnax") as e:
    gx.GymnaxTasks(["CartPole-v1"])
  assert "\n" not in str(e.value)


def test_gymnax_real_environments():
  pytest.importorskip("gymnax")
  with pytest.raises(ConfigError, match="CartPole-v1"):
    gx.GymnaxTasks(["CartPole-v9"])
  with gx.GymnaxTasks(["CartPole-v1", "Pendulum-v1"], envs_per_task=2, seed=0) as env:
    assert [(t.obs_dim, t.act_dim, t.discrete) for t in env.tasks] == [(4, 2, True), (3, 1, False)]
    steps = _rollout(env, 40)
    assert any(ts.last[:2].any() for ts in steps)   # CartPole under random actions falls within 40 steps
    assert all(ts.obs.shape == (4, 4) and (ts.obs[2:, 3] == 0).all() for ts in steps)


def test_bench_throughput_and_routing():
  from jaxlab.rl.envs import bench
  assert bench.is_gymnax_name("CartPole-v1") and not bench.is_gymnax_name("cartpole-balance")
  env = gx.GymnaxTasks(["c"], 2, make=_fake())
  assert bench.throughput(env, steps=5) > 0



@pytest.mark.parametrize("workers", [0, 2])
def test_dm_control_random_states_restore_at_an_episode_boundary(dmc, workers):
  """Saved after every environment's last step and restored into a fresh batch, the next episodes are those of the
  uninterrupted run, bit for bit (their starts come from the task's random stream)."""
  names = ["cartpole-balance", "cartpole-swingup"]            # one control step of 0.01 s: episodes end together
  kw = dict(envs_per_task=2, seed=2, time_limit=0.05, workers=workers)
  acts = np.random.default_rng(0).uniform(-1, 1, size=(12, 4, 1)).astype(np.float32)
  with dmc.DMControlTasks(names, **kw) as a:
    a.reset()
    for t in range(5):                                  # 5 control steps: the episode ends everywhere
      ts = a.step(acts[t])
    assert ts.last.all()
    states = a.random_states()
    assert len(states) == 4 and states[0]["name"] == "MT19937"
    want = [a.step(acts[5 + t]) for t in range(6)]
  with dmc.DMControlTasks(names, **kw) as b:
    b.reset()
    b.set_random_states(json.loads(json.dumps(states)))   # JSON-able, as a checkpoint's metadata keeps it
    got = [b.step(acts[5 + t]) for t in range(6)]
  assert got[0].first.all()
  for x, y in zip(got, want):
    np.testing.assert_array_equal(x.obs, y.obs)
    np.testing.assert_array_equal(x.reward, y.reward)
  with dmc.DMControlTasks(names, **kw) as c:
    with pytest.raises(ConfigError, match="3 states for a batch of 4"):
      c.set_random_states(states[:3])
