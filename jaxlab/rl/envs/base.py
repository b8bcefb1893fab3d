"""One batched interface for multi-task environments: padded observations and actions, masks, task ids.

A `MultiTaskEnv` holds `envs_per_task` copies of each of its tasks in one batch of B environments, laid out
task-major (task 0's copies first). Every task's observation is a flat float32 vector zero-padded to the
largest observation size of the batch (`obs_dim`); every action is a vector of the largest action size
(`act_dim`), whose entries past the task's own size are ignored. `obs_mask` / `act_mask` ((num_tasks, dim),
1 = real entry, 0 = padding) tell a model which entries are real; `task_ids` (B,) says which task each row
belongs to.

Episodes reset DreamerV3-style: the step that ends an episode returns its final observation with
`last=True` (and `discount=0` when the episode terminated, 1 when it was cut by a time limit); the next call
of `step` ignores its action for that environment and returns the first observation of a new episode with
`first=True` and reward 0. `step` may be called before `reset`: every environment then starts an episode.

This module imports only numpy (the dm_control worker processes import it without JAX).
"""

from __future__ import annotations

import abc
import dataclasses

import numpy as np

from jaxlab.errors import DataError


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Sizes and action bounds of one task.

  Attributes:
    name: the task's name, e.g. "cartpole-balance" or "CartPole-v1".
    obs_dim: length of the task's flat observation vector (before padding).
    act_dim: length of the task's action vector (before padding); for a discrete action space, the number of
      actions (the environment takes the argmax of the first `act_dim` entries).
    action_low, action_high: per-entry bounds of the action (length act_dim); actions are clipped to them.
      Discrete tasks have (-inf, inf): their scores are not clipped.
    discrete: whether the action space is discrete.
  """
  name: str
  obs_dim: int
  act_dim: int
  action_low: tuple[float, ...]
  action_high: tuple[float, ...]
  discrete: bool = False

  def __post_init__(self):
    if len(self.action_low) != self.act_dim or len(self.action_high) != self.act_dim:
      raise DataError(f"task {self.name}: action bounds have lengths {len(self.action_low)}/"
                      f"{len(self.action_high)}, expected act_dim={self.act_dim}")


@dataclasses.dataclass(eq=False)
class TimeStep:
  """One batched transition (numpy arrays; B environments).

  Attributes:
    obs: (B, obs_dim) float32, zero-padded past each task's obs_dim.
    reward: (B,) float32 (0 on a `first` step).
    discount: (B,) float32: 0 where the episode terminated, 1 otherwise (also at a time-limit cut).
    first: (B,) bool: the observation is the first of an episode.
    last: (B,) bool: the observation is the last of an episode (the next `step` starts a new one).
    task_id: (B,) int32: index into `env.tasks`.
    pixels: (B, H, W, 3) uint8 rendered frames, or None when the environment renders none.
  """
  obs: np.ndarray
  reward: np.ndarray
  discount: np.ndarray
  first: np.ndarray
  last: np.ndarray
  task_id: np.ndarray
  pixels: np.ndarray | None = None

  @property
  def batch_size(self) -> int:
    return int(self.obs.shape[0])


def pad(x, dim: int) -> np.ndarray:
  """Zero-pads the last axis of `x` to length `dim`.

  Raises:
    DataError: when the last axis is already longer than `dim`.
  """
  x = np.asarray(x)
  if x.ndim == 0:
    x = x.reshape(1)
  n = x.shape[-1]
  if n > dim:
    raise DataError(f"cannot pad an array with last axis {n} to the smaller size {dim}")
  if n == dim:
    return x
  widths = [(0, 0)] * (x.ndim - 1) + [(0, dim - n)]
  return np.pad(x, widths)


class MultiTaskEnv(abc.ABC):
  """Batched multi-task environment with padded observations/actions (see the module docstring).

  Subclasses call `super().__init__(tasks, envs_per_task)` once the task specs are known and implement
  `_reset()` and `_step(actions)` (actions already validated, clipped, with padded entries set to 0), both
  returning a `TimeStep`, and `close()`.

  Attributes:
    tasks: the TaskSpec of each task.
    envs_per_task: copies of each task in the batch.
    num_envs: B = len(tasks) * envs_per_task.
    obs_dim, act_dim: the largest observation / action size of the tasks (the padded sizes).
    obs_mask, act_mask: (num_tasks, obs_dim / act_dim) float32, 1 on each task's real entries.
    task_ids: (B,) int32 task index of each environment of the batch.
    action_low, action_high: (B, act_dim) float32 clip bounds of each row (0 on padded entries).
  """

  def __init__(self, tasks: list[TaskSpec], envs_per_task: int = 1):
    if not tasks:
      raise DataError("a MultiTaskEnv needs at least one task")
    if envs_per_task < 1:
      raise DataError(f"envs_per_task must be >= 1, got {envs_per_task}")
    self.tasks = list(tasks)
    self.envs_per_task = int(envs_per_task)
    self.num_envs = len(self.tasks) * self.envs_per_task
    self.obs_dim = max(t.obs_dim for t in self.tasks)
    self.act_dim = max(t.act_dim for t in self.tasks)
    self.obs_mask = np.stack([pad(np.ones(t.obs_dim, np.float32), self.obs_dim) for t in self.tasks])
    self.act_mask = np.stack([pad(np.ones(t.act_dim, np.float32), self.act_dim) for t in self.tasks])
    self.task_ids = np.repeat(np.arange(len(self.tasks), dtype=np.int32), self.envs_per_task)
    low = np.stack([pad(np.asarray(t.action_low, np.float32), self.act_dim) for t in self.tasks])
    high = np.stack([pad(np.asarray(t.action_high, np.float32), self.act_dim) for t in self.tasks])
    self.action_low, self.action_high = low[self.task_ids], high[self.task_ids]

  @property
  def num_tasks(self) -> int:
    return len(self.tasks)

  @property
  def task_names(self) -> list[str]:
    return [t.name for t in self.tasks]

  def reset(self) -> TimeStep:
    """Starts a new episode in every environment (all rows `first`)."""
    return self._reset()

  def step(self, actions) -> TimeStep:
    """Steps every environment with `actions` (B, act_dim); see the module docstring for episode ends.

    Entries past a task's act_dim are ignored; the rest are clipped to the task's bounds.

    Raises:
      DataError: when `actions` does not have shape (num_envs, act_dim).
    """
    actions = np.asarray(actions, np.float32)
    if actions.shape != (self.num_envs, self.act_dim):
      raise DataError(f"actions have shape {actions.shape}, expected (num_envs, act_dim) = "
                      f"({self.num_envs}, {self.act_dim})")
    if not np.all(np.isfinite(actions)):
      raise DataError("actions contain NaN or infinite values")
    return self._step(np.clip(actions, self.action_low, self.action_high))

  def sample_actions(self, rng: np.random.Generator) -> np.ndarray:
    """Uniform random actions (B, act_dim) within each task's bounds ([-1, 1] where a bound is infinite)."""
    low = np.where(np.isfinite(self.action_low), self.action_low, -1.0)
    high = np.where(np.isfinite(self.action_high), self.action_high, 1.0)
    a = rng.uniform(low, high).astype(np.float32)
    return a * self.act_mask[self.task_ids]

  @abc.abstractmethod
  def _reset(self) -> TimeStep:
    """Resets every environment."""

  @abc.abstractmethod
  def _step(self, actions: np.ndarray) -> TimeStep:
    """Steps every environment with validated, clipped actions (B, act_dim)."""

  @abc.abstractmethod
  def close(self) -> None:
    """Releases the environments (worker processes, renderers); idempotent."""

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
    return False

  def __repr__(self) -> str:
    return (f"{type(self).__name__}(tasks={self.task_names}, envs_per_task={self.envs_per_task}, "
            f"obs_dim={self.obs_dim}, act_dim={self.act_dim})")
