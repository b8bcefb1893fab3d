"""TaskLoom's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/taskloom/config.py:full

The full run collects random-policy dm_control trajectories on the host, then every arm takes train.num_steps jitted
Adam steps of M stacked world models (`method.Trainer`, vmapped over models). The step closes over the training
trajectories (they are constants of the compiled program, as in the run): here zeros of the full data's shape, with
the observation / action sizes of config.env.names read from dm_control's specs. The run places its arrays on one
default device, so one chip does the work: the target replicates it over the slice (per-chip memory and FLOPs are
one chip's; the printed MFU divides by every chip of the slice, so one chip's is that times the slice's chips).
`v5e-1` would be the slice, but `compile_check.topology` cannot describe a one-chip slice (libtpu needs
chips_per_host_bounds=(1, 1, 1)).
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import compile_check
from jaxlab import mesh as mesh_lib
from jaxlab.rl import world_model as wm

from . import method

TOPOLOGY = "v5e-4"


def env_dims(config) -> tuple[int, int, int]:
  """(tasks, padded observation size, padded action size) of config.env.names (dm_control) or the synthetic
  families."""
  e = config.env
  if e.kind != "dm_control":
    return e.families * e.tasks_per_family, e.state_dim, e.act_dim
  from jaxlab.rl.envs.dm_control import DMControlTasks  # pylint: disable=g-import-not-at-top
  with DMControlTasks(list(e.names), envs_per_task=1, seed=0) as env:
    return len(env.tasks), env.obs_dim, env.act_dim


def _row_flops(wcfg: wm.WorldModelConfig, params, window: int) -> float:
  """Matmul FLOPs of one training row (forward + backward, 6 per weight use): the encoder once, the reward and
  dynamics MLPs `window` times, the decoder window + 1 times."""
  w = {k: sum(layer["w"].size for layer in params[k]) for k in ("enc", "rew", "dyn", "dec")}
  return 6.0 * (w["enc"] + window * (w["rew"] + w["dyn"]) + (window + 1) * w["dec"])


def compile_targets(config):
  """One train step of the independent arm (M = T models) and of the shared arm (M = 1), train.batch_size rows per
  task per step in total."""
  num_tasks, obs_dim, act_dim = env_dims(config)
  episodes, horizon = int(config.data.train_episodes), int(config.env.horizon)
  shapes = {"obs": (num_tasks, episodes, horizon + 1, obs_dim), "action": (num_tasks, episodes, horizon, act_dim),
            "reward": (num_tasks, episodes, horizon)}
  # host arrays (no eager op on the compile-only TPU mesh in context), closed over by the step as in the run
  data = {k: jax.device_put(np.zeros(v, np.float32), jax.devices("cpu")[0]) for k, v in shapes.items()}
  m = config.model
  wcfg = wm.WorldModelConfig(obs_dim=obs_dim, act_dim=act_dim, num_tasks=num_tasks, latent=m.latent,
                             hidden=m.hidden, layers=m.layers, emb=m.emb, embed=m.embed,
                             reward_weight=m.reward_weight)
  trainer = method.Trainer(config, wcfg, data)
  rep = mesh_lib.replicated()
  put = lambda tree: jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), tree)  # noqa: E731
  one = jax.eval_shape(lambda: wm.init(jax.random.key(0), wcfg))
  key = put(jax.eval_shape(lambda: jax.random.key(0)))
  targets = []
  for arm, models in (("independent", num_tasks), ("shared", 1)):
    params = jax.eval_shape(lambda p, k=models: method.stack(p, k), one)
    opt = jax.eval_shape(trainer.init_opt, params)
    rows = max(1, config.train.batch_size * num_tasks // models)     # as `Trainer.run`
    members = put(jax.ShapeDtypeStruct((models, rows), jnp.int32))
    state = types.SimpleNamespace(params=put(params), opt_state=put(opt))
    targets.append(compile_check.Target(f"train_step_{arm}", trainer._step, (state.params, state.opt_state, key,
                                                                              members),
                                        state=state, model_flops=models * rows * _row_flops(wcfg, one,
                                                                                            trainer.length)))
  return targets
