"""Latent Forcing's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/latent_forcing/config.py:full \
        [--config.latent.dinov2.path=DIR]

The full variant (`full.run_fit`): LF-DiT-LM/16 on ImageNet 256 x 256 with the DINOv2 latent ENCODED IN THE
TRAIN STEP: the model is `full.LFModel` (the DiT beside a `Dinov2Module` whose weights the optimizer freezes,
`full.freeze_encoder`), the latent of each flipped image is `stop_gradient`-ed and normalised inside the loss.
Without a checkpoint directory the shape of DINOv2-B/14 with registers (`dinov2.Dinov2Config()`, as
facebook/dinov2-with-registers-base's config.json) stands in; the normaliser's statistics (stage
"latent_stats") are placeholders of their shape. The other latents of `full._latent_setup` are wired the same
way: precomputed (the batch carries "latent"), pixel-downsample (in the step), none (zeros).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import compile_check
from jaxlab.diffusion import guidance
from jaxlab.encoders import LatentNormalizer, PixelDownsample, PrecomputedLatents, dinov2
from jaxlab.nn import dit
from jaxlab.train import optim

from . import full, method

# v5e-4 does not fit the train step (24.2 GiB per chip, 16.5 GiB of it temporaries); v5e-16 fits with 0.3 GiB to
# spare; v5p-8 (4 chips of 95 GiB) with room.
TOPOLOGY = "v5p-8"


def encoder_config(config) -> dinov2.Dinov2Config:
  """The checkpoint's architecture when latent.dinov2.path is given, else DINOv2-B/14 with 4 registers."""
  path = config.latent.dinov2.path
  return dinov2.Dinov2Config.from_json(full._dinov2_config_path(path)) if path else dinov2.Dinov2Config()


def latent_setup(config, arm):
  """(latent spec, encoder config or None, latent_fn or None, abstract "latent" batch entry or None) of an arm,
  as `full._latent_setup` builds them, without the data source or the measured statistics."""
  kind, g = method.arm_spec(arm)[1], method.grid(config)
  if kind == "pixel":
    p = config.latent.pixel
    pd = PixelDownsample(int(p.factor), (g[0] * int(p.patch), g[1] * int(p.patch)))
    ch = pd.channels(int(config.model.channels), (method.image_size(config),) * 2)
    return method.latent_spec(config, kind, ch), None, lambda model, x: pd.encode(x), None
  pre = config.latent.full == "precomputed"
  if pre and config.latent.precomputed.path:
    lat = PrecomputedLatents(config.latent.precomputed.path).latents
    ch, dtype = lat.shape[-1], lat.dtype
  else:
    ch, dtype = encoder_config(config).hidden_size, np.float32
  spec = method.latent_spec(config, kind, ch)
  shape = (g[0] * spec.patch, g[1] * spec.patch, ch)
  if kind == "none":
    return spec, None, lambda model, x: jnp.zeros((x.shape[0], *shape), x.dtype), None
  if pre:
    return spec, None, None, jax.ShapeDtypeStruct((int(config.train.batch_size), *shape), dtype)
  enc = encoder_config(config)
  norm = LatentNormalizer(np.zeros(ch, np.float32), np.ones(ch, np.float32), 1.0)   # stage latent_stats' shape
  return spec, enc, lambda model, x: norm(model.encoder(x)), None


def encoder_flops(config, enc: dinov2.Dinov2Config, images: int) -> float:
  """Forward FLOPs of the frozen DINOv2 over `images` (2 N per token + attention; CLS + registers + patches)."""
  n = sum(math.prod(s) for s in dinov2.param_shapes(enc).values())
  tokens = 1 + enc.num_register_tokens + (int(config.latent.dinov2.input_size) // enc.patch_size) ** 2
  return compile_check.transformer_flops(n, images * tokens, enc.num_hidden_layers, tokens, enc.hidden_size,
                                         backward=False)


def compile_targets(config):
  """Per arm: the train step on global batches of train.batch_size images (float32 in [-1, 1] after the host
  transform `images.to_value_range`, int32 labels) and one guided denoiser evaluation at sample.batch_size."""
  targets = []
  b = int(config.train.batch_size)
  for arm in config.method.arms:
    spec, enc, latent_fn, latent = latent_setup(config, arm)
    cfg, build = full.model_fn(config, arm, spec, enc)
    batch = {"image": jax.ShapeDtypeStruct((b, *cfg.stream_shape(method.PIXEL)), jnp.float32),
             "label": jax.ShapeDtypeStruct((b,), jnp.int32)}
    if latent is not None:
      batch["latent"] = latent

    def wrap(tx, enc=enc):   # `full.run_fit`'s
      return optim.with_param_ema(full.freeze_encoder(tx) if enc is not None else tx, float(config.method.ema_decay))
    # model FLOPs: the DiT's training FLOPs per image (`dit.flops_per_image`: 3 x forward) x images, plus the
    # frozen encoder's forward (`encoder_flops`) when it runs in the step
    flops = dit.flops_per_image(cfg) * b + (encoder_flops(config, enc, b) if enc is not None else 0.0)
    train = compile_check.train_target(config, build, method.make_loss_fn(config, arm, latent_fn), batch,
                                       wrap_optimizer=wrap, model_flops=flops, name=f"train_step_{arm}")
    targets.append(train)
    if config.sample.guidance == "cfg":   # autoguidance needs the smaller run's model: left out
      targets.append(denoise_target(config, arm, train, build, cfg))
  return targets


def denoise_target(config, arm, train, build, cfg):
  """One guided denoiser evaluation at sample.batch_size: the EMA DiT (no encoder: `method.ema_dit`) on the
  conditional and null-label rows in one batch, combined per stream by `guidance.combine`, both streams
  returned, as `method.make_sampler`'s cfg denoiser does at each of its Heun / Euler evaluations. (Its
  one-interval sampler would do one evaluation too, but returns only the pixels, so XLA drops the latent head.)"""
  s, n, nc = config.sample, int(config.sample.batch_size), int(config.data.num_classes)
  scales = {method.PIXEL: float(s.cfg_pixel), method.LATENT: float(s.cfg_latent)}
  intervals = {method.PIXEL: tuple(s.interval_pixel), method.LATENT: tuple(s.interval_latent)}
  guided = any(v != 1.0 for v in scales.values())

  def step(model, z, t, labels):
    net, y = method._dit(model), method.labels_for(config, labels)  # pylint: disable=protected-access
    if not guided:
      return net(z, t, y)
    both = net({k: jnp.concatenate([v, v]) for k, v in z.items()}, {k: jnp.concatenate([v, v]) for k, v in t.items()},
               jnp.concatenate([y, jnp.full_like(y, nc)]))
    return guidance.combine({k: v[:n] for k, v in both.items()}, {k: v[n:] for k, v in both.items()}, t, scales,
                            intervals)
  streams = (method.PIXEL, method.LATENT)
  z = {k: jax.ShapeDtypeStruct((n, *cfg.stream_shape(k)), jnp.float32) for k in streams}
  t = {k: jax.ShapeDtypeStruct((n,), jnp.float32) for k in streams}
  labels = jax.ShapeDtypeStruct((n,), jnp.int32)
  # model FLOPs: the DiT's forward, a third of `dit.flops_per_image`, over its rows (2n with guidance)
  target = compile_check.forward_target(f"denoise_step_{arm}", train, build, step, (z, t, labels),
                                        model_flops=dit.flops_per_image(cfg) / 3 * (2 * n if guided else n))
  params = train.state.params
  if full.ENCODER in params:   # report the DiT's parameters: the sampler never reads the encoder's
    target.state = {k: v for k, v in params.items() if k != full.ENCODER}
  return target
