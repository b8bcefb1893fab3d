"""Gradient accumulation: one optimizer update from a global batch taken in micro-batches.

`make_accumulating_train_step(..., micro_batches=k)` has the signature and the metrics of
`jaxlab.train.step.make_train_step` (and is that step for k = 1), but differentiates the loss on k micro-batches
in a `lax.scan` and applies one update with

    grads = sum_j w_j grad L_j / sum_j w_j,      loss = sum_j w_j L_j / sum_j w_j,

where w_j is the micro-batch's reserved `"weight"` metric (default: its rows). When the loss is a mean over units
and `weight` counts those units (tokens for a token mean, rows with tokens for a sequence mean; the GRPO loss
of `jaxlab.posttrain.grpo` returns exactly that), this is the gradient of the whole batch's loss: only one
micro-batch's activations are alive at a time, so peak memory falls roughly k-fold for the same update.
Metrics are the same weighted means; `train/grad_norm` is that of the accumulated gradient. Model state
(e.g. batch statistics) is threaded through the micro-batches in order.

Micro-batch j holds rows j, j + k, j + 2k, ... of the batch (`fold`, `take`): with the batch sharded over its
leading axis, every device keeps its own rows in every micro-batch, so splitting moves no data, and each scan
step copies only its micro-batch's rows. The batch must have a
multiple of k x (the data split) rows (`jaxlab.posttrain.trainers` pads rollout batches to it).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab.metrics import Weighted
from jaxlab.state import ModelDef, TrainState
from jaxlab.train import step as step_lib


def fold(batch: Any, k: int) -> Any:
  """(B, ...) leaves -> (B / k, k, ...) (a free reshape): micro-batch j is `take(folded, j)`, rows j::k of the
  batch. Scalar leaves are kept (every micro-batch shares them)."""
  def one(x):
    x = jnp.asarray(x)
    if not x.ndim:
      return x
    if x.shape[0] % k:
      raise ValueError(f"accumulate: a batch of {x.shape[0]} rows does not split into {k} micro-batches; pad the "
                       f"batch to a multiple of {k} (x the data split) or change micro_batches")
    return x.reshape(x.shape[0] // k, k, *x.shape[1:])
  return jax.tree.map(one, batch)


def take(folded: Any, j) -> Any:
  """Micro-batch j (traced or static) of a `fold`ed batch: copies only its own rows (each device its own)."""
  return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, j, axis=1, keepdims=False) if x.ndim else x,
                      folded)


def split(batch: Any, k: int) -> Any:
  """(B, ...) leaves -> (k, B / k, ...): every micro-batch at once (a copy; `fold` + `take` avoid it)."""
  return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1) if x.ndim else jnp.broadcast_to(x, (k,)), fold(batch, k))


def merge(x: Any) -> Any:
  """The inverse of `split` for (k, B / k, ...) outputs -> (B, ...) in the batch's row order."""
  return jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1).reshape(-1, *a.shape[2:]), x)


def _micro_sharding(batch_sharding: Any) -> Callable[[Any], Any]:
  """A constraint keeping a micro-batch (or the folded batch) on the batch's devices (its leading axis)."""
  if not isinstance(batch_sharding, NamedSharding) or batch_sharding.mesh.size == 1:
    return lambda x: x
  spec = tuple(batch_sharding.spec)[:1]

  def constrain(tree):
    def one(x):
      return jax.lax.with_sharding_constraint(x, NamedSharding(batch_sharding.mesh, P(*spec) if x.ndim else P()))
    return jax.tree.map(one, tree)
  return constrain


def check_micro_batches(rows: int, micro_batches: int, data_split: int = 1, where: str = "train.micro_batches"):
  """One clear line when `rows` cannot be taken in `micro_batches` equal, device-aligned micro-batches."""
  if micro_batches < 1:
    raise ValueError(f"{where} must be >= 1, got {micro_batches}")
  if rows % (micro_batches * data_split):
    raise ValueError(f"{where}={micro_batches}: a batch of {rows} rows over a data split of {data_split} does not "
                     f"divide into {micro_batches} micro-batches; use a divisor of {rows // max(data_split, 1)}")


def make_accumulating_train_step(modeldef: ModelDef, loss_fn: step_lib.LossFn, tx: optax.GradientTransformation,
                                 schedule: Callable, state_shardings: TrainState, batch_sharding: Any, *,
                                 micro_batches: int = 1, donate: bool = True
                                 ) -> Callable[[TrainState, Any], tuple[TrainState, dict]]:
  """`train_step(state, batch) -> (state, metrics)` that accumulates gradients over `micro_batches`.

  Args: as `jaxlab.train.step.make_train_step`, plus `micro_batches` (k >= 1; 1 = that step unchanged). The
  loss_fn's key for micro-batch j is fold_in(step key, j).
  """
  k = int(micro_batches)
  if k < 1:
    raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
  if k == 1:
    return step_lib.make_train_step(modeldef, loss_fn, tx, schedule, state_shardings, batch_sharding, donate)
  constrain = _micro_sharding(batch_sharding)
  grad_shardings = getattr(state_shardings, "params", None)

  def step(state: TrainState, batch):
    key = state.key()
    folded = constrain(fold(batch, k))

    def objective(params, model_state, mb, j):
      model = modeldef.merge(params, model_state)
      model.train()
      loss, metrics = loss_fn(model, mb, jax.random.fold_in(key, j))
      metrics = dict(metrics)
      weight = metrics.pop("weight", None)
      rows = step_lib._examples(mb)  # pylint: disable=protected-access
      weight = jnp.float32(rows) if weight is None else jnp.asarray(weight, jnp.float32)
      return loss, (metrics, weight, modeldef.split(model)[1])

    grad_fn = jax.value_and_grad(objective, has_aux=True)
    shapes = jax.eval_shape(grad_fn, state.params, state.model_state, take(folded, 0), 0)
    (_, (metric_shapes, _, _)), _ = shapes

    def body(carry, j):
      g_acc, l_acc, m_acc, w_acc, model_state = carry
      mb = constrain(take(folded, j))
      (loss, (metrics, w, model_state)), g = grad_fn(state.params, model_state, mb, j)
      g_acc = jax.tree.map(lambda a, b: a + w * b.astype(jnp.float32), g_acc, g)
      if grad_shardings is not None:
        g_acc = jax.lax.with_sharding_constraint(g_acc, grad_shardings)
      m_acc = {n: m_acc[n] + w * jnp.asarray(v, jnp.float32) for n, v in metrics.items()}
      return (g_acc, l_acc + w * loss.astype(jnp.float32), m_acc, w_acc + w, model_state), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    m0 = {n: jnp.zeros((), jnp.float32) for n in metric_shapes}
    init = (zeros, jnp.float32(0), m0, jnp.float32(0), state.model_state)
    (g_sum, l_sum, m_sum, w_sum, model_state), _ = jax.lax.scan(body, init, jnp.arange(k))
    inv = jnp.where(w_sum > 0, 1.0 / jnp.maximum(w_sum, 1e-30), 0.0)
    grads = jax.tree.map(lambda a, p: (a * inv).astype(p.dtype), g_sum, state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    out = {"train/loss": Weighted(l_sum * inv, w_sum), "train/grad_norm": optax.global_norm(grads),
           "train/lr": schedule(state.step)}
    out.update({f"train/{n}": Weighted(v * inv, w_sum) for n, v in m_sum.items()})
    new = state.replace(step=state.step + 1, params=params, model_state=model_state, opt_state=opt_state)
    return new, out

  return jax.jit(step, in_shardings=(state_shardings, batch_sharding), out_shardings=(state_shardings, None),
                 donate_argnums=(0,) if donate else ())


def map_micro(fn: Callable[[Any], Any], batch: Any, micro_batches: int, batch_sharding: Any = None) -> Any:
  """`fn(batch)` computed one micro-batch at a time (`lax.map`; for forward passes such as reference log-probs):
  the same rows out as `fn` on the whole batch, with one micro-batch's activations alive at a time."""
  k = int(micro_batches)
  if k == 1:
    return fn(batch)
  constrain = _micro_sharding(batch_sharding)
  folded = constrain(fold(batch, k))
  return merge(jax.lax.map(lambda j: fn(constrain(take(folded, j))), jnp.arange(k)))
