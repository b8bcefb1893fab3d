"""The TaskLoom agent's accelerator step for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/taskloom_agent/config.py:full

One update of `jaxlab.rl.dreamer.agent.Agent` (world models of every group, then the imagination actor-critic of
every task) with the replay buffer on the device, as the run calls it, for the single-task arm (one world model per
task) and the shared arm (one for all). The run places its arrays on one default device, so one chip does the work:
the target replicates it over the slice (per-chip memory and FLOPs are one chip's).
"""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import compile_check
from jaxlab import mesh as mesh_lib
from jaxlab.rl import replay
from jaxlab.rl.dreamer import agent as agent_lib

from . import train

TOPOLOGY = "v5p-8"


def env_spec(config):
  """Sizes of config.env.names (dm_control specs; pixels: image_size), without stepping anything."""
  from jaxlab.rl.envs.dm_control import DMControlTasks  # pylint: disable=g-import-not-at-top
  with DMControlTasks(list(config.env.names), envs_per_task=1, seed=0) as env:
    return types.SimpleNamespace(obs_dim=env.obs_dim, act_dim=env.act_dim, num_tasks=env.num_tasks,
                                 obs_mask=env.obs_mask, image_size=config.env.image_size)


def _matmul_weights(tree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree) if len(x.shape) >= 2))


def compile_targets(config):
  spec = env_spec(config)
  agent = train.build_agent(config, spec)
  a, e = config.agent, config.env
  t_n = spec.num_tasks
  capacity = min(a.capacity, e.env_steps // (e.action_repeat * e.envs_per_task) * e.envs_per_task + 1)
  obs = (spec.image_size, spec.image_size, 3) if e.pixels else (spec.obs_dim,)
  rep = mesh_lib.replicated()
  put = lambda tree: jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), tree)  # noqa: E731
  buf = put(jax.eval_shape(lambda: replay.init(t_n, capacity, obs, spec.act_dim,
                                               obs_dtype=jnp.uint8 if e.pixels else jnp.float32,
                                               extras=agent.replay_extras())))
  key = put(jax.eval_shape(lambda: jax.random.key(0)))
  flag = put(jax.ShapeDtypeStruct((), jnp.bool_))
  tau = put(jax.ShapeDtypeStruct((), jnp.float32))
  targets = []
  for arm in ("single", "shared"):
    assign = agent_lib.initial_assign(arm, t_n)
    members = tuple(tuple(int(x) for x in row) for row in agent_lib.member_rows(assign, a.batch_size))
    st = put(jax.eval_shape(lambda k=assign: agent.init(jax.random.key(0), k)))
    update = agent._update_impl  # pylint: disable=protected-access
    fn = jax.jit(functools.partial(update, members=members), donate_argnums=(0, 1))
    one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), st["wm"])
    heads = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), st["ac"])
    rows = t_n * a.batch_size * a.seq_len
    starts = t_n * (a.imag_starts or a.batch_size * a.seq_len)
    flops = 6.0 * rows * _matmul_weights(one) + 6.0 * starts * config.behavior.horizon * (
        _matmul_weights({k: one[k] for k in ("img_in", "gru", "img_out", "rew", "cont")}) + _matmul_weights(heads))
    state = types.SimpleNamespace(params={"wm": st["wm"], "ac": st["ac"]},
                                  opt_state={k: st[k] for k in ("wm_opt", "actor_opt", "critic_opt")})
    targets.append(compile_check.Target(f"update_{arm}", fn, (st, buf, key, flag, tau), state=state,
                                        model_flops=flops))
  return targets
