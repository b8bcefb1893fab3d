"""dm_control suite tasks behind the batched `MultiTaskEnv` interface, in-process or in worker processes.

    env = DMControlTasks(["cartpole-balance", "point_mass-easy"], envs_per_task=4, workers=2)
    ts = env.reset()                       # ts.obs (8, 5): cartpole 5 entries, point_mass 4 (+1 zero)
    ts = env.step(env.sample_actions(np.random.default_rng(0)))

Tasks are named "domain-task" (`dm_control.suite.ALL_TASKS`). Environment i of the batch is loaded with
`suite.load(domain, task, task_kwargs={"random": seed_i})`, seed_i derived from (seed, i), so a batch is
reproducible and independent of how it is split over workers. Observations are the observation dict's
entries, flattened and concatenated in sorted key order (`obs_keys`), as float32.

`workers=0` steps the environments in this process; `workers=W > 0` gives each of W worker processes (the
multiprocessing "spawn" context, one pipe each) a contiguous slice of the batch and steps the slices in
parallel. The workers import numpy, MuJoCo and dm_control only, never JAX: they load this file without
running `jaxlab/rl/__init__.py`, and do not re-import the parent's `__main__` module.

`pixels=True` also renders every environment (camera 0; 2 for quadruped) to `TimeStep.pixels` (B, H, W, 3)
uint8, H = W = image_size. It sets MUJOCO_GL=egl (unless MUJOCO_GL is already set) before dm_control is
imported; set MUJOCO_GL yourself before anything imports dm_control if the process imported it earlier.

Needs the `rl` extra (dm-control==1.0.50 with mujoco==3.17.0; MuJoCo 4 breaks `suite.load`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings

import numpy as np

from jaxlab import errors
from jaxlab.rl.envs import base

_WORKER_NAME = "__jaxlab_dm_control_worker__"


def _mujoco_major() -> int | None:
  from importlib import metadata
  try:
    return int(metadata.version("mujoco").split(".")[0])
  except (metadata.PackageNotFoundError, ValueError):
    return None


def import_suite(pixels: bool = False):
  """Imports `dm_control.suite` (MUJOCO_GL=egl first when `pixels`).

  Raises:
    MissingDependencyError: dm_control or mujoco is missing, or mujoco >= 4 is installed.
  """
  if pixels:
    os.environ.setdefault("MUJOCO_GL", "egl")
  major = _mujoco_major()
  if major is not None and major >= 4:
    raise errors.MissingDependencyError(
        f"mujoco {major}.x is installed but dm_control 1.0.50's suite.load needs MuJoCo 3; "
        "install it with pip install mujoco==3.17.0 (or pip install 'jaxlab[rl]')")
  errors.require("mujoco", "rl")
  errors.require("dm_control", "rl")
  with warnings.catch_warnings():   # without a display, glfw warns at import even when it is not used
    warnings.filterwarnings("ignore", module="glfw")
    try:
      return importlib.import_module("dm_control.suite")
    except ImportError as e:
      raise errors.MissingDependencyError(f"dm_control.suite fails to import ({e}); reinstall it with "
                                          "pip install 'jaxlab[rl]' (dm-control==1.0.50, mujoco==3.17.0)") from e


def parse_names(names, suite) -> list[tuple[str, str]]:
  """["cartpole-balance", ...] -> [("cartpole", "balance"), ...].

  Raises:
    ConfigError: on a name that is not one of `suite.ALL_TASKS` (the message lists the valid names).
  """
  if isinstance(names, str):
    names = [names]
  valid = [f"{d}-{t}" for d, t in suite.ALL_TASKS]
  out = []
  for name in names:
    domain, _, task = str(name).partition("-")
    if (domain, task) not in suite.ALL_TASKS:
      raise errors.ConfigError(f"unknown dm_control task '{name}'; valid domain-task names: {', '.join(valid)}")
    out.append((domain, task))
  if not out:
    raise errors.ConfigError("DMControlTasks needs at least one task name, e.g. ['cartpole-balance']")
  return out


def env_seed(seed: int, index: int) -> int:
  """The `random` seed of environment `index` of a batch built with `seed`."""
  return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


class _Slice:
  """Some dm_control environments stepped in sequence, with the auto-reset of `base` (no JAX here).

  `entries` are (domain, task, seed, time_limit) tuples. step/reset return a dict of numpy arrays: obs
  (n, local max obs size), reward, discount, first, last and, with pixels, pixels (n, H, W, 3).
  """

  def __init__(self, entries, pixels: bool = False, image_size: int = 64):
    suite = import_suite(pixels)
    self.pixels, self.image_size = pixels, int(image_size)
    self.envs, self.keys, self.cameras = [], [], []
    for domain, task, seed, time_limit in entries:
      task_kwargs = {"random": seed}
      if time_limit is not None:
        task_kwargs["time_limit"] = time_limit
      env = suite.load(domain, task, task_kwargs=task_kwargs)
      self.envs.append(env)
      self.keys.append(sorted(env.observation_spec()))
      self.cameras.append(2 if domain == "quadruped" else 0)
    self.specs = [self._spec(e, k) for e, k in zip(self.envs, self.keys)]
    self.obs_dim = max(s["obs_dim"] for s in self.specs)
    self.needs_reset = np.ones(len(self.envs), bool)

  @staticmethod
  def _spec(env, keys) -> dict:
    obs_spec, act = env.observation_spec(), env.action_spec()
    shape = act.shape if act.shape else (1,)
    return {"obs_dim": int(sum(int(np.prod(obs_spec[k].shape)) for k in keys)), "act_dim": int(np.prod(shape)),
            "low": tuple(float(x) for x in np.broadcast_to(act.minimum, shape).ravel()),
            "high": tuple(float(x) for x in np.broadcast_to(act.maximum, shape).ravel()), "obs_keys": keys}

  def _flat(self, i, observation) -> np.ndarray:
    return np.concatenate([np.asarray(observation[k], np.float32).ravel() for k in self.keys[i]])

  def _out(self, steps, first) -> dict:
    n = len(self.envs)
    out = {"obs": np.zeros((n, self.obs_dim), np.float32), "reward": np.zeros(n, np.float32),
           "discount": np.ones(n, np.float32), "first": np.asarray(first, bool), "last": np.zeros(n, bool)}
    for i, ts in enumerate(steps):
      obs = self._flat(i, ts.observation)
      out["obs"][i, :obs.shape[0]] = obs
      out["reward"][i] = 0.0 if ts.reward is None else ts.reward
      out["discount"][i] = 1.0 if ts.discount is None else ts.discount
      out["last"][i] = ts.last()
    if self.pixels:
      s = self.image_size
      out["pixels"] = np.stack([e.physics.render(height=s, width=s, camera_id=c)
                                for e, c in zip(self.envs, self.cameras)]).astype(np.uint8)
    self.needs_reset = out["last"].copy()
    return out

  def reset(self) -> dict:
    return self._out([e.reset() for e in self.envs], np.ones(len(self.envs), bool))

  def step(self, actions: np.ndarray) -> dict:
    first = self.needs_reset.copy()
    steps = []
    for i, env in enumerate(self.envs):
      if first[i]:
        steps.append(env.reset())
      else:
        steps.append(env.step(np.asarray(actions[i, :self.specs[i]["act_dim"]], np.float64)))
    return self._out(steps, first)

  def random_states(self) -> list[dict]:
    """Each environment's task random stream (`np.random.RandomState.get_state`) as JSON-able dicts."""
    out = []
    for env in self.envs:
      name, keys, pos, has_gauss, gauss = env.task.random.get_state()
      out.append({"name": str(name), "keys": [int(k) for k in keys], "pos": int(pos), "has_gauss": int(has_gauss),
                  "gauss": float(gauss)})
    return out

  def set_random_states(self, states: list[dict]) -> None:
    """Restores the streams of `random_states` and marks every environment for a reset: the next `step` starts
    new episodes drawn from the restored streams (a restore at an episode boundary continues bit-identically)."""
    if len(states) != len(self.envs):
      raise errors.ConfigError(f"set_random_states: {len(states)} states for {len(self.envs)} environments")
    for env, st in zip(self.envs, states):
      env.task.random.set_state((st["name"], np.asarray(st["keys"], np.uint32), st["pos"], st["has_gauss"],
                                 st["gauss"]))
    self.needs_reset[:] = True

  def close(self):
    for env in self.envs:
      with contextlib.suppress(Exception):
        env.close()
    self.envs = []


def _worker_main(conn, entries, pixels, image_size):
  """Loop of one worker process: builds its slice, then answers (command, payload) messages on `conn`."""
  try:
    envs = _Slice(entries, pixels, image_size)
    conn.send(("ok", envs.specs))
  except BaseException as e:  # noqa: BLE001 -- reported to the parent as one line
    conn.send(("error", f"{type(e).__name__}: {e}"))
    return
  try:
    while True:
      try:
        cmd, payload = conn.recv()
      except EOFError:
        break
      if cmd == "close":
        break
      try:
        if cmd == "step":
          conn.send(("ok", envs.step(payload)))
        elif cmd == "reset":
          conn.send(("ok", envs.reset()))
        elif cmd == "get_random":
          conn.send(("ok", envs.random_states()))
        elif cmd == "set_random":
          envs.set_random_states(payload)
          conn.send(("ok", None))
        elif cmd == "info":
          conn.send(("ok", {"pid": os.getpid(), "jax_imported": "jax" in sys.modules}))
        else:
          conn.send(("error", f"unknown worker command {cmd!r}"))
      except Exception as e:  # noqa: BLE001
        conn.send(("error", f"{type(e).__name__}: {e}"))
  finally:
    envs.close()
    conn.close()


# Run by each worker with `exec` (a builtin, so unpickling the process target imports nothing): registers bare
# `jaxlab.rl` / `jaxlab.rl.envs` packages so that importing this module skips jaxlab/rl/__init__.py (JAX).
_BOOTSTRAP = """
import sys, types
for _name, _path in (("jaxlab.rl", RL_DIR), ("jaxlab.rl.envs", ENVS_DIR)):
  if _name not in sys.modules:
    _m = types.ModuleType(_name)
    _m.__path__ = [_path]
    sys.modules[_name] = _m
import jaxlab.rl.envs.dm_control as _dmc
_dmc._worker_main(CONN, ENTRIES, PIXELS, IMAGE_SIZE)
"""


@contextlib.contextmanager
def _without_main_reimport():
  """Hides `__main__`'s spec and file while processes start, so that spawn does not re-import it in them.

  The workers need nothing from the parent's main module; re-importing it (e.g. `jaxlab.rl.envs.bench` or a
  user script) would import JAX in every worker.
  """
  main = sys.modules.get("__main__")
  if main is None:
    yield
    return
  saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
  try:
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    yield
  finally:
    main.__dict__.pop("__spec__", None)
    main.__dict__.update(saved)


class _Pool:
  """W worker processes, each owning a contiguous slice of the batch."""

  def __init__(self, entries, workers: int, pixels: bool, image_size: int):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    self.bounds = [(int(s[0]), int(s[-1]) + 1) for s in np.array_split(np.arange(len(entries)), workers)]
    envs_dir = os.path.dirname(os.path.abspath(__file__))
    self.conns, self.procs, self.specs = [], [], []
    try:
      with _without_main_reimport():
        for lo, hi in self.bounds:
          parent, child = ctx.Pipe()
          scope = {"RL_DIR": os.path.dirname(envs_dir), "ENVS_DIR": envs_dir, "CONN": child,
                   "ENTRIES": entries[lo:hi], "PIXELS": pixels, "IMAGE_SIZE": image_size, "__name__": _WORKER_NAME}
          proc = ctx.Process(target=exec, args=(_BOOTSTRAP, scope), daemon=True, name=f"dm_control-worker-{lo}")
          proc.start()
          child.close()
          self.conns.append(parent)
          self.procs.append(proc)
      for w in range(len(self.conns)):
        self.specs += self._recv(w)
    except BaseException:
      self.close()
      raise

  def _recv(self, w: int):
    try:
      status, payload = self.conns[w].recv()
    except (EOFError, OSError):
      code = self.procs[w].exitcode
      raise RuntimeError(f"dm_control worker {w} exited unexpectedly (exit code {code})") from None
    if status != "ok":
      raise RuntimeError(f"dm_control worker {w} failed: {payload}")
    return payload

  def call(self, cmd: str, payloads=None) -> list:
    for w, conn in enumerate(self.conns):
      conn.send((cmd, None if payloads is None else payloads[w]))
    return [self._recv(w) for w in range(len(self.conns))]

  def reset(self) -> list[dict]:
    return self.call("reset")

  def step(self, actions: np.ndarray) -> list[dict]:
    return self.call("step", [actions[lo:hi] for lo, hi in self.bounds])

  def close(self):
    for conn in self.conns:
      with contextlib.suppress(Exception):
        conn.send(("close", None))
    for proc in self.procs:
      proc.join(timeout=5)
      if proc.is_alive():
        proc.terminate()
        proc.join(timeout=5)
    for conn in self.conns:
      with contextlib.suppress(Exception):
        conn.close()
    self.conns, self.procs = [], []


class DMControlTasks(base.MultiTaskEnv):
  """dm_control suite tasks as one padded batch (see the module docstring).

  Args:
    names: "domain-task" names, e.g. ["cartpole-balance", "point_mass-easy", "reacher-easy"].
    envs_per_task: copies of each task in the batch (B = len(names) * envs_per_task).
    seed: seeds every environment's `random` task argument (through `env_seed(seed, i)`).
    workers: 0 steps in this process; W > 0 steps in min(W, B) worker processes.
    pixels: also render `TimeStep.pixels` (B, image_size, image_size, 3) uint8 (MUJOCO_GL=egl by default).
    image_size: side of the rendered square frames.
    time_limit: episode length in seconds of simulated time (None: the suite's default, 1000 control steps
      for most tasks).

  Raises:
    ConfigError: unknown task name or bad workers / image_size.
    MissingDependencyError: dm_control or mujoco missing, or mujoco >= 4.
  """

  def __init__(self, names=("cartpole-balance", "point_mass-easy"), envs_per_task: int = 1, seed: int = 0,
               workers: int = 0, pixels: bool = False, image_size: int = 64, time_limit: float | None = None):
    suite = import_suite(pixels)
    pairs = parse_names(names, suite)
    if workers < 0:
      raise errors.ConfigError(f"workers must be >= 0, got {workers}")
    if image_size < 1:
      raise errors.ConfigError(f"image_size must be >= 1, got {image_size}")
    if envs_per_task < 1:
      raise errors.ConfigError(f"envs_per_task must be >= 1, got {envs_per_task}")
    entries = [(d, t, env_seed(seed, i), time_limit) for i, (d, t) in enumerate(
        p for p in pairs for _ in range(envs_per_task))]
    self.pixels, self.image_size, self.seed = bool(pixels), int(image_size), int(seed)
    self.workers = min(int(workers), len(entries))
    self._pool = self._local = None
    if self.workers > 0:
      self._pool = _Pool(entries, self.workers, self.pixels, self.image_size)
      specs = self._pool.specs
    else:
      self._local = _Slice(entries, self.pixels, self.image_size)
      specs = self._local.specs
    tasks = []
    for k, (domain, task) in enumerate(pairs):
      s = specs[k * envs_per_task]
      tasks.append(base.TaskSpec(f"{domain}-{task}", s["obs_dim"], s["act_dim"], s["low"], s["high"]))
    self.obs_keys = [specs[k * envs_per_task]["obs_keys"] for k in range(len(pairs))]
    super().__init__(tasks, envs_per_task)

  def _timestep(self, parts: list[dict]) -> base.TimeStep:
    get = lambda key: np.concatenate([p[key] for p in parts])   # noqa: E731
    obs = np.concatenate([base.pad(p["obs"], self.obs_dim) for p in parts]).astype(np.float32)
    return base.TimeStep(obs=obs, reward=get("reward"), discount=get("discount"), first=get("first"),
                         last=get("last"), task_id=self.task_ids.copy(), pixels=get("pixels") if self.pixels else None)

  def _reset(self) -> base.TimeStep:
    self._check_open()
    return self._timestep(self._pool.reset() if self._pool else [self._local.reset()])

  def _step(self, actions: np.ndarray) -> base.TimeStep:
    self._check_open()
    return self._timestep(self._pool.step(actions) if self._pool else [self._local.step(actions)])

  def random_states(self) -> list[dict]:
    """The task random stream of every environment of the batch (JSON-able; see `set_random_states`)."""
    self._check_open()
    if self._pool:
      return [st for part in self._pool.call("get_random") for st in part]
    return self._local.random_states()

  def set_random_states(self, states: list[dict]) -> None:
    """Restores `random_states` (one per environment of the batch) and makes the next `step` start new episodes
    from them in every environment. Saved and restored at an episode boundary (every environment's last step),
    the run then continues exactly as the uninterrupted one: dm_control draws each episode's start from the
    task's stream at reset. Mid-episode restores would also need the physics state, and are not offered."""
    self._check_open()
    if len(states) != len(self.task_ids):
      raise errors.ConfigError(f"set_random_states: {len(states)} states for a batch of {len(self.task_ids)}")
    if self._pool:
      self._pool.call("set_random", [states[lo:hi] for lo, hi in self._pool.bounds])
    else:
      self._local.set_random_states(states)

  def worker_info(self) -> list[dict]:
    """{"pid", "jax_imported"} of each worker process (empty list when stepping in-process)."""
    return self._pool.call("info") if self._pool else []

  def _check_open(self):
    if self._pool is None and self._local is None:
      raise errors.ConfigError("this DMControlTasks is closed; create a new one")

  def close(self) -> None:
    pool, local = getattr(self, "_pool", None), getattr(self, "_local", None)
    self._pool = self._local = None
    if pool is not None:
      pool.close()
    if local is not None:
      local.close()

  def __del__(self):
    with contextlib.suppress(Exception):
      self.close()
