"""Environment adapters for multi-task RL behind one batched interface (`MultiTaskEnv`).

* `DMControlTasks`: dm_control suite tasks ("cartpole-balance", ...), in-process or in worker processes,
  optionally with pixels (the `rl` extra: dm-control==1.0.50, mujoco==3.17.0).
* `GymnaxTasks`: gymnax environments ("CartPole-v1", ...), pure JAX (pip install gymnax; not in `all`).

Both give padded observations/actions with per-task masks and task ids, and reset DreamerV3-style (see
`jaxlab.rl.envs.base`). `python -m jaxlab.rl.envs.bench` measures their throughput. The optional packages are
imported only when an adapter is constructed.
"""

from __future__ import annotations

from jaxlab.rl.envs import base
from jaxlab.rl.envs.base import MultiTaskEnv, TaskSpec, TimeStep, pad
from jaxlab.rl.envs.dm_control import DMControlTasks
from jaxlab.rl.envs.gymnax import GymnaxTasks

__all__ = ["base", "MultiTaskEnv", "TaskSpec", "TimeStep", "pad", "DMControlTasks", "GymnaxTasks"]
