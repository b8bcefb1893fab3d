"""A replay buffer per task for multi-task model-based RL: pure functions over a pytree of arrays.

Layout. `ReplayState` holds one ring buffer per task, stacked on a leading task axis (T tasks, capacity C
steps per task):

  obs (T, C, *obs_shape)   action (T, C, *act_shape)   reward (T, C)   discount (T, C)   first (T, C) bool
  size (T,) int32: steps stored for the task (<= C)    pos (T,) int32: slot the task's next step is written to

A task's stored history, oldest first, is the slots `(pos - size + k) % C` for k = 0 .. size-1: before the
ring is full that is slots 0 .. size-1; once full, the oldest step sits at `pos` and each new step
overwrites it. Only the latest C steps of a task are kept.

Semantics of a step. The buffer stores rows as given and does not pair them up; the convention of the world
model applies. The DreamerV3 one: row t holds the observation o_t, the action taken at o_t (or the one that
led to it, if the model is written that way), the reward and discount that came with o_t, and
`first[t] = True` when o_t begins an episode (its reward and action are then placeholders).

Sequences cross episode boundaries. `sample_sequences` draws windows of `length` consecutive stored steps
of one task; a window may contain the end of one episode and the start of the next, and `first` marks where
the new one starts (the world model resets its recurrent state there), as in DreamerV3's replay. A window
never wraps from the newest step to the oldest one: every window is `length` steps in write order within
the task's stored history. The oldest stored step can be in the middle of an episode (its start was
overwritten), so row 0 of a window need not have `first` set; models start each window from a fresh state.

Pytree, jit, checkpoints. Every function is pure and the state is a pytree of arrays, so it can be part of a
jaxlab run's checkpointed state (e.g. a field of the state pytree given to `jaxlab.checkpoint.Checkpointer`,
restored with the rest of the run, so a resumed run continues with the same buffer) and all of `add`,
`add_sequence`, `sample_sequences`, `sample_transitions` and `mixed_batch` run inside `jax.jit` (`batch`
and `length` static). Called eagerly they check their arguments against the stored data and raise one-line
errors (`ConfigError` for bad arguments, `DataError` for badly shaped data). Under jit only shapes are
checked; the data-dependent cases then behave as documented on each function. For a buffer kept outside
a run, `save` / `load` write and read one .npz file atomically.

Memory: C * T * (prod(obs_shape) + ...) elements live on the device; store pixel observations as uint8
(`init(..., obs_dtype=jnp.uint8)`). Jit `add` with `donate_argnums=0` to update the buffer in place.

Per-step extras (`init(..., extras={"deter": (512,)})`): named float arrays stored beside each step, e.g. the
recurrent latent the agent computed when it acted, which DreamerV3 keeps with its replay (danijar/dreamerv3,
`replay_context`) so that a window can start from the stored latent instead of a zero state. `add` then takes
`extra={name: (B, *shape)}`; `sample_sequences` also returns `slot` (batch, length), the ring slots of the window,
and `extra` {name: (batch, length, *shape)}; `update_extra` writes fresh values back to those slots. A buffer
without extras behaves, and samples, exactly as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import CheckpointError, ConfigError, DataError

FORMAT_VERSION = 1
FIELDS = ("obs", "action", "reward", "discount", "first", "size", "pos")
STEP_FIELDS = ("obs", "action", "reward", "discount", "first")

Shape = int | Sequence[int]


@flax.struct.dataclass
class ReplayState:
  """Per-task ring buffers (a pytree of arrays; see the module docstring for the layout).

  Attributes:
    obs: (T, C, *obs_shape) observations.
    action: (T, C, *act_shape) actions.
    reward: (T, C) rewards.
    discount: (T, C) discounts (0 at a terminal step).
    first: (T, C) bool, True where an episode starts.
    size: (T,) int32, number of stored steps of each task (at most C).
    pos: (T,) int32, slot of each task's next write.
    extra: {name: (T, C, *shape)} per-step extras (empty unless `init` was given some).
  """
  obs: jax.Array
  action: jax.Array
  reward: jax.Array
  discount: jax.Array
  first: jax.Array
  size: jax.Array
  pos: jax.Array
  extra: dict = dataclasses.field(default_factory=dict)

  @property
  def num_tasks(self) -> int:
    return self.size.shape[0]

  @property
  def capacity(self) -> int:
    return self.reward.shape[1]

  @property
  def obs_shape(self) -> tuple[int, ...]:
    return tuple(self.obs.shape[2:])

  @property
  def act_shape(self) -> tuple[int, ...]:
    return tuple(self.action.shape[2:])


def _shape(dim: Shape, what: str) -> tuple[int, ...]:
  shape = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
  if not all(isinstance(d, (int, np.integer)) and d >= 1 for d in shape):
    raise ConfigError(f"{what} must be a positive int or a tuple of positive ints, got {dim!r}")
  return tuple(int(d) for d in shape)


def init(num_tasks: int, capacity: int, obs_dim: Shape, act_dim: Shape, *, obs_dtype: Any = jnp.float32,
         action_dtype: Any = jnp.float32, reward_dtype: Any = jnp.float32,
         extras: dict[str, Shape] | None = None) -> ReplayState:
  """An empty buffer of `num_tasks` rings of `capacity` steps each.

  Args:
    num_tasks: T, number of tasks (task ids are 0 .. T-1).
    capacity: C, steps kept per task (the oldest are overwritten).
    obs_dim: observation size, or a shape tuple (e.g. (64, 64, 3) for pixels).
    act_dim: action size, or a shape tuple (() for a scalar discrete action).
    obs_dtype, action_dtype: stored dtypes (e.g. jnp.uint8 pixels, jnp.int32 discrete actions).
    reward_dtype: dtype of reward and discount.
    extras: optional {name: shape} of float32 arrays stored per step (see the module docstring).
  """
  for name, v in (("num_tasks", num_tasks), ("capacity", capacity)):
    if not isinstance(v, (int, np.integer)) or v < 1:
      raise ConfigError(f"{name} must be a positive int, got {v!r}")
  obs_shape = _shape(obs_dim, "obs_dim")
  act_shape = _shape(act_dim, "act_dim")
  t, c = int(num_tasks), int(capacity)
  extra = {str(k): jnp.zeros((t, c, *_shape(v, f"extras[{k!r}]")), jnp.float32) for k, v in (extras or {}).items()}
  return ReplayState(obs=jnp.zeros((t, c, *obs_shape), obs_dtype), action=jnp.zeros((t, c, *act_shape), action_dtype),
                     reward=jnp.zeros((t, c), reward_dtype), discount=jnp.zeros((t, c), reward_dtype),
                     first=jnp.zeros((t, c), bool), size=jnp.zeros((t,), jnp.int32), pos=jnp.zeros((t,), jnp.int32),
                     extra=extra)


def _concrete(x: Any) -> np.ndarray | None:
  """x as numpy when it is a concrete value, None when it is traced (inside jit / vmap / grad)."""
  if isinstance(x, jax.core.Tracer):
    return None
  return np.asarray(x)


def _check_extra(state: ReplayState, extra, lead: tuple[int, ...]) -> None:
  """`extra` must name exactly the buffer's extras, each of shape lead + the extra's shape."""
  names = set(extra or {})
  if names != set(state.extra):
    raise DataError(f"extra names {sorted(names)}, but the buffer stores {sorted(state.extra)} per step "
                    "(replay.init(..., extras=...))")
  for k, v in (extra or {}).items():
    want = lead + tuple(state.extra[k].shape[2:])
    if tuple(jnp.shape(v)) != want:
      raise DataError(f"extra {k!r} has shape {tuple(jnp.shape(v))}, expected {want}")


def _check_rows(state: ReplayState, task_id, obs, action, reward, discount, first) -> int:
  if jnp.ndim(task_id) != 1:
    raise DataError(f"task_id must have shape (B,), got {jnp.shape(task_id)}")
  b = jnp.shape(task_id)[0]
  expected = {"obs": (b, *state.obs_shape), "action": (b, *state.act_shape), "reward": (b,), "discount": (b,),
              "first": (b,)}
  for name, x in zip(STEP_FIELDS, (obs, action, reward, discount, first)):
    if tuple(jnp.shape(x)) != expected[name]:
      raise DataError(f"{name} has shape {tuple(jnp.shape(x))}, expected {expected[name]} "
                      f"({b} rows as in task_id)")
  if not jnp.issubdtype(jnp.result_type(task_id), jnp.integer):
    raise DataError(f"task_id must be integers, got dtype {jnp.result_type(task_id)}")
  ids = _concrete(task_id)
  if ids is not None and ids.size and (ids.min() < 0 or ids.max() >= state.num_tasks):
    bad = ids[(ids < 0) | (ids >= state.num_tasks)][0]
    raise DataError(f"task_id {bad} is out of range; the buffer has tasks 0..{state.num_tasks - 1}")
  return b


@jax.jit
def _add(state: ReplayState, task_id, obs, action, reward, discount, first, extra) -> ReplayState:
  t_n, cap = state.num_tasks, state.capacity
  b = task_id.shape[0]
  task_id = task_id.astype(jnp.int32)
  ok = (task_id >= 0) & (task_id < t_n)
  t = jnp.where(ok, task_id, t_n)                         # out-of-range rows (only possible under jit): dropped
  # rank[i] = number of earlier rows of the same task: stable sort by task, offset from the group's start.
  order = jnp.argsort(t, stable=True)
  ts = t[order]
  rank_sorted = jnp.arange(b, dtype=jnp.int32) - jnp.searchsorted(ts, ts, side="left").astype(jnp.int32)
  rank = jnp.zeros((b,), jnp.int32).at[order].set(rank_sorted)
  count = jnp.zeros((t_n + 1,), jnp.int32).at[t].add(1)[:t_n]
  tc = jnp.minimum(t, t_n - 1)
  # Only the last C rows of a task in this batch survive; writing only those makes every slot unique, so the
  # scatter is exact (duplicate scatter indices would have no defined order).
  keep = ok & (rank >= count[tc] - cap)
  slot = (state.pos[tc] + rank) % cap
  ti = jnp.where(keep, t, t_n)                            # index T is out of bounds: mode="drop" skips the row
  new = dict(obs=obs, action=action, reward=reward, discount=discount, first=first)
  upd = {k: getattr(state, k).at[ti, slot].set(v.astype(getattr(state, k).dtype), mode="drop")
         for k, v in new.items()}
  if state.extra:
    upd["extra"] = {k: state.extra[k].at[ti, slot].set(extra[k].astype(jnp.float32), mode="drop")
                    for k in state.extra}
  return state.replace(**upd, size=jnp.minimum(state.size + count, cap).astype(jnp.int32),
                       pos=((state.pos + count) % cap).astype(jnp.int32))


def add(state: ReplayState, task_id, obs, action, reward, discount, first, extra=None) -> ReplayState:
  """Appends one step per row to the ring of its task; rows of the same task are written in row order.

  Args:
    state: the buffer.
    task_id: (B,) int task of each row; several rows may share a task.
    obs: (B, *obs_shape); action: (B, *act_shape); reward, discount: (B,); first: (B,) bool.
      Values are cast to the buffer's dtypes.
    extra: {name: (B, *shape)} for every extra of the buffer (none when it has none).

  Returns:
    The new state. When a task gets more than C rows in one call only its last C are kept, exactly as if
    they had been added one by one. Eagerly an out-of-range task id raises DataError; under jit such rows
    are dropped.
  """
  b = _check_rows(state, task_id, obs, action, reward, discount, first)
  _check_extra(state, extra, (b,))
  return _add(state, jnp.asarray(task_id), jnp.asarray(obs), jnp.asarray(action), jnp.asarray(reward),
              jnp.asarray(discount), jnp.asarray(first), {k: jnp.asarray(v) for k, v in (extra or {}).items()})


def add_sequence(state: ReplayState, task_id: int | jax.Array, obs, action, reward, discount,
                 first=None) -> ReplayState:
  """Appends a trajectory of L steps of one task (`add` with task_id repeated L times).

  Args:
    task_id: the task (int or scalar array).
    obs: (L, *obs_shape); action: (L, *act_shape); reward, discount: (L,).
    first: (L,) bool; default: True at step 0 only (a trajectory that starts an episode).
  """
  if jnp.ndim(task_id) != 0:
    raise DataError(f"add_sequence takes one task id (a scalar), got shape {jnp.shape(task_id)}; use add for rows "
                    "of several tasks")
  if jnp.ndim(obs) < 1:
    raise DataError("obs must have a leading time axis (L, *obs_shape)")
  n = jnp.shape(obs)[0]
  if first is None:
    first = jnp.arange(n) == 0
  return add(state, jnp.full((n,), task_id, jnp.int32), obs, action, reward, discount, first)


def _check_sample_args(state: ReplayState, batch: int, length: int, task_weights, tasks) -> None:
  for name, v in (("batch", batch), ("length", length)):
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
      raise ConfigError(f"{name} must be a positive int, got {v!r}")
  if length > state.capacity:
    raise ConfigError(f"length {length} exceeds the buffer capacity {state.capacity} per task")
  if task_weights is not None and tasks is not None:
    raise ConfigError("give task_weights or tasks, not both")
  t_n = state.num_tasks
  sizes = _concrete(state.size)
  if tasks is not None:
    if tuple(jnp.shape(tasks)) != (batch,):
      raise ConfigError(f"tasks must have shape ({batch},) (one task per row), got {tuple(jnp.shape(tasks))}")
    ids = _concrete(tasks)
    if ids is not None:
      if ids.min() < 0 or ids.max() >= t_n:
        raise ConfigError(f"tasks holds ids outside 0..{t_n - 1}")
      if sizes is not None and (sizes[ids] < length).any():
        bad = int(ids[sizes[ids] < length][0])
        raise ConfigError(f"task {bad} has {sizes[bad]} stored steps, fewer than length {length}; add more data "
                          "or sample shorter sequences")
    return
  if task_weights is not None:
    if tuple(jnp.shape(task_weights)) != (t_n,):
      raise ConfigError(f"task_weights must have shape ({t_n},) (one weight per task), got "
                        f"{tuple(jnp.shape(task_weights))}")
    w = _concrete(task_weights)
    if w is not None:
      if not np.isfinite(w).all() or (w < 0).any() or not (w > 0).any():
        raise ConfigError(f"task_weights must be finite, >= 0 and not all 0, got {w.tolist()}")
      if sizes is not None and ((w > 0) & (sizes < length)).any():
        bad = int(np.flatnonzero((w > 0) & (sizes < length))[0])
        raise ConfigError(f"task {bad} has weight {w[bad]:g} but {sizes[bad]} stored steps, fewer than length "
                          f"{length}; add more data, give it weight 0 or sample shorter sequences")
      return
  if sizes is not None and not (sizes >= length).any():
    raise ConfigError(f"no task has {length} stored steps (sizes {sizes.tolist()}); add more data or sample "
                      "shorter sequences")


def _sample(state: ReplayState, key: jax.Array, batch: int, length: int, task_weights, tasks) -> dict:
  k_task, k_start = jax.random.split(key)
  if tasks is None:
    eligible = state.size >= length
    w = jnp.ones((state.num_tasks,), jnp.float32) if task_weights is None else task_weights.astype(jnp.float32)
    w = jnp.where(eligible & (w > 0), w, 0.0)
    logits = jnp.where(w > 0, jnp.log(jnp.where(w > 0, w, 1.0)), -jnp.inf)
    tasks = jax.random.categorical(k_task, logits, shape=(batch,))
  tasks = tasks.astype(jnp.int32)
  n = state.size[tasks]
  valid = n >= length
  start = jax.random.randint(k_start, (batch,), 0, jnp.maximum(n - length + 1, 1))   # offset in the history
  slots = (state.pos[tasks] - n + start)[:, None] + jnp.arange(length, dtype=jnp.int32)
  slots = slots % state.capacity
  out = {k: getattr(state, k)[tasks[:, None], slots] for k in STEP_FIELDS}
  if state.extra:
    out["slot"] = slots
    out["extra"] = {k: v[tasks[:, None], slots] for k, v in state.extra.items()}
  return {**out, "task_id": tasks, "valid": valid}


_sample_jit = jax.jit(_sample, static_argnames=("batch", "length"))


def sample_sequences(state: ReplayState, key: jax.Array, batch: int, length: int, task_weights=None,
                     tasks=None) -> dict[str, jax.Array]:
  """Draws `batch` windows of `length` consecutive stored steps, each of one task.

  The task of each row is `tasks[row]` when `tasks` is given, else drawn with probability proportional to
  `task_weights` (default: uniform over the tasks holding at least `length` steps). The window start is then
  uniform over the `size - length + 1` windows of that task's history (write order, latest C steps only; a
  window never wraps from the newest step to the oldest). Windows may span episode boundaries; `first`
  marks the steps that start an episode.

  Args:
    state: the buffer.
    key: PRNG key.
    batch: number of rows (static under jit).
    length: steps per row, 1 <= length <= capacity (static under jit).
    task_weights: optional (T,) non-negative weights (need not sum to 1).
    tasks: optional (batch,) int task of every row (excludes task_weights).

  Returns:
    dict with obs (batch, length, *obs_shape), action (batch, length, *act_shape), reward, discount, first
    (batch, length), task_id (batch,) int32 and valid (batch,) bool: True when the row's task held at least
    `length` steps. Eagerly, a row that would be invalid raises ConfigError instead (a task in `tasks` or
    with positive weight holding fewer than `length` steps, or no task holding that many). Under jit tasks
    with too few steps are left out of the draw (weights renormalised over the others) and rows come back
    with valid False only when no task is eligible or when `tasks` names such a task (their content is then
    meaningless). With per-step extras also slot (batch, length) int32, the ring slots of each row, and extra
    {name: (batch, length, *shape)}.
  """
  _check_sample_args(state, batch, length, task_weights, tasks)
  return _sample_jit(state, key, int(batch), int(length), None if task_weights is None else jnp.asarray(task_weights),
                     None if tasks is None else jnp.asarray(tasks))


def sample_transitions(state: ReplayState, key: jax.Array, batch: int, task_weights=None,
                       tasks=None) -> dict[str, jax.Array]:
  """Single stored steps: `sample_sequences` with length 1, the time axis squeezed.

  Returns obs (batch, *obs_shape), action (batch, *act_shape), reward, discount, first (batch,), task_id and
  valid (batch,). For (o_t, a_t, r, o_t+1) pairs sample sequences of length 2 and drop rows whose
  `first[:, 1]` is set (the second step begins another episode).
  """
  out = sample_sequences(state, key, batch, 1, task_weights=task_weights, tasks=tasks)
  out = {k: (v[:, 0] if k in STEP_FIELDS + ("slot",) else v) for k, v in out.items()}
  if "extra" in out:
    out["extra"] = {k: v[:, 0] for k, v in out["extra"].items()}
  return out


@jax.jit
def _update_extra(state: ReplayState, task_id, slot, values) -> ReplayState:
  t = jnp.broadcast_to(task_id.astype(jnp.int32).reshape((-1,) + (1,) * (slot.ndim - 1)), slot.shape)
  return state.replace(extra={k: v.at[t, slot].set(values[k].astype(jnp.float32)) if k in values else v
                              for k, v in state.extra.items()})


def update_extra(state: ReplayState, task_id, slot, values: dict) -> ReplayState:
  """Writes per-step extras back to stored steps: `values[name][i, ...]` to task `task_id[i]`'s slots `slot[i]`
  (the `task_id` and `slot` of a `sample_sequences` batch: (B,) and (B, L), values (B, L, *shape)). Names may be
  a subset of the buffer's extras. Where two rows name the same step, which row's value is kept is unspecified:
  pass equal values there (as a window's recomputed latents of the same step are, up to the window's start)."""
  if jnp.ndim(task_id) != 1 or jnp.ndim(slot) < 1 or jnp.shape(slot)[0] != jnp.shape(task_id)[0]:
    raise DataError(f"update_extra: task_id (B,) and slot (B, ...) with the same B, got {jnp.shape(task_id)} and "
                    f"{jnp.shape(slot)}")
  unknown = set(values) - set(state.extra)
  if unknown:
    raise DataError(f"update_extra: the buffer stores no extra {sorted(unknown)} (it has {sorted(state.extra)})")
  for k, v in values.items():
    want = tuple(jnp.shape(slot)) + tuple(state.extra[k].shape[2:])
    if tuple(jnp.shape(v)) != want:
      raise DataError(f"update_extra: {k!r} has shape {tuple(jnp.shape(v))}, expected {want}")
  return _update_extra(state, jnp.asarray(task_id), jnp.asarray(slot), {k: jnp.asarray(v) for k, v in values.items()})


def mixed_batch(state: ReplayState, key: jax.Array, batch: int, length: int) -> dict[str, jax.Array]:
  """A batch with `batch // T` rows of every task, rows sorted by task (task 0 first), for multi-task training.

  Same output as `sample_sequences`. Raises ConfigError when `batch` is not a multiple of the number of tasks
  or (eagerly) when a task holds fewer than `length` steps.
  """
  t_n = state.num_tasks
  if not isinstance(batch, (int, np.integer)) or batch < 1 or batch % t_n:
    raise ConfigError(f"mixed_batch needs a batch divisible by the number of tasks {t_n}, got {batch!r}")
  tasks = jnp.repeat(jnp.arange(t_n, dtype=jnp.int32), batch // t_n)
  return sample_sequences(state, key, batch, length, tasks=tasks)


def task_history(state: ReplayState, task_id: int) -> dict[str, np.ndarray]:
  """Host copy of the stored steps of one task, oldest first: {obs, action, reward, discount, first}."""
  if not 0 <= task_id < state.num_tasks:
    raise ConfigError(f"task_id {task_id} is out of range; the buffer has tasks 0..{state.num_tasks - 1}")
  n, pos = int(state.size[task_id]), int(state.pos[task_id])
  slots = (pos - n + np.arange(n)) % state.capacity
  out = {k: np.asarray(getattr(state, k)[task_id])[slots] for k in STEP_FIELDS}
  out.update({f"extra/{k}": np.asarray(v[task_id])[slots] for k, v in state.extra.items()})
  return out


def save(path: str, state: ReplayState) -> None:
  """Writes the buffer to one .npz file atomically (a temporary file in the same folder, then os.replace).

  Inside a jaxlab run, make the state part of the checkpointed pytree instead; this is for buffers kept
  outside a run (e.g. a dataset collected once and reused).
  """
  arrays = {k: np.asarray(jax.device_get(getattr(state, k))) for k in FIELDS}
  arrays.update({f"extra/{k}": np.asarray(jax.device_get(v)) for k, v in state.extra.items()})
  dtypes = {k: str(v.dtype) for k, v in arrays.items()}
  # Dtypes numpy's .npz cannot name (bfloat16 etc.) are stored as raw unsigned ints and viewed back on load.
  arrays = {k: (v.view(f"u{v.dtype.itemsize}") if v.dtype.kind == "V" else v) for k, v in arrays.items()}
  meta = json.dumps({"format": "jaxlab.rl.replay", "version": FORMAT_VERSION, "dtypes": dtypes})
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez(f, meta=np.array(meta), **arrays)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def load(path: str) -> ReplayState:
  """Reads a buffer written by `save` (raises CheckpointError when missing, damaged or inconsistent)."""
  if not os.path.exists(path):
    raise CheckpointError(f"replay buffer file {path} does not exist")
  try:
    with np.load(path, allow_pickle=False) as z:
      meta = json.loads(str(z["meta"]))
      arrays = {k: z[k] for k in FIELDS}
      extra = {k[len("extra/"):]: z[k] for k in z.files if k.startswith("extra/")}
  except Exception as e:  # zipfile, KeyError, ValueError, JSON errors ...
    raise CheckpointError(f"replay buffer file {path} is damaged or not a replay buffer ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None
  if meta.get("format") != "jaxlab.rl.replay" or meta.get("version") != FORMAT_VERSION:
    raise CheckpointError(f"replay buffer file {path} has format {meta.get('format')!r} version "
                          f"{meta.get('version')!r}; expected 'jaxlab.rl.replay' version {FORMAT_VERSION}")
  for k, v in arrays.items():
    want = jnp.dtype(meta["dtypes"][k])
    if v.dtype != want:
      arrays[k] = v.view(want)
  size, pos = arrays["size"], arrays["pos"]
  t_n, cap = (size.shape[0], arrays["reward"].shape[-1]) if size.ndim == 1 and arrays["reward"].ndim == 2 else (0, 0)
  ok = t_n >= 1 and cap >= 1 and pos.shape == (t_n,) and all(arrays[k].ndim == 2 for k in ("discount", "first"))
  ok = ok and all(arrays[k].shape[:2] == (t_n, cap) for k in STEP_FIELDS)
  ok = ok and bool(((size >= 0) & (size <= cap) & (pos >= 0) & (pos < cap)).all())
  ok = ok and all(v.shape[:2] == (t_n, cap) and v.dtype == np.float32 for v in extra.values())
  if not ok:
    raise CheckpointError(f"replay buffer file {path} has inconsistent arrays "
                          f"({ {k: list(v.shape) for k, v in {**arrays, **extra}.items()} })")
  return ReplayState(**{k: jnp.asarray(v) for k, v in arrays.items()},
                     extra={k: jnp.asarray(v) for k, v in extra.items()})
