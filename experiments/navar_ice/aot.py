"""NAVAR-ICE's accelerator step for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/navar_ice/config.py:full [--config.data.path=FILE.csv]

One step of the training loop is one chunk of method.chunk full-batch AdamW updates of every ensemble member
(`jaxlab.causal.ensemble.make_chunk_step`, members one after the other), for every system of the run, the windows
sharded over the data axis and the state replicated, as `train.train_stage` places them. The full variant reads the
user's CSV (data.path); without one the target uses the V-Dem-like panel stand-in of the config (data.units x
data.years, `jaxlab.causal.data.panel_standin`) for the shapes. The ICE curves, scores and plots are host-side
evaluation of the trained parameters and are left out.
"""

from __future__ import annotations

import math
import types

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import compile_check
from jaxlab import mesh as mesh_lib
from jaxlab.causal import data as data_lib
from jaxlab.causal import ensemble
from jaxlab.causal.navar import Navar
from jaxlab.train import optim

from . import method

TOPOLOGY = "v5e-4"


def _systems(config) -> list[dict]:
  """The run's systems, or the panel stand-in when a file data name has no data.path yet."""
  d = config.data
  if d.name in ("synthetic", "panel") or d.path:
    return method.build_systems(config)
  sim = data_lib.panel_standin(np.random.default_rng(config.seed), d.units, d.years)
  return [{"name": "main", "panel": data_lib.Panel(sim["units"], sim["variables"], sim["unit_names"], "stand-in")}]


def compile_targets(config):
  """One chunk of every system's ensemble updates."""
  d, m = config.data, config.method
  mesh = mesh_lib.current_mesh()
  split = dict(mesh.shape).get("data", 1)
  repl = NamedSharding(mesh, P())
  tx, _ = optim.make_optimizer(config.train.optimizer, m.steps)
  specs = {"x": P("data"), "y": P("data"), "w": P(None, "data"), "v": P("data")}
  state, batch, steps, flops = {}, {}, {}, 0.0
  for k, s in enumerate(_systems(config)):
    win = data_lib.make_windows(s["panel"], d.lags, d.normalise, d.val_fraction)
    model = Navar(n=len(win.variables), lags=d.lags, hidden=config.model.hidden, kind=config.model.kind,
                  layers=config.model.layers)
    members = 1 + m.bootstrap if s["name"] == "main" else 1
    rows = len(win.y) + (-len(win.y)) % split                                # padded as `train.train_stage`
    shapes = {"x": (rows,) + win.x.shape[1:], "y": (rows,) + win.y.shape[1:], "w": (members, rows), "v": (rows,)}
    batch[s["name"]] = {key: jax.ShapeDtypeStruct(shape, np.float32, sharding=NamedSharding(mesh, specs[key]))
                        for key, shape in shapes.items()}
    rng = np.random.default_rng([config.seed, k])
    init = jax.eval_shape(lambda: ensemble.init(model, tx, rng, members))   # traced: no eager op on the mesh
    state[s["name"]] = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=repl), init)
    steps[s["name"]] = ensemble.make_chunk_step(model, tx, m.lam, m.chunk)
    per_member = sum(math.prod(a.shape) for a in jax.tree.leaves(init["params"])) // members
    flops += 6.0 * per_member * rows * m.chunk * members     # each weight used once per window per update

  def step_fn(st, data):
    out = {name: steps[name](st[name], data[name]) for name in st}
    return {name: o[0] for name, o in out.items()}, {name: o[1] for name, o in out.items()}

  shardings = jax.tree.map(lambda a: a.sharding, state)
  jstep = jax.jit(step_fn, in_shardings=(shardings, jax.tree.map(lambda a: a.sharding, batch)),
                  out_shardings=(shardings, repl), donate_argnums=0)
  report = types.SimpleNamespace(params={k: v["params"] for k, v in state.items()},
                                 opt_state={k: v["opt"] for k, v in state.items()})
  return [compile_check.Target("train_chunk", jstep, (state, batch), state=report, model_flops=flops)]
