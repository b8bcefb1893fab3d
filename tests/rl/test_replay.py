"""Per-task replay buffer: ring semantics against a Python reference, sampling law, jit, save/load, errors."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from jaxlab import checkpoint
from jaxlab.errors import CheckpointError, ConfigError, DataError
from jaxlab.rl import replay

T, C, OBS, ACT = 3, 8, 3, 2


class Reference:
  """Brute-force model: a Python list of step ids per task; every field of a step is a function of its id."""

  def __init__(self, num_tasks: int = T):
    self.hist = [[] for _ in range(num_tasks)]
    self.next_id = 1

  def rows(self, ids):
    ids = np.asarray(ids, np.int32)
    uid = self.next_id + np.arange(len(ids))
    self.next_id += len(ids)
    for t, u in zip(ids, uid):
      self.hist[t].append(int(u))
    return ids, *self.fields(uid, ids)

  @staticmethod
  def fields(uid, ids):
    uid = np.asarray(uid)
    obs = np.stack([uid, ids, 2 * uid], -1).astype(np.float32)
    action = np.stack([uid, -uid], -1).astype(np.float32)
    return obs, action, uid + np.float32(0.5), (uid % 3 != 0).astype(np.float32), uid % 5 == 0

  def check_sample(self, out, length, capacity=C, rows=256):
    """Every row is `length` consecutive steps of the latest `capacity` steps of its task, in write order.

    The window check runs on the first `rows` rows (rows are i.i.d.); the field check on all of them.
    """
    obs = np.asarray(out["obs"])
    tasks = np.asarray(out["task_id"])
    assert obs.shape == (len(tasks), length, OBS)
    assert np.asarray(out["valid"]).all()
    uid = obs[..., 0].astype(np.int64)
    for row, t in enumerate(tasks[:rows]):
      kept = self.hist[t][-capacity:]
      assert uid[row, 0] in kept, (t, uid[row], kept)
      start = kept.index(uid[row, 0])
      assert kept[start:start + length] == uid[row].tolist(), (t, uid[row], kept)
    want = self.fields(uid.reshape(-1), np.repeat(tasks, length))
    for name, w in zip(replay.STEP_FIELDS, want):
      np.testing.assert_array_equal(np.asarray(out[name]).reshape(w.shape), w, err_msg=name)


def _add_random(state, ref, rng, steps, sizes=(1, 4, 10), num_tasks=T):
  for _ in range(steps):
    b = int(rng.choice(sizes))
    ids = rng.integers(0, num_tasks, b) if rng.random() < 0.7 else np.full(b, rng.integers(0, num_tasks))
    state = replay.add(state, *ref.rows(ids))
  return state


def _check_history(state, ref, capacity=C):
  for t in range(state.num_tasks):
    kept = ref.hist[t][-capacity:]
    h = replay.task_history(state, t)
    assert h["obs"][:, 0].astype(np.int64).tolist() == kept
    for name, w in zip(replay.STEP_FIELDS, ref.fields(np.array(kept, np.int64), np.full(len(kept), t))):
      np.testing.assert_array_equal(h[name], w)
    assert int(state.size[t]) == len(kept)
    assert int(state.pos[t]) == len(ref.hist[t]) % capacity


@pytest.fixture(scope="module")
def filled():
  """A buffer after random adds of several tasks (rings wrapped many times) and its reference."""
  ref = Reference()
  state = _add_random(replay.init(T, C, OBS, ACT), ref, np.random.default_rng(0), steps=30)
  assert all(len(h) > 3 * C for h in ref.hist)
  return state, ref


def test_init_layout():
  s = replay.init(2, 5, (4, 4, 3), (), obs_dtype=jnp.uint8, action_dtype=jnp.int32)
  assert s.obs.shape == (2, 5, 4, 4, 3) and s.obs.dtype == jnp.uint8
  assert s.action.shape == (2, 5) and s.action.dtype == jnp.int32
  assert s.first.dtype == jnp.bool_ and s.size.dtype == s.pos.dtype == jnp.int32
  assert (s.num_tasks, s.capacity, s.obs_shape, s.act_shape) == (2, 5, (4, 4, 3), ())
  assert len(jax.tree.leaves(s)) == len(replay.FIELDS)


def test_ring_wraparound_matches_python_reference(filled):
  state, ref = filled
  _check_history(state, ref)


@pytest.mark.parametrize("length", [1, 4, C])
def test_sampled_sequences_are_contiguous_latest_history(filled, length):
  state, ref = filled
  out = replay.sample_sequences(state, jax.random.key(length), 128, length)
  ref.check_sample(out, length)
  if length == C:    # full rings hold exactly one window: the whole stored history
    for row, t in enumerate(np.asarray(out["task_id"])):
      assert np.asarray(out["obs"])[row, :, 0].tolist() == ref.hist[t][-C:]


def test_partially_filled_ring_and_window_starts_uniform():
  ref = Reference()
  state = replay.init(T, C, OBS, ACT)                                 # only task 0 gets data
  state = replay.add(state, *ref.rows(np.zeros(4, np.int32)))          # not full: slots 0..3
  out = replay.sample_sequences(state, jax.random.key(1), 128, 4)
  ref.check_sample(out, 4)
  state = replay.add(state, *ref.rows(np.zeros(10, np.int32)))         # full, oldest at pos 6
  assert (int(state.size[0]), int(state.pos[0])) == (C, 6)
  n, length = 6000, 3
  out = replay.sample_sequences(state, jax.random.key(2), n, length)
  ref.check_sample(out, length)
  starts = np.asarray(out["obs"])[:, 0, 0].astype(int) - ref.hist[0][-C]
  counts = np.bincount(starts, minlength=C - length + 1)
  assert counts.size == C - length + 1             # no window wraps from the newest step to the oldest
  expected = n / counts.size
  assert ((counts - expected) ** 2 / expected).sum() < 20.5    # chi-square, 5 dof, p ~ 0.001


batches = st.lists(st.sampled_from([1, 4, 10]).flatmap(
    lambda b: st.lists(st.integers(0, T - 1), min_size=b, max_size=b)), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_property_any_add_order_matches_reference(rows):
  ref = Reference()
  state = replay.init(T, C, OBS, ACT)
  for ids in rows:
    state = replay.add(state, *ref.rows(ids))
  _check_history(state, ref)
  nonempty = [t for t in range(T) if ref.hist[t]]
  out = replay.sample_sequences(state, jax.random.key(len(rows)), 16, 1)
  assert set(np.asarray(out["task_id"]).tolist()) <= set(nonempty)
  ref.check_sample(out, 1)


def test_add_sequence_and_overflow_within_one_call():
  ref = Reference()
  state = replay.init(T, C, OBS, ACT)
  _, obs, action, reward, discount, _ = ref.rows(np.full(10, 1))           # 10 > C steps in one call
  state = replay.add_sequence(state, 1, obs, action, reward, discount)
  h = replay.task_history(state, 1)
  assert h["obs"][:, 0].tolist() == ref.hist[1][-C:]
  assert not h["first"].any()                     # first=True only on step 0, which was overwritten
  assert int(state.size[0]) == 0 and int(state.size[1]) == C and int(state.pos[1]) == 10 % C
  state = replay.add_sequence(state, 2, obs[:4], action[:4], reward[:4], discount[:4])
  assert replay.task_history(state, 2)["first"].tolist() == [True, False, False, False]


def test_task_weights_respected():
  ref = Reference()
  state = replay.init(T, C, OBS, ACT)
  for t in range(T):
    state = replay.add_sequence(state, t, *ref.rows(np.full(10, t))[1:])
  n, w = 20000, np.array([1.0, 3.0, 6.0])
  out = replay.sample_sequences(state, jax.random.key(3), n, 2, task_weights=w)
  counts = np.bincount(np.asarray(out["task_id"]), minlength=T)
  expected = n * w / w.sum()
  assert ((counts - expected) ** 2 / expected).sum() < 13.8    # chi-square, 2 dof, p = 0.001
  ref.check_sample(out, 2)
  out = replay.sample_sequences(state, jax.random.key(4), n, 2, task_weights=jnp.array([0.0, 1.0, 1.0]))
  counts = np.bincount(np.asarray(out["task_id"]), minlength=T)
  assert counts[0] == 0 and abs(counts[1] - n / 2) < 4 * np.sqrt(n / 4)


def test_default_weights_skip_tasks_with_too_few_steps():
  ref = Reference()
  state = replay.init(T, C, OBS, ACT)
  for t, n in ((0, 10), (1, 1), (2, 4)):
    state = replay.add_sequence(state, t, *ref.rows(np.full(n, t))[1:])
  out = replay.sample_sequences(state, jax.random.key(5), 6000, 4)
  counts = np.bincount(np.asarray(out["task_id"]), minlength=T)
  assert counts[1] == 0 and abs(counts[0] - 3000) < 4 * np.sqrt(1500)
  ref.check_sample(out, 4)


def test_add_and_sample_under_jit_equal_eager(filled):
  state, _ = filled
  ref = Reference()
  ref.next_id = 10_000
  rows = ref.rows(np.array([2, 0, 2, 2, 2, 2, 2, 2, 2, 2]))   # 9 rows of task 2 > C
  eager = replay.add(state, *rows)
  jitted = jax.jit(replay.add)(state, *map(jnp.asarray, rows))
  for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
    assert a.dtype == b.dtype and np.array_equal(a, b)
  key = jax.random.key(6)
  w = jnp.array([1.0, 2.0, 3.0])
  sample = jax.jit(replay.sample_sequences, static_argnames=("batch", "length"))
  a = replay.sample_sequences(eager, key, 32, 3, task_weights=w)
  b = sample(eager, key, batch=32, length=3, task_weights=w)
  for k in a:
    assert np.array_equal(a[k], b[k]), k
  m1 = replay.mixed_batch(eager, key, 6, 2)
  m2 = jax.jit(replay.mixed_batch, static_argnames=("batch", "length"))(eager, key, batch=6, length=2)
  for k in m1:
    assert np.array_equal(m1[k], m2[k]), k


def test_under_jit_data_dependent_cases_do_not_raise():
  ref = Reference()
  state = replay.init(T, C, OBS, ACT)
  state = replay.add_sequence(state, 0, *ref.rows(np.zeros(4, np.int32))[1:])
  state = replay.add_sequence(state, 1, *ref.rows(np.ones(1, np.int32))[1:])
  bad = Reference.fields(np.array([7, 8]), np.array([5, -1]))
  after = jax.jit(replay.add)(state, jnp.array([5, -1]), *bad)            # out-of-range rows are dropped
  for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(state)):
    assert np.array_equal(a, b)
  sample = jax.jit(replay.sample_sequences, static_argnames=("batch", "length"))
  out = sample(state, jax.random.key(0), batch=64, length=3, task_weights=jnp.array([1.0, 5.0, 0.0]))
  assert (np.asarray(out["task_id"]) == 0).all() and np.asarray(out["valid"]).all()   # task 1 renormalised away
  ref.check_sample(out, 3)
  out = sample(state, jax.random.key(0), batch=2, length=3, tasks=jnp.array([0, 1]))
  assert np.asarray(out["valid"]).tolist() == [True, False]


def test_mixed_batch_rows_per_task(filled):
  state, ref = filled
  out = replay.mixed_batch(state, jax.random.key(7), 12, 3)
  assert np.asarray(out["task_id"]).tolist() == [0] * 4 + [1] * 4 + [2] * 4
  ref.check_sample(out, 3)
  t = replay.sample_transitions(state, jax.random.key(8), 9, tasks=jnp.array([2, 1, 0] * 3))
  assert t["obs"].shape == (9, OBS) and t["action"].shape == (9, ACT) and t["first"].shape == (9,)
  assert (np.asarray(t["obs"])[:, 1] == np.asarray(t["task_id"])).all()
  with pytest.raises(ConfigError, match="divisible"):
    replay.mixed_batch(state, jax.random.key(7), 10, 3)


def test_save_load_round_trip_bit_exact(tmp_path):
  ref = Reference()
  state = replay.init(T, C, OBS, ACT, obs_dtype=jnp.bfloat16)
  state = _add_random(state, ref, np.random.default_rng(1), steps=6, sizes=(4,))
  path = str(tmp_path / "buf" / "replay.npz")
  replay.save(path, state)
  replay.save(path, state)                        # overwrite in place
  assert os.listdir(tmp_path / "buf") == ["replay.npz"]   # no temporary file left
  loaded = replay.load(path)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(loaded)):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  rows = ref.rows(np.array([0, 1, 1, 2]))         # a resumed buffer continues identically
  a, b = replay.add(state, *rows), replay.add(loaded, *rows)
  key = jax.random.key(9)
  sa, sb = replay.sample_sequences(a, key, 8, 2), replay.sample_sequences(b, key, 8, 2)
  assert all(np.array_equal(sa[k], sb[k]) for k in sa)
  (tmp_path / "bad.npz").write_bytes(b"not a zip")
  with pytest.raises(CheckpointError, match="damaged"):
    replay.load(str(tmp_path / "bad.npz"))
  with pytest.raises(CheckpointError, match="does not exist"):
    replay.load(str(tmp_path / "missing.npz"))


def test_state_checkpoints_with_a_run(tmp_path, filled):
  state, _ = filled
  ck = checkpoint.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  ck.save(3, {"replay": state}, force=True)
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), {"replay": state})
  items, _ = ck.restore(3, target)
  ck.close()
  restored = checkpoint.from_items(items, target)["replay"]
  assert isinstance(restored, replay.ReplayState)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
    assert a.dtype == b.dtype and np.array_equal(a, b)


def _one_line(excinfo):
  assert "\n" not in str(excinfo.value)


def test_errors(filled):
  state, _ = filled
  ok = Reference.fields(np.array([1, 2]), np.array([0, 1]))
  ids = np.array([0, 1])
  bad_shapes = [
      (ids, ok[0][:, :2], *ok[1:]),                                        # obs dim
      (ids, *ok[:2], ok[2][:1], *ok[3:]),                                  # reward rows
      (ids[:, None], *ok),                                                 # task_id not (B,)
  ]
  for args in bad_shapes:
    with pytest.raises(DataError) as e:
      replay.add(state, *args)
    _one_line(e)
  with pytest.raises(DataError, match="out of range"):
    replay.add(state, np.array([0, T]), *ok)
  with pytest.raises(DataError, match="integers"):
    replay.add(state, np.array([0.0, 1.0]), *ok)

  small = replay.init(T, C, OBS, ACT)
  small = replay.add_sequence(small, 0, *Reference().rows(np.zeros(4, np.int32))[1:])
  key = jax.random.key(0)
  cases = [
      (dict(batch=2, length=3, tasks=np.array([0, 1])), "task 1 has 0 stored steps"),
      (dict(batch=2, length=3, task_weights=np.array([1.0, 1.0, 0.0])), "task 1 has weight 1"),
      (dict(batch=2, length=5), "no task has 5 stored steps"),
      (dict(batch=2, length=C + 1), "exceeds the buffer capacity"),
      (dict(batch=2, length=0), "length must be a positive int"),
      (dict(batch=2, length=2, task_weights=np.ones(T + 1)), r"shape \(3,\)"),
      (dict(batch=2, length=2, task_weights=-np.ones(T)), ">= 0"),
      (dict(batch=2, length=2, tasks=np.array([0])), r"shape \(2,\)"),
      (dict(batch=2, length=2, tasks=np.array([0, 0]), task_weights=np.ones(T)), "not both"),
  ]
  for kw, msg in cases:
    with pytest.raises(ConfigError, match=msg) as e:
      replay.sample_sequences(small, key, **kw)
    _one_line(e)
  with pytest.raises(ConfigError, match="task 1 has 0 stored steps"):
    replay.mixed_batch(small, key, 3, 2)
  with pytest.raises(ConfigError):
    replay.init(0, C, OBS, ACT)


def test_per_step_extras_are_stored_sampled_and_written_back(tmp_path):
  """Extras ride with their step: sampled at the window's slots, written back by `update_extra`, saved and loaded;
  a buffer without extras samples exactly the keys it always did."""
  buf = replay.init(2, 6, OBS, ACT, extras={"deter": (4,)})
  assert set(buf.extra) == {"deter"} and buf.extra["deter"].shape == (2, 6, 4)
  rng = np.random.default_rng(0)
  for step in range(9):                                       # task 0 wraps its ring (9 > 6), task 1 does not
    ids = np.asarray([0, 1] if step < 5 else [0], np.int32)
    b = len(ids)
    deter = (100 * ids[:, None] + step + np.arange(4)[None] / 10).astype(np.float32)
    buf = replay.add(buf, ids, rng.normal(size=(b, OBS)), rng.normal(size=(b, ACT)), np.full(b, float(step)),
                     np.ones(b), np.zeros(b, bool), extra={"deter": deter})
  out = replay.sample_sequences(buf, jax.random.key(0), 4, 3, tasks=jnp.asarray([0, 0, 1, 1]))
  # each step's extra is its own: deter[..., 0] = 100 * task + the step that wrote it = 100 * task + reward
  np.testing.assert_array_equal(out["extra"]["deter"][..., 0], 100 * out["task_id"][:, None] + out["reward"])
  np.testing.assert_array_equal(np.asarray(buf.reward)[np.asarray(out["task_id"])[:, None], out["slot"]],
                                out["reward"])
  new = -np.ones((4, 3, 4), np.float32)
  buf2 = replay.update_extra(buf, out["task_id"], out["slot"], {"deter": new})
  again = replay.sample_sequences(buf2, jax.random.key(0), 4, 3, tasks=jnp.asarray([0, 0, 1, 1]))
  np.testing.assert_array_equal(again["extra"]["deter"], new)
  assert int(np.sum(np.asarray(buf2.extra["deter"]) == -1)) == 4 * len({(int(t), int(s)) for t, row in zip(
      out["task_id"], out["slot"]) for s in row})              # only the sampled steps changed
  jit = jax.jit(lambda s: replay.sample_sequences(s, jax.random.key(0), 4, 3, tasks=jnp.asarray([0, 0, 1, 1])))(buf)
  for k in ("slot", "reward"):
    np.testing.assert_array_equal(jit[k], out[k])
  path = str(tmp_path / "buf.npz")
  replay.save(path, buf2)
  back = replay.load(path)
  np.testing.assert_array_equal(back.extra["deter"], buf2.extra["deter"])
  assert replay.task_history(back, 1)["extra/deter"].shape == (5, 4)
  plain = replay.init(2, 6, OBS, ACT)
  plain = replay.add(plain, np.asarray([0]), np.zeros((1, OBS)), np.zeros((1, ACT)), np.zeros(1), np.ones(1),
                     np.ones(1, bool))
  assert set(replay.sample_sequences(plain, jax.random.key(0), 2, 1)) == {
      "obs", "action", "reward", "discount", "first", "task_id", "valid"}
  with pytest.raises(DataError, match="buffer stores \\['deter'\\] per step"):
    replay.add(buf, np.asarray([0]), np.zeros((1, OBS)), np.zeros((1, ACT)), np.zeros(1), np.ones(1),
               np.ones(1, bool))
  with pytest.raises(DataError, match="extra 'deter' has shape"):
    replay.add(buf, np.asarray([0]), np.zeros((1, OBS)), np.zeros((1, ACT)), np.zeros(1), np.ones(1),
               np.ones(1, bool), extra={"deter": np.zeros((1, 3))})
  with pytest.raises(DataError, match="no extra \\['stoch'\\]"):
    replay.update_extra(buf, out["task_id"], out["slot"], {"stoch": new})
