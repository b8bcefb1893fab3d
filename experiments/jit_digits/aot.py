"""JiT's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/jit_digits/config.py:full

The full variant: JiT-B/16 on ImageNet 256 x 256 (`train.imagenet_sample_stage` / `train._fit`). Targets: the
train step `fit` runs (EMA in the optimizer state) and one guided denoiser evaluation of the sampler.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab import compile_check
from jaxlab.nn import dit
from jaxlab.train import optim

from . import method

TOPOLOGY = "v5e-4"


def compile_targets(config):
  """The train step on global batches of train.batch_size images (float32 in [-1, 1] after the host transform
  `images.to_value_range`, int32 labels) and one sampler step at sample.batch_size."""
  cfg = method.dit_config(config)
  b = int(config.train.batch_size)
  shape = cfg.stream_shape(method.STREAM)
  model_fn = lambda rngs: dit.DiT(cfg, rngs=rngs)  # noqa: E731
  batch = {"image": jax.ShapeDtypeStruct((b, *shape), jnp.float32), "label": jax.ShapeDtypeStruct((b,), jnp.int32)}
  # model FLOPs: 3 x the forward's matmul and attention FLOPs per image (`dit.flops_per_image`) x images
  train = compile_check.train_target(
      config, model_fn, method.make_loss_fn(config), batch,
      wrap_optimizer=lambda tx: optim.with_param_ema(tx, float(config.method.ema_decay)),
      model_flops=dit.flops_per_image(cfg) * b)
  return [train, denoise_target(config, train, model_fn, cfg)]


def denoise_target(config, train, model_fn, cfg):
  """One guided denoiser evaluation at sample.batch_size: `method.make_sampler` over a single interval (its only
  step is the final Euler one, so the denoiser runs once, conditional and null-class rows in one batch)."""
  one = config.copy_and_resolve_references()
  one.sample.steps = 1
  n = int(config.sample.batch_size)
  rows = 2 * n if float(config.sample.cfg_scale) != 1.0 else n

  def step(model, noise, labels):
    graphdef, params = nnx.split(model)
    return method.make_sampler(one, graphdef)(params, noise, labels)
  noise = jax.ShapeDtypeStruct((n, *cfg.stream_shape(method.STREAM)), jnp.float32)
  labels = jax.ShapeDtypeStruct((n,), jnp.int32)
  # model FLOPs: the forward's, a third of `dit.flops_per_image`, over the denoiser's rows (2n with guidance)
  return compile_check.forward_target("denoise_step", train, model_fn, step, (noise, labels),
                                      model_flops=dit.flops_per_image(cfg) / 3 * rows)
