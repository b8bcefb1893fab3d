"""Robust Q's accelerator step for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/robust_q/config.py:full

One step of the run's loop is one stage: `jaxlab.rl.tabular.run_batch`, method.stage_steps asynchronous Q-learning
steps of every learner for the whole batch (grid.seeds MDPs x corruption settings, padded to the data axis and
sharded over it, as `method.build_problem` places it), followed on the host by the exact errors (`method.errors`,
small linear solves; left out here). The learners keep per-pair reward histories of method.capacity entries, which
is what the chips hold. Tabular updates have no matmuls, so no model FLOPs (no MFU) are given.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import compile_check
from jaxlab import mesh as mesh_lib
from jaxlab.rl import tabular as tb

from . import method

TOPOLOGY = "v5e-8"   # the smallest v5e slice it fits: on v5e-4 the 40 batch elements per chip need 31 GiB


def compile_targets(config):
  """One stage (method.stage_steps steps) of the batched learners."""
  mesh = mesh_lib.current_mesh()
  d = config.mdp
  spec = method.make_spec(config)
  settings = method.corruption_settings(config)
  split = dict(mesh.shape).get("data", 1)
  size = -(-(config.grid.seeds * len(settings)) // split) * split      # as `method.build_problem`
  sharding = NamedSharding(mesh, P("data"))
  batched = lambda tree: jax.tree.map(  # noqa: E731
      lambda s: jax.ShapeDtypeStruct((size,) + s.shape, s.dtype, sharding=sharding), tree)
  per_seed = jax.eval_shape(lambda: method._sample_mdps(config.seed, 1, d.num_states, d.num_actions, float(d.gamma),
                                                        float(d.dirichlet), float(d.reward_low),
                                                        float(d.reward_high)))
  mdps, _, eligible, keys = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), per_seed)
  advs = tb.Adversary(*(jax.ShapeDtypeStruct((), t) for t in (jnp.float32, jnp.float32, jnp.int32, jnp.int32)))
  state = batched(jax.eval_shape(lambda: tb.init_state(spec, d.num_states, d.num_actions)))
  steps = int(config.method.stage_steps)
  stage = jax.jit(lambda st, m, a, e, k: tb.run_batch(spec, st, m, a, e, k, steps))
  report = types.SimpleNamespace(params=state)    # the learners' Q tables and reward histories
  return [compile_check.Target("train_stage", stage, (state, *batched((mdps, advs, eligible, keys))), state=report)]
