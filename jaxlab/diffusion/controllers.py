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
* `calibrate`: Polyphonia's acoustic-informed attention calibration (Li et al., ICML 2026, arXiv 2605.10203: "source
  interpolation + acoustic modulation" of the pre-softmax cross-attention logits with an acoustic prior G, the
  target stem's share of each time-frequency cell). With the batch as [source; target] halves, G in [0, 1] per
  query token and the target-stem token j* of each pair, the target half's logits become
      l~ = (1 - G) l_src + G l_tgt            (source interpolation: outside the stem the source's attention)
      l^_{j*} = l~_{j*} + gamma G             (acoustic modulation, modulation="linear": the paper's E + lambda B
                                               with B = G (x) m_text, m_text the one-hot of the stem's token;
                                               the official code's lambda = mask_bias_strength = 2.5)
      l^_{j*} = l~_{j*} + gamma log(G + eps)   (modulation="log": a reconstruction that also suppresses j*
                                               outside the stem; kept as an option)
  in the chosen layers and timestep range. `mode="probs"` applies the same rule after the softmax (a negative
  control: the paper calibrates before it).
* `stem_bias` and `interpolate_source`: the official code's layout of the same two operations (Ltx-Leif/
  polyphonia, `edit.py` `_masked_cross_attention` and `utils.py` `apply_asr`): the bias + gamma G_g on the
  word-aligned cross-attention for EVERY stem phrase g of the target prompt, each with its own stem's prior, and no
  interpolation there; the source interpolation on the SELF-attention logits instead (the edited stem's prior per
  query, the source branch's queries and keys, the edited branch's values). A controller sees whichever logits the
  model hands it: `jaxlab.audio.model.TextToSpec` takes one controller for the cross- and one for the
  self-attention.
* `compose`: controllers applied in order.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
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


def _layer_filter(layers: Sequence[int] | None):
  keep = None if layers is None else {int(i) for i in layers}
  return lambda layer: keep is None or layer in keep


def inject_source(tokens: Sequence[int], *, layers: Sequence[int] | None = None,
                  t_range: tuple[int, int] | None = None) -> Controller:
  """P2P-style injection: in the target half of the batch, the logits of context positions `tokens` become the
  source half's, in `layers` (None: all) while the timestep is in `t_range` (None: always)."""
  cols = sorted({int(j) for j in tokens})
  if not cols or min(cols) < 0:
    raise ConfigError(f"inject_source: tokens={tokens} must be non-empty context positions")
  active = _layer_filter(layers)

  def control(logits, layer, step, ctx):
    del ctx
    if not active(layer):
      return logits
    if max(cols) >= logits.shape[-1]:
      raise ConfigError(f"inject_source: token position {max(cols)} >= context length {logits.shape[-1]}")
    src, tgt = _halves(logits)
    on = _halves(step_in_range(step, t_range))[1][:, None, None, None]
    sel = jnp.zeros((logits.shape[-1],), bool).at[jnp.asarray(cols)].set(True)
    new_tgt = jnp.where(on & sel, src, tgt)
    return jnp.concatenate([src, new_tgt], axis=0)
  return control


def calibrate(*, gamma: float = 1.0, eps: float = 1e-2, layers: Sequence[int] | None = None,
              t_range: tuple[int, int] | None = None, mode: str = "logits", modulation: str = "log") -> Controller:
  """Polyphonia's calibration (see the module docstring) on a [source; target] batch.

  ctx: "prior" (B/2, L) float in [0, 1], M per query token in the model's token order (a stem mask pooled to the
  layer's grid); "target" (B/2,) int, the position j* of the edited stem's token in the prompt; for mode "probs"
  also "mask" (B/2, S) bool, the prompt's valid tokens (the hook sees logits before the padding mask).
  gamma = 0 turns the modulation off; a prior of ones reduces the rule to the plain target logits up to a constant
  shift of j* (gamma, or gamma log(1 + eps))."""
  if mode not in ("logits", "probs"):
    raise ConfigError(f"calibrate: mode={mode!r}; use 'logits' (the paper) or 'probs' (the post-softmax control)")
  if modulation not in ("linear", "log"):
    raise ConfigError(f"calibrate: modulation={modulation!r}; use 'linear' (the paper: + gamma G) or 'log' "
                      "(+ gamma log(G + eps))")
  if eps <= 0 or gamma < 0:
    raise ConfigError(f"calibrate: need eps > 0 and gamma >= 0, got eps={eps}, gamma={gamma}")
  active = _layer_filter(layers)

  def control(logits, layer, step, ctx):
    if not active(layer):
      return logits
    for k in ("prior", "target") + (("mask",) if mode == "probs" else ()):
      if k not in ctx:
        raise ConfigError(f"calibrate: ctx needs {k!r} (see the docstring)")
    src, tgt = _halves(logits)
    prior = jnp.asarray(ctx["prior"], jnp.float32)
    if prior.shape != (tgt.shape[0], tgt.shape[2]):
      raise ConfigError(f"calibrate: prior {prior.shape} must be (pairs={tgt.shape[0]}, queries={tgt.shape[2]}); "
                        "pool the mask to the layer's token grid")
    m = prior[:, None, :, None]
    sel = (jnp.arange(tgt.shape[-1])[None, :] == jnp.asarray(ctx["target"])[:, None])[:, None, None, :]
    shift = gamma * (m if modulation == "linear" else jnp.log(m + eps)) * sel
    if mode == "logits":
      new = (1.0 - m) * src + m * tgt + shift
    else:
      valid = jnp.asarray(ctx["mask"], bool)[:, None, None, :]
      neg = jnp.finfo(jnp.float32).min
      ps, pt = (jax.nn.softmax(jnp.where(valid, v, neg), axis=-1) for v in (src, tgt))
      new = jnp.log((1.0 - m) * ps + m * pt + 1e-30) + shift
    on = _halves(step_in_range(step, t_range))[1][:, None, None, None]
    return jnp.concatenate([src, jnp.where(on, new, tgt)], axis=0)
  return control


def _target_half_rule(name: str, key: str, want, rule, layers, t_range) -> Controller:
  """A [source; target] controller: in `layers` and `t_range`, the target half becomes `rule(src, tgt, x)` with
  x = ctx[key] (float32, of shape `want(tgt)`, named by `want.names`); the source half is unchanged."""
  active = _layer_filter(layers)

  def control(logits, layer, step, ctx):
    if not active(layer):
      return logits
    if key not in ctx:
      raise ConfigError(f"{name}: ctx needs {key!r} ({', '.join(want.names)})")
    src, tgt = _halves(logits)
    x = jnp.asarray(ctx[key], jnp.float32)
    shape = want(tgt)
    if x.shape != shape:
      raise ConfigError(f"{name}: {key} {x.shape} must be ("
                        + ", ".join(f"{n}={d}" for n, d in zip(want.names, shape)) + ")")
    on = _halves(step_in_range(step, t_range))[1][:, None, None, None]
    return jnp.concatenate([src, jnp.where(on, rule(src, tgt, x), tgt)], axis=0)
  return control


def _per_pair_position_query(tgt):
  return (tgt.shape[0], tgt.shape[3], tgt.shape[2])


def _per_pair_query(tgt):
  return (tgt.shape[0], tgt.shape[2])


_per_pair_position_query.names = ("pairs", "positions", "queries")
_per_pair_query.names = ("pairs", "queries")


def stem_bias(*, gamma: float, layers: Sequence[int] | None = None,
              t_range: tuple[int, int] | None = None) -> Controller:
  """The official per-stem acoustic modulation on a [source; target] batch: in the target half, the logit of
  context position j for query l gains gamma * G[b, j, l], G the prior of the stem whose phrase sits at j; linear
  in G, every stem at once, no interpolation; the source half is unchanged.

  ctx: "stem_priors" (B/2, S, L) float in [0, 1]: per prompt position the prior of its stem pooled to the
  layer's query tokens (0 where a position names no stem: nothing is added there)."""
  if gamma < 0:
    raise ConfigError(f"stem_bias: gamma={gamma} must be >= 0")
  return _target_half_rule("stem_bias", "stem_priors", _per_pair_position_query,
                           lambda src, tgt, g: tgt + gamma * jnp.swapaxes(g, 1, 2)[:, None], layers, t_range)


def interpolate_source(*, layers: Sequence[int] | None = None,
                       t_range: tuple[int, int] | None = None) -> Controller:
  """The official source interpolation (`apply_asr`) on a [source; target] batch: the target half's logits become
  (1 - G) l_src + G l_tgt per query token (inside the edited stem the target's attention, outside it the
  source's); meant for the self-attention logits (B, heads, L, L). ctx: "prior" (B/2, L) in [0, 1], the edited
  stem's prior in the model's token order. Equal to `calibrate(gamma=0, modulation="linear")`."""
  def rule(src, tgt, prior):
    m = prior[:, None, :, None]
    return (1.0 - m) * src + m * tgt
  return _target_half_rule("interpolate_source", "prior", _per_pair_query, rule, layers, t_range)


def compose(*controllers: Controller) -> Controller:
  """The controllers applied in order to the same logits."""
  def control(logits, layer, step, ctx):
    for c in controllers:
      logits = c(logits, layer, step, ctx)
    return logits
  return control
