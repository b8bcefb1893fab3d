"""Latent Forcing, the pieces: data and latents, the two-stream DiT, the per-arm loss, the samplers, the scores.

The model side is the shared core: `jaxlab.nn.dit.DiT` with two streams ("pixel", "latent") on one token grid,
`jaxlab.diffusion.flow` (t = 1 clean; x-prediction; v-loss; Heun; the cascaded and balanced time tables),
`jaxlab.diffusion.stream_times` (the official training-time samplers), `jaxlab.diffusion.guidance`,
`jaxlab.encoders` (the frozen latents) and the judge (judge-feature Frechet distance, class entropy): the 28x28
MNIST kit (`jaxlab.evals.mnist_kit`, shared with every experiment on that data) or, for the 8x8 digits of v1
(variant tiny_v1), `jaxlab.evals.judge` (the cached digits MLP shared with jit_digits).

The loss of one batch (official `DenoiserCoT.forward`): times and per-example stream weights from the arm's
training-time sampler; z_s = t_s x_s + (1 - t_s) eps_s; x_hat = DiT(z, t, y);
L = v_loss_pixel(weight w_pixel) + lambda_lat v_loss_latent(weight w_latent), each a batch mean of per-example
element means (not renormalised by the weights, as the official code). The pixel-only arm is plain JiT: its
latent input is zeroed (so the model is the same network with an input that carries nothing) and its loss is off.
"""

from __future__ import annotations

import dataclasses
import os
import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from jaxlab import cache
from jaxlab import metrics as metrics_lib
from jaxlab.data import ArraySource
from jaxlab.data import mnist as mnist_lib
from jaxlab.diffusion import flow, guidance
from jaxlab.diffusion import generate as generate_lib
from jaxlab.diffusion.stream_times import StreamTimes
from jaxlab.encoders import LatentNormalizer, PixelDownsample, TinySemanticEncoder, encode_batched
from jaxlab.encoders import train_semantic_encoder
from jaxlab.errors import ConfigError
from jaxlab.evals import frechet
from jaxlab.evals import image_scorer
from jaxlab.nn import dit
from jaxlab.train import fit, optim

from . import config as config_lib

PIXEL, LATENT = "pixel", "latent"


def arm_spec(arm: str) -> tuple[str, str, str]:
  """(training-time mode, latent kind, sampler kind) of an arm (`config.ARMS`)."""
  return config_lib.ARMS[arm]


# ----------------------------------------------------------------------------------------------- data


def digits(config) -> tuple[dict, dict]:
  """(train, held-out) digit images in [-1, 1]: MNIST (data.name "mnist": 4,500 / 500, zero-padded to
  data.pad_to) or sklearn's 8x8 digits ("digits") (`jaxlab.evals.image_scorer.splits`)."""
  return image_scorer.splits(config.data)


def digits_spec(config) -> dict:
  """What the 8x8 digits split depends on (the key of the cached judge and encoder)."""
  return image_scorer.digits_spec(config.data)


def data_spec(config) -> dict:
  """What the training split depends on (the key of the cached semantic encoder): the MNIST split and its
  padding (`jaxlab.data.mnist.spec`) or the digits split (`digits_spec`)."""
  d = config.data
  if d.name == "mnist":
    return mnist_lib.spec(int(d.held_per_class), int(d.split_seed), int(d.pad_to))
  return digits_spec(config)


def image_size(config) -> int:
  return config_lib.image_size(config)


def grid(config) -> tuple[int, int]:
  g = image_size(config) // int(config.model.patch)
  return (g, g)


# ---------------------------------------------------------------------------------------------- judge


def scorer(config, train: dict) -> image_scorer.Scorer:
  """The judge of the data split (`jaxlab.evals.image_scorer`: MNIST, the 28x28 kit's CNN, FD against its 4,500
  training digits, 32 x 32 samples cropped to the centred 28 x 28; 8x8 digits, the digits judge MLP), built once
  per process. Its floor draws n real digits at random, not class-balanced: the samples are unconditional."""
  return image_scorer.scorer(config, train)


PIXEL_FD_SIDE = 8   # MNIST's pixel-space FD is taken on the images area-pooled to 8 x 8 (64 numbers, as the digits')


def pixel_fd(config, samples: np.ndarray, train: dict) -> float:
  """FD of the samples to the training images in pixel space (a judge-free check): the raw 64 pixels of the 8x8
  digits; MNIST area-pooled to 8x8 first (1,024 raw pixels would need far more than the samples to estimate their
  covariance)."""
  def flat(x):
    x = np.asarray(x, np.float32)
    if config.data.name == "mnist":
      f = x.shape[1] // PIXEL_FD_SIDE
      x = x.reshape(len(x), PIXEL_FD_SIDE, f, PIXEL_FD_SIDE, f, -1).mean(axis=(2, 4))
    return x.reshape(len(x), -1)
  return frechet.frechet_from_features(flat(samples), flat(train["image"]))


# -------------------------------------------------------------------------------------------- latents


@dataclasses.dataclass(frozen=True)
class LatentSpec:
  """A latent kind on the token grid: its channels and its patch (latent grid = token grid x patch)."""
  kind: str
  channels: int
  patch: int


def semantic_encoder(config, train: dict) -> tuple[TinySemanticEncoder, bool]:
  """The frozen semantic encoder of the data split (trained once with latent.semantic's seed, then cached)."""
  s = config.latent.semantic
  nc = int(config.data.num_classes)
  kw = dict(channels=int(s.channels), width=int(s.width), stride=int(s.stride), depth=int(s.depth), pool=int(s.pool),
            latent=s.latent,
            steps=int(s.steps),
            batch_size=int(s.batch_size), learning_rate=float(s.learning_rate), seed=int(s.seed))
  spec = data_spec(config)    # the data split (and MNIST's padding) in the key: no 8x8 / MNIST collision
  prefix = "digits" if config.data.name == "digits" else spec["name"]
  file = cache.path("encoders", f"{prefix}_semantic_{cache.digest({'data': spec, **kw})}.npz",
                    config.judge.cache_dir)

  def abstract():
    return TinySemanticEncoder(1, kw["channels"], nc, width=kw["width"], stride=kw["stride"], depth=kw["depth"],
                               pool=kw["pool"], latent=kw["latent"], rngs=nnx.Rngs(0))
  return cache.load_or_build(file, abstract, lambda: train_semantic_encoder(
      train["image"], train["label"], num_classes=nc, **kw)[0], what="semantic encoder")


def digits_latents(config, train: dict, kinds, held: dict | None = None) -> dict[str, Any]:
  """Latents of every training image for each kind in `kinds` ("semantic", "pixel"), on the token grid:
  {kind: (N, h, w, c) float32} (and {kind}_held for the held-out images when given) plus "semantic_acc" (the
  encoder's training accuracy; "semantic_held_acc" on the held-out images when given) and the semantic
  normaliser's statistics. The semantic latent is standardised per
  channel (training-image statistics) and rescaled to the pixels' RMS (latent.match_pixel_norm; the official
  0.485); the pixel-downsample latent is left in the pixels' own scale, as the official
  `PixelDownsampleEncoder` leaves it unnormalised."""
  out = {}
  x = np.asarray(train["image"], np.float32)
  parts = {"": x} if held is None else {"": x, "_held": np.asarray(held["image"], np.float32)}
  g = grid(config)
  if "semantic" in kinds:
    enc, _ = semantic_encoder(config, train)
    raw = {k: encode_batched(enc.encode, v) for k, v in parts.items()}
    norm = LatentNormalizer.fit(raw[""], pixels=x if config.latent.match_pixel_norm else None)
    for k, v in raw.items():
      out["semantic" + k] = _upsample_to(np.asarray(norm(jnp.asarray(v)), np.float32),
                                         _latent_grid(config, "semantic", g))
    out["semantic_mean"], out["semantic_std"] = norm.mean, norm.std
    out["semantic_scale"] = norm.scale
    pred = encode_batched(lambda v: jnp.argmax(enc(v), -1), x)   # batched: 4,500 MNIST maps at once are large
    out["semantic_acc"] = float(np.mean(pred == np.asarray(train["label"])))
    if held is not None:
      pred = encode_batched(lambda v: jnp.argmax(enc(v), -1), parts["_held"])
      out["semantic_held_acc"] = float(np.mean(pred == np.asarray(held["label"])))
  if "pixel" in kinds:
    pd = PixelDownsample(int(config.latent.pixel.factor), _latent_grid(config, "pixel", g))
    for k, v in parts.items():
      out["pixel" + k] = encode_batched(pd.encode, v)
  return out


def _upsample_to(z: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  """Nearest-neighbour upsampling of a coarser latent grid (N, h, w, c) to `size` (a multiple of it): a global
  (1 x 1) latent is repeated on every token."""
  h, w = z.shape[1:3]
  if (h, w) == tuple(size) or size[0] % h or size[1] % w:
    return z
  return np.repeat(np.repeat(z, size[0] // h, axis=1), size[1] // w, axis=2)


def _latent_grid(config, kind: str, g: tuple[int, int]) -> tuple[int, int]:
  p = int(config.latent[kind].patch)
  return (g[0] * p, g[1] * p)


def latent_spec(config, kind: str, channels: int) -> LatentSpec:
  """The spec of latent `kind` ("none" borrows the semantic latent's shape, zeroed in the loss)."""
  src = "semantic" if kind == "none" else kind
  if config.data.name == "imagenet2012" and src == "semantic":
    src = config.latent.full
  return LatentSpec(kind, int(channels), int(config.latent[src].patch))


def check_latent_grid(config, name: str, latents: np.ndarray, patch: int) -> None:
  """The latent grid must be the token grid times the latent patch."""
  g = grid(config)
  want = (g[0] * patch, g[1] * patch)
  if tuple(latents.shape[1:3]) != want:
    raise ConfigError(f"the {name} latent grid {tuple(latents.shape[1:3])} is not the token grid {g} x latent "
                      f"patch {patch} = {want}: change model.patch or the latent's patch / stride / factor")


# ------------------------------------------------------------------------------------------------ DiT


def dit_config(config, lat: LatentSpec) -> dit.DiTConfig:
  m = config.model
  nc = int(config.data.num_classes) if config.data.conditional else 0
  return dit.DiTConfig(
      streams={PIXEL: (int(m.channels), int(m.patch)), LATENT: (lat.channels, lat.patch)}, grid=grid(config),
      hidden=int(m.hidden), depth=int(m.depth), heads=int(m.heads), mlp_ratio=float(m.mlp_ratio),
      bottleneck=int(m.bottleneck), num_classes=nc, class_tokens=int(m.class_tokens),
      in_context_start=int(m.in_context_start), head_depth=int(m.head_depth), head_hidden=int(m.head_hidden) or None,
      dtype=m.dtype, attention=m.attention, remat=bool(m.remat))


def stream_times(config, arm: str) -> StreamTimes:
  me = config.method
  return StreamTimes(mode=arm_spec(arm)[0], pixel=PIXEL, latent=LATENT, p_latent=float(me.p_latent),
                     latent_mean=float(me.latent_mean), latent_std=float(me.latent_std),
                     pixel_mean=float(me.pixel_mean), pixel_std=float(me.pixel_std), p_uniform=float(me.p_uniform),
                     uniform_max=float(me.uniform_max), latent_noise=float(me.latent_noise),
                     independent_shift=float(me.independent_shift))


def labels_for(config, y):
  """The DiT's labels: y when conditional, else the null label (0 of a 0-class table)."""
  return y if config.data.conditional else jnp.zeros_like(y)


def make_loss_fn(config, arm: str, latent_fn=None):
  """`(model, batch, key) -> (loss, metrics)` for `jaxlab.train.fit`.

  batch: {"image": (B, H, W, C), "label": (B,), "latent": (B, h, w, c)} (or no "latent" when `latent_fn(model,
  image) -> latent` encodes it in the step, e.g. a frozen DINOv2 inside the model)."""
  me = config.method
  sampler = stream_times(config, arm)
  zero_latent = arm_spec(arm)[1] == "none"
  nc = int(config.data.num_classes)
  lam = float(me.lambda_lat)

  def loss_fn(model, batch, key):
    x, y = batch["image"], batch["label"]
    k_t, k_p, k_l, k_y, k_f = jax.random.split(key, 5)
    if me.flip:   # random horizontal flips (ImageNet), drawn from the step key, before the latent is encoded
      flip = jax.random.bernoulli(k_f, 0.5, (x.shape[0], 1, 1, 1))
      x = jnp.where(flip, x[:, :, ::-1], x)
    lat = batch["latent"] if latent_fn is None else jax.lax.stop_gradient(latent_fn(model, x))
    if zero_latent:
      lat = jnp.zeros_like(lat)
    t, w = sampler(k_t, x.shape[0])
    z = {PIXEL: flow.interpolate(x, me.noise_scale * jax.random.normal(k_p, x.shape, x.dtype), t[PIXEL]),
         LATENT: flow.interpolate(lat, me.noise_scale * jax.random.normal(k_l, lat.shape, lat.dtype), t[LATENT])}
    if zero_latent:
      z[LATENT] = lat
    y_in = dit.drop_labels(k_y, y, me.label_drop, nc) if config.data.conditional else jnp.zeros_like(y)
    out = _dit(model)(z, t, y_in)
    l_pix = flow.v_loss(out[PIXEL], x, z[PIXEL], t[PIXEL], t_eps=me.t_eps, weight=w[PIXEL])
    l_lat = flow.v_loss(out[LATENT], lat, z[LATENT], t[LATENT], t_eps=me.t_eps, weight=w[LATENT])
    return l_pix + lam * l_lat, {"loss_pixel": l_pix, "loss_latent": l_lat}
  return loss_fn


def _dit(model):
  """The DiT of a model (a bare `DiT`, or a wrapper holding one as `.dit` beside a frozen encoder)."""
  return model.dit if hasattr(model, "dit") else model


# ------------------------------------------------------------------------------------------- sampling


def time_tables(config, arm: str) -> dict[str, dict[str, np.ndarray]]:
  """{sampler name: {stream: (steps + 1,) times}} of an arm, every one with sample.steps intervals (equal NFE).

  joint (pixel-only): the pixels 0 -> 1 (shift_pixel), the zeroed latent held at 0. cascade: the latent
  0 -> 1 in cascade_latent_steps with the pixels at 0, then the pixels 0 -> 1 with the latent clean
  (`flow.cascaded_times`). balanced (multi-schedule): for each alpha, the latent at shift sqrt(alpha) and
  the pixels at 1 / sqrt(alpha) of one balanced clock (`flow.balanced_times`: relative shift alpha)."""
  s = config.sample
  n = int(s.steps)
  kind = arm_spec(arm)[2]
  shifts = {PIXEL: float(s.shift_pixel), LATENT: float(s.shift_latent)}
  if kind == "joint":
    t = flow.joint_times([PIXEL], n, {PIXEL: shifts[PIXEL]})
    return {"joint": {PIXEL: t[PIXEL], LATENT: np.zeros(n + 1)}}
  if kind == "cascade":
    nl = int(s.cascade_latent_steps)
    return {"cascade": flow.cascaded_times([LATENT, PIXEL], [nl, n - nl], shifts=shifts)}
  out = {}
  for a in s.alphas:
    r = math.sqrt(float(a))
    out[config_lib.alpha_key(float(a))] = flow.balanced_times({LATENT: r, PIXEL: 1.0 / r}, n)
  return out


def make_sampler(config, graphdef, guide=None):
  """`(params, table {stream: (steps + 1,)}, noise {stream: (B, ...)}, labels (B,)) -> pixels (B, H, W, C)`:
  `flow.sample` (Heun, the last step Euler, scanned: one compile serves every table of the arm).

  Guidance (`jaxlab.diffusion.guidance.combine`, per stream with its interval) when a scale is not 1: cfg
  evaluates the null label in the same batch; autoguidance evaluates `guide` = (graphdef, params) of the
  smaller model at the same (z, t) with the null label, as the official code does."""
  s = config.sample
  scales = {PIXEL: float(s.cfg_pixel), LATENT: float(s.cfg_latent)}
  intervals = {PIXEL: tuple(s.interval_pixel), LATENT: tuple(s.interval_latent)}
  guided = any(v != 1.0 for v in scales.values())
  nc = int(config.data.num_classes)

  def run(params, guide_params, table, noise, labels):
    model = _dit(nnx.merge(graphdef, params))
    y = labels_for(config, labels)

    def denoise(z, t):
      if not guided:
        return model(z, t, y)
      if s.guidance == "autoguidance":
        bad = _dit(nnx.merge(guide[0], guide_params))
        return guidance.combine(model(z, t, y), bad(z, t, jnp.full_like(y, bad.config.num_classes)), t, scales,
                                intervals)
      both = model({k: jnp.concatenate([v, v]) for k, v in z.items()},
                   {k: jnp.concatenate([v, v]) for k, v in t.items()},
                   jnp.concatenate([y, jnp.full_like(y, nc)]))
      b = y.shape[0]
      return guidance.combine({k: v[:b] for k, v in both.items()}, {k: v[b:] for k, v in both.items()}, t,
                              scales, intervals)
    return flow.sample(denoise, noise, table, method="heun", t_eps=float(s.t_eps), jit=False, scan=True,
                       euler_at_one=bool(s.euler_at_one))[PIXEL]
  fn = jax.jit(run)
  guide_params = None if guide is None else guide[1]
  return lambda params, table, noise, labels: fn(params, guide_params, table, noise, labels)


def generate_chunks(config, arm: str, sampler, table, params, cfg: dit.DiTConfig, labels, key, mesh):
  """Yields (start, pixel samples clipped to [-1, 1]) for `labels` (`jaxlab.diffusion.generate.chunks`) with
  `sampler` (`make_sampler`) along `table`; the zeroed latent of the pixel-only arm starts (and stays) at 0,
  every other stream at N(0, noise_scale^2)."""
  zero_latent = arm_spec(arm)[1] == "none"
  shapes = {s: cfg.stream_shape(s) for s in (PIXEL, LATENT)}
  scale = float(config.method.noise_scale)
  tab = {k: jnp.asarray(v, jnp.float32) for k, v in table.items()}

  def noise_fn(k, n):
    kp, kl = jax.random.split(k)
    lat = jnp.zeros((n, *shapes[LATENT])) if zero_latent else scale * jax.random.normal(kl, (n, *shapes[LATENT]))
    return {PIXEL: scale * jax.random.normal(kp, (n, *shapes[PIXEL])), LATENT: lat}
  for start, x in generate_lib.chunks(lambda noise, y: sampler(params, tab, noise, y), noise_fn, labels, key, mesh,
                                      int(config.sample.batch_size)):
    yield start, np.clip(x, -1.0, 1.0)


def generate(config, arm, sampler, table, params, cfg, labels, key, mesh) -> np.ndarray:
  return np.concatenate([x for _, x in generate_chunks(config, arm, sampler, table, params, cfg, labels, key,
                                                       mesh)])


# ------------------------------------------------------------------------------------------- models


def ema_dit(result):
  """(graphdef, state) of the DiT with the EMA parameters (a frozen encoder beside it is not needed to sample)."""
  model = result.modeldef.merge(optim.param_ema(result.state.opt_state), result.state.model_state)
  return nnx.split(_dit(model))


def load_guide(config, arm, spec):
  """(graphdef, EMA params) of the autoguidance model: the finished run sample.autoguidance_from (a latent_forcing
  workdir, or its stages/<arm> folder) restored onto this run's mesh."""
  path = config.sample.autoguidance_from
  sub = os.path.join(path, "stages", arm)
  path = sub if os.path.isdir(sub) else path
  if not os.path.exists(os.path.join(path, "summary.json")):
    raise ConfigError(f"config.sample.autoguidance_from: {path} is not a finished latent_forcing run of arm {arm!r}")
  gc = ml_collections.ConfigDict(metrics_lib.read_json(os.path.join(path, "config.json")))
  gc.mesh, gc.sharding_rules = config.mesh, config.sharding_rules
  cfg = dit_config(gc, spec)
  shape = {"image": np.zeros((1, *cfg.stream_shape(PIXEL)), np.float32), "label": np.zeros((1,), np.int32),
           "latent": np.zeros((1, *cfg.stream_shape(LATENT)), np.float32)}
  result = fit(gc, path, model_fn=lambda rngs: dit.DiT(cfg, rngs=rngs), loss_fn=make_loss_fn(gc, arm),
               train_source=ArraySource(shape),
               wrap_optimizer=lambda tx: optim.with_param_ema(tx, float(gc.method.ema_decay)))
  return ema_dit(result)


def decode_latents(config, sampler, table, params, cfg: dit.DiTConfig, latents: np.ndarray, labels, key, mesh):
  """Pixels sampled along `table` (the latent held at its times, e.g. 1) from given latents (N, h, w, c): the
  cascade's pixel phase on real latents, the decoder's quality without the latent generator's errors."""
  tab = {k: jnp.asarray(v, jnp.float32) for k, v in table.items()}
  lat = jnp.asarray(latents)
  scale = float(config.method.noise_scale)
  shape = cfg.stream_shape(PIXEL)
  rows = {"start": 0}

  def noise_fn(k, n):
    start = rows["start"]
    rows["start"] += n
    return {PIXEL: scale * jax.random.normal(k, (n, *shape)),
            LATENT: jnp.take(lat, jnp.arange(start, start + n) % lat.shape[0], axis=0)}
  parts = [x for _, x in generate_lib.chunks(lambda noise, y: sampler(params, tab, noise, y), noise_fn, labels, key,
                                             mesh, int(config.sample.batch_size))]
  return np.clip(np.concatenate(parts), -1.0, 1.0)
