"""Optax optimizers and learning-rate schedules from a config's optimizer section (`config.train.optimizer`)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from jaxlab.errors import ConfigError


def make_schedule(opt: ml_collections.ConfigDict, num_steps: int) -> optax.Schedule:
  """Learning-rate schedule: constant, cosine, warmup_cosine or warmup_constant.

  Args:
    opt: `config.train.optimizer` (learning_rate, schedule, warmup_steps, end_lr_ratio).
    num_steps: total steps of the run (cosine decays to `end_lr_ratio * learning_rate` at the end).
  """
  lr, warm = opt.learning_rate, opt.warmup_steps
  end = opt.learning_rate * opt.end_lr_ratio
  if opt.schedule == "constant":
    return optax.constant_schedule(lr)
  if opt.schedule == "cosine":
    return optax.cosine_decay_schedule(lr, max(num_steps, 1), alpha=opt.end_lr_ratio)
  if opt.schedule == "warmup_cosine":
    return optax.warmup_cosine_decay_schedule(0.0, lr, warm, max(num_steps, warm + 1), end_value=end)
  if opt.schedule == "warmup_constant":
    return optax.join_schedules([optax.linear_schedule(0.0, lr, max(warm, 1)), optax.constant_schedule(lr)], [warm])
  raise ConfigError(f"config.train.optimizer.schedule={opt.schedule!r} is unknown")


def make_optimizer(opt: ml_collections.ConfigDict, num_steps: int) -> tuple[optax.GradientTransformation, Callable]:
  """Builds the optax transformation (optional global-norm clipping first) and its schedule.

  Args:
    opt: `config.train.optimizer` (name in adamw|adam|sgd|lion, learning rate and schedule keys, weight_decay,
      b1, b2, eps, momentum, nesterov, clip_norm (0 = off)).
    num_steps: total steps of the run.

  Returns:
    (tx, schedule): the transformation and `step -> learning rate`.
  """
  schedule = make_schedule(opt, num_steps)
  if opt.name == "adamw":
    tx = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay)
  elif opt.name == "adam":
    tx = optax.adam(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps)
  elif opt.name == "sgd":
    tx = optax.sgd(schedule, momentum=opt.momentum or None, nesterov=opt.nesterov)
    if opt.weight_decay:
      tx = optax.chain(optax.add_decayed_weights(opt.weight_decay), tx)
  elif opt.name == "lion":
    tx = optax.lion(schedule, b1=opt.b1, b2=opt.b2, weight_decay=opt.weight_decay)
  else:
    raise ConfigError(f"config.train.optimizer.name={opt.name!r} is unknown; use adamw, adam, sgd or lion")
  if opt.clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(opt.clip_norm), tx)
  return tx, schedule


class ParamEMAState(NamedTuple):
  """Optimizer-state entry of `with_param_ema`: the exponential moving average of the parameters."""
  ema: Any


def with_param_ema(tx: optax.GradientTransformation, decay: float) -> optax.GradientTransformation:
  """`tx` that also keeps an exponential moving average of the parameters in its state (Polyak averaging).

  After each update, ema <- decay * ema + (1 - decay) * params_new (params_new = params + updates); the
  updates themselves are `tx`'s, unchanged. The average lives in the optimizer state, so it is sharded like
  the parameters, checkpointed and restored with the run (exact resume); read it with `param_ema`.

  Args:
    tx: the optimizer.
    decay: in [0, 1); the average covers about 1 / (1 - decay) steps.
  """
  if not 0.0 <= decay < 1.0:
    raise ConfigError(f"with_param_ema: decay must be in [0, 1), got {decay!r}")

  def init(params):
    return ParamEMAState(ema=jax.tree.map(jnp.array, params))

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("with_param_ema needs the parameters in update(updates, state, params)")
    ema = jax.tree.map(lambda e, p, u: decay * e + (1.0 - decay) * (p + u), state.ema, params, updates)
    return updates, ParamEMAState(ema=ema)

  return optax.chain(tx, optax.GradientTransformation(init, update))


def param_ema(opt_state: Any) -> Any:
  """The parameter average of an optimizer state built with `with_param_ema`.

  Raises:
    ValueError: the state holds no `ParamEMAState`.
  """
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, ParamEMAState))
           if isinstance(s, ParamEMAState)]
  if not found:
    raise ValueError("param_ema: this optimizer state has no parameter average; build the optimizer with "
                     "jaxlab.train.optim.with_param_ema")
  return found[0].ema
