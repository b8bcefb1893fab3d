"""Attention controllers: functions of the pre-softmax cross-attention logits, per layer and diffusion step.

A controller is `controller(logits, layer, step, ctx) -> logits` where logits are the float32 pre-softmax
cross-attention logits (B, heads, L, S) of one block (L queries, S context tokens), `layer` the block's index
(a Python int: 0 for the first block with cross-attention), `step` the (B,) int32 diffusion timesteps of the
call and `ctx` a dict the caller passes through (masks, token positions, anything a rule needs). The DiT core
(`jaxlab.nn.dit`) calls one `logit_hook(logits)` per block; `LayerHook` adapts a controller to it by counting
the blocks as they are traced (so the model's blocks must be unrolled, not scanned). Without a controller the
model passes no hook at all, so outputs are bit-identical to an uncontrolled model.

* `identity`: returns the logits (the no-op; also bit-identical).
* `inject_source`: prompt-to-prompt-style injection (Hertz et al. 2023, "Prompt-to-Prompt Image Editing with
  Cross Attention Control"): the batch holds a source half and a target half ([source; target], the pairs
  edited together); in the target half the logits of the chosen context tokens are replaced by the source
  half's, in the chosen layers and timestep range, so those tokens attend where they did in the source.
  P2P copies the post-softmax maps of the whole prompt; copying chosen pre-softmax columns is the form a logit
  hook allows (with all columns copied the two are the same).
* `compose`: controllers applied in order.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax.numpy as jnp

from jaxlab.errors import ConfigError

Controller = Callable[[Any, int, Any, dict], Any]


def identity(logits, layer, step, ctx):
  del layer, step, ctx
  return logits


class LayerHook:
  """A `logit_hook` for one model call that hands each block's logits to `controller` with the block's index.

  Counts the calls while the model is traced: block i of an unrolled stack is the i-th call."""

  def __init__(self, controller: Controller, step, ctx: dict | None = None):
    self.controller, self.step, self.ctx = controller, step, dict(ctx or {})
    self.layer = 0

  def __call__(self, logits):
    out = self.controller(logits, self.layer, self.step, self.ctx)
    if out.shape != logits.shape:
      raise ConfigError(f"attention controller: returned logits of shape {out.shape} for {logits.shape} (layer "
                        f"{self.layer}); a controller must keep (batch, heads, queries, tokens)")
    self.layer += 1
    return out


def step_in_range(step, t_range: tuple[int, int] | None):
  """(B,) bool: the timestep is inside the inclusive range (all True without one)."""
  step = jnp.asarray(step)
  if t_range is None:
    return jnp.ones(step.shape, bool)
  lo, hi = t_range
  return (step >= lo) & (step <= hi)


def _halves(x):
  b = x.shape[0]
  if b % 2:
    raise ConfigError(f"attention controller: the batch {b} must be [source; target] halves of equal size")
  return x[:b // 2], x[b // 2:]


def inject_source(tokens: Sequence[int], *, layers: Sequence[int] | None = None,
                  t_range: tuple[int, int] | None = None) -> Controller:
  """P2P-style injection: in the target half of the batch, the logits of context positions `tokens` become the
  source half's, in `layers` (None: all) while the timestep is in `t_range` (None: always)."""
  cols = sorted({int(j) for j in tokens})
  if not cols or min(cols) < 0:
    raise ConfigError(f"inject_source: tokens={tokens} must be non-empty context positions")
  keep = None if layers is None else {int(i) for i in layers}

  def control(logits, layer, step, ctx):
    del ctx
    if keep is not None and layer not in keep:
      return logits
    if max(cols) >= logits.shape[-1]:
      raise ConfigError(f"inject_source: token position {max(cols)} >= context length {logits.shape[-1]}")
    src, tgt = _halves(logits)
    on = _halves(step_in_range(step, t_range))[1][:, None, None, None]
    sel = jnp.zeros((logits.shape[-1],), bool).at[jnp.asarray(cols)].set(True)
    new_tgt = jnp.where(on & sel, src, tgt)
    return jnp.concatenate([src, new_tgt], axis=0)
  return control


def compose(*controllers: Controller) -> Controller:
  """The controllers applied in order to the same logits."""
  def control(logits, layer, step, ctx):
    for c in controllers:
      logits = c(logits, layer, step, ctx)
    return logits
  return control
