"""DreamerV3's optimiser: LaProp with adaptive gradient clipping per tensor (Hafner et al. 2023, arXiv 2301.04104;
danijar/dreamerv3 at e3f0224: `embodied/jax/opt.py` and `dreamerv3/agent.py` `_make_opt`, defaults in
`dreamerv3/configs.yaml` `agent.opt`).

The chain, applied to each parameter tensor p with gradient g:

1. `clip_by_agc(clip, pmin)`: g <- g / max(1, |g| / (clip * max(pmin, |p|))), |.| the Frobenius norm of the whole
   tensor. (optax's `adaptive_grad_clip` clips per unit, i.e. per output row, which is not this rule.)
2. RMS scaling, bias-corrected: nu <- b2 nu + (1 - b2) g^2, g <- g / (sqrt(nu / (1 - b2^t)) + eps) (optax
   `scale_by_rms(eps_in_sqrt=False, bias_correction=True)`).
3. Momentum of the scaled gradient, bias-corrected: mu <- b1 mu + (1 - b1) g, g <- mu / (1 - b1^t) (optax `ema`).
   RMS before momentum is what makes it LaProp (Ziyin et al. 2020, arXiv 2002.04839) rather than Adam.
4. The learning rate, ramped linearly from 0 over `warmup` updates, then constant.

    tx = laprop(4e-5)            # DreamerV3's defaults: agc 0.3, eps 1e-20, b1 0.9, b2 0.999, warmup 1000
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxlab.errors import ConfigError


def clip_by_agc(clip: float = 0.3, pmin: float = 1e-3) -> optax.GradientTransformation:
  """Adaptive gradient clipping per tensor: each update's norm is kept <= clip * max(pmin, the parameter's norm).
  clip = 0 turns it off. Needs the parameters (`tx.update(grads, state, params)`)."""
  if clip < 0 or pmin <= 0:
    raise ConfigError(f"clip_by_agc: need clip >= 0 and pmin > 0, got clip={clip}, pmin={pmin}")

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    if not clip:
      return updates, state
    if params is None:
      raise ConfigError("clip_by_agc needs the parameters: call tx.update(grads, state, params)")

    def one(u, p):
      upper = clip * jnp.maximum(pmin, jnp.linalg.norm(p.ravel()))
      return u / jnp.maximum(1.0, jnp.linalg.norm(u.ravel()) / upper)
    return jax.tree.map(one, updates, params), state
  return optax.GradientTransformation(init_fn, update_fn)


def warmup_constant(lr: float, warmup: int) -> optax.Schedule:
  """0 -> lr linearly over `warmup` updates, then lr (DreamerV3's "const" schedule with its warm-up)."""
  if not warmup:
    return optax.constant_schedule(lr)
  return optax.join_schedules([optax.linear_schedule(0.0, lr, int(warmup)), optax.constant_schedule(lr)],
                              [int(warmup)])


def laprop(lr: float = 4e-5, *, agc: float = 0.3, eps: float = 1e-20, b1: float = 0.9, b2: float = 0.999,
           warmup: int = 1000, pmin: float = 1e-3) -> optax.GradientTransformation:
  """LaProp with per-tensor adaptive gradient clipping and a linear warm-up (see the module docstring)."""
  if lr <= 0 or not 0 <= b1 < 1 or not 0 <= b2 < 1 or eps < 0 or warmup < 0:
    raise ConfigError(f"laprop: need lr > 0, b1 and b2 in [0, 1), eps >= 0 and warmup >= 0; got lr={lr}, b1={b1}, "
                      f"b2={b2}, eps={eps}, warmup={warmup}")
  return optax.chain(clip_by_agc(agc, pmin),
                     optax.scale_by_rms(decay=b2, eps=eps, eps_in_sqrt=False, bias_correction=True),
                     optax.ema(b1, debias=True),
                     optax.scale_by_learning_rate(warmup_constant(lr, warmup)))
