"""CurvZO's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/curvzo/config.py:full [--config.model.hf_path=DIR]

The full variant ZO-fine-tunes a user's checkpoint (`lm_task.py`; e.g. OPT-13B or Llama-2-7B): its config.json
(no weights are read) gives the model, and without one the shape of Llama 3.2 1B stands in (unscanned layers,
as `lm_task.build_model` loads it: one ZO block per weight row). Targets:

* `zo_step`: `lm_task`'s jitted train step, `opt.step` of `method.make_optimizer(config.method.method, ...)`
  (two forward passes of the candidate cross-entropy at theta +- eps z and three in-place passes over the
  FSDP-sharded parameters, no gradients, O(#blocks) optimizer state) on a batch of train.batch_size examples
  x the task's candidates x task.max_length tokens;
* `eval_correct`: its evaluation forward (top-scoring candidate == label) on a batch of the same size.
"""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from jaxlab import compile_check, mesh as mesh_lib
from jaxlab.lm.model import Transformer
from jaxlab.state import ModelDef, abstract_with_shardings, tree_shardings

from . import lm_task, method as method_lib

TOPOLOGY = "v5e-4"


def model_config(config):
  """`compile_check.lm_model_config` (this config has no model.remat: a ZO step has no backward pass), unscanned."""
  mcfg = compile_check.lm_model_config(ml_collections.ConfigDict({"model": dict(config.model.to_dict(), remat=False)}))
  return dataclasses.replace(mcfg, scan_layers=False)


def candidates(task: str) -> int:
  """The task's number of candidate completions (from its template, on a placeholder record)."""
  _, fields, fn = lm_task.TASKS[task]
  return len(fn({k: 0 if k == "label" else "x" for k in fields})[1])


def compile_targets(config):
  """The ZO step and the evaluation forward of the full config."""
  mcfg = model_config(config)
  mesh, rules = mesh_lib.current_mesh(), mesh_lib.current_rules()
  md = ModelDef(lambda rngs: Transformer(mcfg, rngs=rngs))
  shapes, rest = md.abstract()                      # rest: {} (a Transformer keeps no other state)
  params = abstract_with_shardings(tree_shardings(md.param_specs, shapes, mesh, rules), shapes)
  lr = config.method.learning_rate
  # The builder makes small host arrays eagerly (the block sizes), which the compile-only TPU devices cannot
  # hold: build it under a one-CPU mesh (the step captures them as constants; the parameter shardings it
  # records stay the slice's).
  host = Mesh(np.asarray(jax.devices("cpu")[:1]).reshape((1,) * len(mesh.axis_names)), mesh.axis_names)
  with jax.set_mesh(host):
    opt = method_lib.make_optimizer(config.method.method, params, lambda step: jnp.float32(lr), config.method)
  repl = mesh_lib.replicated(mesh)
  opt_state = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=repl),
                           jax.eval_shape(lambda: opt.init(config.seed)))

  def loss_fn(p, batch):
    return lm_task.classification_loss(lm_task.candidate_scores(md.merge(p, rest), batch), batch["label"])

  def train_step(state, batch):        # lm_task.train_and_evaluate's step
    p, o, mets = opt.step(loss_fn, state["params"], state["opt"], batch)
    return {"params": p, "opt": o}, {f"train/{k}": v for k, v in mets.items()}

  shardings = {"params": jax.tree.map(lambda s: s.sharding, params), "opt": jax.tree.map(lambda _: repl, opt_state)}
  step = jax.jit(train_step, donate_argnums=0, out_shardings=(shardings, None))
  b, c, l = int(config.train.batch_size), candidates(config.task.name), int(config.task.max_length)
  bsh = mesh_lib.batch_sharding()
  i32, f32 = (jax.ShapeDtypeStruct((b, c, l), t, sharding=bsh) for t in (jnp.int32, jnp.float32))
  batch = {"inputs": i32, "targets": i32, "mask": f32, "label": jax.ShapeDtypeStruct((b,), jnp.int32, sharding=bsh)}
  state = types.SimpleNamespace(params=params, opt_state=opt_state, model_state=rest)
  n = compile_check.num_params(compile_check.Target("", None, (), state=state))
  # two forward passes (2 N per token + attention each) over every candidate token; no backward pass
  flops = compile_check.transformer_flops(n, 2 * b * c * l, mcfg.n_layers, l, mcfg.hidden, backward=False)
  train = compile_check.Target("zo_step", step, ({"params": params, "opt": opt_state}, batch), state=state,
                               model_flops=flops)
  eb = int(config.train.get("eval_batch_size") or b)
  eval_batch = {k: jax.ShapeDtypeStruct((eb,) + v.shape[1:], v.dtype) for k, v in batch.items()}
  correct = compile_check.forward_target(
      "eval_correct", train, md.model_fn,
      lambda model, x: jnp.argmax(lm_task.candidate_scores(model, x), -1) == x["label"], (eval_batch,),
      model_flops=compile_check.transformer_flops(n, eb * c * l, mcfg.n_layers, l, mcfg.hidden, backward=False))
  return [train, correct]
