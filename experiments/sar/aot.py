"""SAR's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/sar/config.py:full

The full variant trains on precomputed KL-16 latents (16 x 16 x 16: 256 tokens of 16 channels, scaled by
tokens.scale on the host); the train step sees {"tokens": (B, 256, 16) float32, "label": (B,) int32}. The sampling
target is one step of `jaxlab.ar.generate.GroupedSampler` (the trunk on the previous group's reference tokens and
the next group's prediction tokens against a filled KV cache, then the head's Euler steps with CFG).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab import compile_check
from jaxlab import mesh as mesh_lib
from jaxlab.ar import generate as gen
from jaxlab.train import optim

from . import method

# The smallest v5p slice the shipped batch (2048 images of 64 + 2 x 256 trunk tokens, 4 head draws per token) fits:
# 64 images per chip need 69 GiB of activations (no remat option in the trunk); on v5p-8 (512 per chip) 445 GiB.
TOPOLOGY = "v5p-64"
GRID, TOKEN_DIM = (16, 16), 16   # MAR's KL-16 latents of 256 x 256 ImageNet


def _count(params, *needles, skip=()) -> int:
  """Parameters whose path contains every needle and none of `skip`."""
  total = 0
  for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    s = jax.tree_util.keystr(path)
    if all(n in s for n in needles) and not any(k in s for k in skip):
      total += x.size
  return total


def _sample_step(config, k: int):
  """`(model, prev (B, k, D), start) -> (tokens (B, k, D), cache)`: the sampler's jitted step for the group at
  positions start .. start + k - 1 after the group `prev` at start - k (the KV cache filled up to it)."""
  s = config.sample

  def fn(model, prev, start):
    sampler = gen.GroupedSampler(model, head_steps=int(s.head_steps), shift=float(s.shift),
                                 temperature=float(s.temperature), cfg=float(s.cfg))
    c = model.net.config
    rows = prev.shape[0] * (2 if float(s.cfg) != 1.0 else 1)
    cache = model.net.init_cache(rows)
    kv = mesh_lib.logical_sharding((None, "batch", None, None, None))
    cache = cache.replace(k=jax.lax.with_sharding_constraint(cache.k, kv),
                          v=jax.lax.with_sharding_constraint(cache.v, kv), length=c.num_prefix + start - k)
    idx = jnp.arange(k, dtype=jnp.int32)
    step = sampler._step  # pylint: disable=protected-access  (the sampler's own jitted step, not a copy)
    return step(sampler.state, cache, prev, start - k + idx, start + idx, jax.random.key(0))
  return fn


def compile_targets(config):
  """The SAR train step (random groups, flow head with batch_mul draws, JEPA teacher) and one sampler step."""
  b, n, m = int(config.train.batch_size), GRID[0] * GRID[1], int(config.model.num_prefix)
  depth, d = int(config.model.depth), int(config.model.hidden)
  batch = {"tokens": jax.ShapeDtypeStruct((b, n, TOKEN_DIM), jnp.float32),
           "label": jax.ShapeDtypeStruct((b,), jnp.int32)}
  model_fn = method.make_model_fn(config, "sar", TOKEN_DIM, GRID)
  ema = lambda tx: optim.with_param_ema(tx, float(config.method.ema_decay))  # noqa: E731  (as train._fit)
  train = compile_check.train_target(config, model_fn, method.make_loss_fn(config, "sar"), batch, wrap_optimizer=ema)
  params = train.state.params
  blocks, head = _count(params, "trunk", "blocks"), _count(params, "head")
  # Model FLOPs (class / position tables are lookups, left out): the student trunk on m + 2n tokens (prefix,
  # reference and prediction streams, dense masked attention), forward + backward; the JEPA teacher on m + n
  # tokens, forward only, and the predictor on n; the flow head on n * batch_mul rows per image.
  seq, teacher_seq = m + 2 * n, m + n
  flops = compile_check.transformer_flops(blocks, b * seq, depth, seq, d)
  flops += 6 * head * b * n * int(config.method.batch_mul)
  if float(config.method.jepa_weight) > 0:
    flops += compile_check.transformer_flops(blocks, b * teacher_seq, depth, teacher_seq, d, backward=False)
    flops += 6 * _count(params, "predictor") * b * n
  train.model_flops = flops
  targets = [train]
  # One sampler step at sample.batch_size images and the largest group of sample.tokens_per_step (shapes and cost
  # are the same for every group: the mask covers all m + n cache slots): 2 k trunk tokens per row (CFG doubles
  # the rows) against m + n + 2 k keys, forward; the head's feature projection once and head_steps velocity
  # evaluations on k tokens per row (the time embedding, one row per Euler step, left out).
  s = config.sample
  k, bs = max(int(t) for t in s.tokens_per_step), int(s.batch_size)
  rows = bs * (2 if float(s.cfg) != 1.0 else 1)
  velocity = _count(params, "head", skip=("c_in", "t1", "t2"))
  sample_flops = (compile_check.transformer_flops(blocks, rows * 2 * k, depth, m + n + 2 * k, d, backward=False)
                  + 2 * _count(params, "head", "c_in") * rows * k + 2 * velocity * rows * k * int(s.head_steps))
  targets.append(compile_check.forward_target(
      f"sample_step_k{k}", train, model_fn, _sample_step(config, k),
      (jax.ShapeDtypeStruct((bs, k, TOKEN_DIM), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32)),
      model_flops=sample_flops))
  return targets
