"""SAR's model pair (trunk + flow head), the next-token regression baseline, their losses and grouped samplers.

* `SAR`: a `SelfTokenTransformer` and a `FlowHead`; `sar_loss` draws a random partition of the raster order into
  consecutive groups per example (sizes from `group_sizes`), runs the masked two-stream forward, and trains the
  head on every token from its prediction feature (rectified flow), plus lambda * the JEPA alignment of the
  prediction features to the EMA teacher's bidirectional reference features; the teacher is then moved
  toward the trunk (`update_teacher`).
* `NextTokenRegressor`: the same trunk in one causal stream and a linear output, trained with MSE to predict
  the next token (the "next-token regression on continuous tokens" whose collapse the paper names).
* `GroupedSampler`: generation with a schedule of group sizes; each step is ONE jitted call that runs the trunk
  on the previous group's reference tokens and this group's prediction tokens against the KV cache, then the
  head's K flow steps (CFG on the head), so a schedule of S groups costs S trunk calls and S * K head steps.
  Shapes depend only on the group sizes, so a fixed-k schedule compiles two programs.
* `RegressionSampler`: greedy autoregression of the baseline with the same cache.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.ar import head as head_lib
from jaxlab.ar import masks as masks_lib
from jaxlab.ar import model as model_lib
from jaxlab.nn import dit
from jaxlab.nn import layers


class SAR(nnx.Module):
  """Trunk (`net`) and per-token flow head (`head`)."""

  def __init__(self, config: model_lib.ARConfig, head: head_lib.HeadConfig, *, rngs: nnx.Rngs):
    with nnx.use_eager_sharding(False):
      self.net = model_lib.SelfTokenTransformer(config, rngs=rngs)
      self.head = head_lib.FlowHead(head, rngs=rngs)


class NextTokenRegressor(nnx.Module):
  """The same trunk run as a causal GPT on the reference stream, a linear map to the next token."""

  def __init__(self, config: model_lib.ARConfig, *, rngs: nnx.Rngs):
    config = dataclasses.replace(config, teacher=False, mask="ref_causal")
    with nnx.use_eager_sharding(False):
      self.net = model_lib.SelfTokenTransformer(config, rngs=rngs)
      self.out = layers.dense(config.hidden, config.token_dim, names=("embed", None), use_bias=True,
                              kernel_init=layers.normal(config.init_std), rngs=rngs)

  def __call__(self, x, y):
    """(B, N, D) predictions of every token from the tokens before it (teacher forcing)."""
    f, _ = self.net(x, y, jnp.arange(x.shape[1]), kind="ref_causal")
    return self.out(f)


def jepa_loss(pred, target):
  """Mean over tokens of || pred / |pred| - target / |target| ||^2 = 2 - 2 cos (target: stop-gradient)."""
  norm = lambda a: a * jax.lax.rsqrt(jnp.sum(jnp.square(a), -1, keepdims=True) + 1e-6)  # noqa: E731
  return jnp.mean(jnp.sum(jnp.square(norm(pred.astype(jnp.float32)) -
                                     norm(jax.lax.stop_gradient(target).astype(jnp.float32))), -1))


def sar_loss(model: SAR, x, y, key, *, group_sizes: Sequence[int] = (1, 2, 4, 8), batch_mul: int = 4,
             jepa_weight: float = 0.0, ema_decay: float = 0.999, label_drop: float = 0.1):
  """(loss, metrics) of SAR on tokens x (B, N, D) with labels y (B,); see the module docstring."""
  c = model.net.config
  kg, kd, kf = jax.random.split(key, 3)
  b, n, d = x.shape
  groups = masks_lib.random_groups(kg, b, n, group_sizes)
  y_in = dit.drop_labels(kd, y, label_drop, c.num_classes)
  _, f = model.net(x, y_in, groups)
  l_flow = head_lib.flow_loss(model.head, x.reshape(b * n, d), f.reshape(b * n, -1), kf, batch_mul=batch_mul)
  metrics = {"loss_flow": l_flow}
  loss = l_flow
  if jepa_weight > 0 and model.net.teacher is not None:
    l_jepa = jepa_loss(model.net.predict_teacher(f), model.net.teacher_features(x, y_in))
    model.net.update_teacher(ema_decay)
    loss = loss + jepa_weight * l_jepa
    metrics["loss_jepa"] = l_jepa
  return loss, metrics


def regression_loss(model: NextTokenRegressor, x, y):
  """(loss, metrics): mean squared error of the next-token predictions."""
  loss = jnp.mean(jnp.square(model(x, y).astype(jnp.float32) - x.astype(jnp.float32)))
  return loss, {"loss_mse": loss}


class GroupedSampler:
  """Grouped generation with a SAR model (see the module docstring).

  Args:
    model: a `SAR` (its current parameters are used; split once here).
    head_steps: Euler steps of the head per group.
    shift: the head's time reparameterisation (`head.time_grid`).
    temperature: scale of the head's initial noise.
    cfg: classifier-free guidance scale on the head (1: none; the null label's features otherwise).
  """

  def __init__(self, model: SAR, *, head_steps: int = 20, shift: float = 1.0, temperature: float = 1.0,
               cfg: float = 1.0):
    self.graphdef, self.state = nnx.split(model)
    self.config = model.net.config
    self.cfg = float(cfg)
    guided = self.cfg != 1.0

    def prefill(state, y):
      m = nnx.merge(self.graphdef, state)
      _, cache = m.net.prefill(m.net.init_cache(y.shape[0]), y)
      return cache

    def step(state, cache, prev, prev_pos, pos, key):
      m = nnx.merge(self.graphdef, state)
      ref = jnp.concatenate([prev, prev], 0) if guided else prev
      _, f, cache = m.net.extend(cache, ref, prev_pos, pos)
      b = prev.shape[0]
      fc = f[:b].reshape(-1, f.shape[-1])
      fu = f[b:].reshape(-1, f.shape[-1]) if guided else None
      tok = head_lib.sample(m.head, fc, key, steps=head_steps, shift=shift, temperature=temperature,
                            f_uncond=fu, cfg=self.cfg)
      return tok.reshape(b, pos.shape[0], -1), cache

    self._prefill = jax.jit(prefill)
    self._step = jax.jit(step)

  def __call__(self, labels, sizes: Sequence[int], key) -> jax.Array:
    """(B, N, token_dim) tokens for labels (B,) with the group `sizes` (summing to N)."""
    c = self.config
    sizes = masks_lib.check_sizes(list(sizes), c.num_tokens)
    y = jnp.asarray(labels, jnp.int32)
    b = y.shape[0]
    if self.cfg != 1.0:
      y = jnp.concatenate([y, jnp.full_like(y, c.num_classes)])
    cache = self._prefill(self.state, y)
    prev = jnp.zeros((b, 0, c.token_dim), jnp.float32)
    prev_pos = jnp.zeros((0,), jnp.int32)
    out, start = [], 0
    for s, k in enumerate(sizes):
      pos = jnp.arange(start, start + k, dtype=jnp.int32)
      prev, cache = self._step(self.state, cache, prev, prev_pos, pos, jax.random.fold_in(key, s))
      out.append(prev)
      prev_pos, start = pos, start + k
    return jnp.concatenate(out, 1)


class RegressionSampler:
  """Greedy autoregression of a `NextTokenRegressor` through the KV cache (one token per step)."""

  def __init__(self, model: NextTokenRegressor):
    self.graphdef, self.state = nnx.split(model)
    self.config = model.net.config

    def prefill(state, y):
      m = nnx.merge(self.graphdef, state)
      f, cache = m.net.prefill(m.net.init_cache(y.shape[0]), y)
      return m.out(f[:, -1:]), cache

    def step(state, cache, prev, pos):
      m = nnx.merge(self.graphdef, state)
      f, _, cache = m.net.extend(cache, prev, pos, jnp.zeros((0,), jnp.int32), ref_causal=True)
      return m.out(f[:, -1:]), cache

    self._prefill = jax.jit(prefill)
    self._step = jax.jit(step)

  def __call__(self, labels, key=None) -> jax.Array:
    del key   # deterministic
    y = jnp.asarray(labels, jnp.int32)
    tok, cache = self._prefill(self.state, y)
    out = [tok]
    for i in range(self.config.num_tokens - 1):
      tok, cache = self._step(self.state, cache, tok, jnp.asarray([i], jnp.int32))
      out.append(tok)
    return jnp.concatenate(out, 1)


def images_per_second(sample_fn, batch: int, *, repeats: int = 3) -> float:
  """Throughput of `sample_fn()` (which returns a batch of `batch` images): compiled once, then the best of
  `repeats` timed calls (blocking on the result)."""
  jax.block_until_ready(sample_fn())
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(sample_fn())
    best = min(best, time.perf_counter() - t0)
  return batch / best


