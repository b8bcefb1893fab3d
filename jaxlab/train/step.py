"""Pure, jitted, sharded train and eval steps for gradient-based training.

`loss_fn(model, batch, key) -> (loss, metrics)` is all an experiment writes: the step merges the pure
param dicts into the NNX module (train mode), differentiates, applies the optax update and returns the new
state with metrics (`train/loss`, `train/grad_norm`, `train/lr`, and `train/<name>` for each metric the loss
returns). The loss and its metrics are means over units; the reserved metric `"weight"` says how many (e.g.
the loss tokens of an LM batch; default: the examples in the batch), and they are returned as
`jaxlab.metrics.Weighted` so the loop averages them over a logging window by weight. Experiments with
non-gradient updates write their own step with the same signature `(state, batch) -> (state, metrics)` and
hand it to `jaxlab.train.run_loop`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxlab.metrics import Weighted
from jaxlab.state import ModelDef, TrainState

LossFn = Callable[[nnx.Module, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, Mapping[str, jax.Array]]]
EvalFn = Callable[[nnx.Module, Mapping[str, jax.Array]], Mapping[str, jax.Array]]


def make_train_step(modeldef: ModelDef, loss_fn: LossFn, tx: optax.GradientTransformation,
                    schedule: Callable, state_shardings: TrainState, batch_sharding: Any,
                    donate: bool = True) -> Callable[[TrainState, Any], tuple[TrainState, dict]]:
  """Builds `train_step(state, batch) -> (state, metrics)`, jitted with explicit shardings.

  Args:
    modeldef: static model description.
    loss_fn: `(model, batch, key) -> (scalar loss, {name: scalar})`; `key` is `fold_in(run key, step)`.
    tx: optax transformation.
    schedule: learning-rate schedule (logged as `train/lr`).
    state_shardings: NamedShardings of the TrainState (from `create_train_state`).
    batch_sharding: sharding (or pytree prefix of shardings) of the global batch.
    donate: donate the input state buffers (the default; the caller must not reuse them).
  """
  def step(state: TrainState, batch):
    key = state.key()

    def objective(params):
      model = modeldef.merge(params, state.model_state)
      model.train()
      loss, metrics = loss_fn(model, batch, key)
      return loss, (metrics, modeldef.split(model)[1])

    (loss, (metrics, model_state)), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics)
    weight = metrics.pop("weight", None)
    weight = jnp.float32(_examples(batch)) if weight is None else jnp.asarray(weight, jnp.float32)
    out = {"train/loss": Weighted(loss, weight), "train/grad_norm": optax.global_norm(grads),
           "train/lr": schedule(state.step)}
    out.update({f"train/{k}": Weighted(jnp.asarray(v, jnp.float32), weight) for k, v in metrics.items()})
    new = state.replace(step=state.step + 1, params=params, model_state=model_state, opt_state=opt_state)
    return new, out

  return jax.jit(step, in_shardings=(state_shardings, batch_sharding), out_shardings=(state_shardings, None),
                 donate_argnums=(0,) if donate else ())


def _examples(batch) -> int:
  """Leading (batch) dimension of the first array in a batch pytree (1 for a batch of scalars)."""
  leaves = [x for x in jax.tree.leaves(batch) if getattr(x, "ndim", 0)]
  return int(leaves[0].shape[0]) if leaves else 1


def make_eval_step(modeldef: ModelDef, eval_fn: EvalFn, state_shardings: TrainState,
                   batch_sharding: Any) -> Callable[[TrainState, Any, jax.Array], tuple[dict, jax.Array]]:
  """Builds `eval_step(state, batch, mask) -> ({name: masked sum}, number of real examples)`.

  `eval_fn(model, batch)` returns per-example values of shape (batch,); padded examples (mask 0) of the
  last eval batch are excluded, so the loop's averages are exact over the eval set.
  """
  def step(state: TrainState, batch, mask):
    model = modeldef.merge(state.params, state.model_state)
    model.eval()
    values = eval_fn(model, batch)
    sums = {k: jnp.sum(jnp.asarray(v, jnp.float32) * mask) for k, v in values.items()}
    return sums, jnp.sum(mask)

  return jax.jit(step, in_shardings=(state_shardings, batch_sharding, batch_sharding))
