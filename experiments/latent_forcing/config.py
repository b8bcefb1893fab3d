"""Latent Forcing (arXiv 2602.11401): denoise a semantic latent first, then the pixels, in one pixel-space DiT.

Baade, Chan, Sargent, Chen, Johnson, Adeli, Fei-Fei, "Latent Forcing: Reordering the Diffusion Trajectory for
Pixel-Space Image Generation" (ICML 2026; official code AlanBaade/LatentForcing, built on JiT). One
two-stream JiT (`jaxlab.nn.dit`): pixel and latent embeddings summed per token, one timestep embedder per
stream, a decoder head per stream; trained with x-prediction and the v-loss on a mixture of (latent step:
pixels pure noise, latent noised) and (pixel step: latent almost clean) batches (`jaxlab.diffusion.
stream_times`), sampled latent first then pixels (cascaded Heun), the latent thrown away at the end.

Arms (one network each, same size, steps and NFE): `pixel` (plain JiT: the latent stream zeroed, its loss
off), `lf` (the method, the semantic latent), `lf_pix` (the method with the pixel-downsample latent), `ms` /
`ms_pix` (the paper's multi-schedule model: independent times, sampled along balanced schedules with the
latent ahead (alpha = 16) or behind (alpha = 1/16), semantic / pixel-downsample latent).

Variants: tiny (unconditional 8x8 digits, patch 4 (2x2 tokens), width 64, 4 blocks; the semantic latent of a
small conv classifier trained in-process; CPU), small (the same at patch 2, width 128, 6 blocks), full
(ImageNet 256 x 256 through tfds `imagenet2012`, LF-DiT-LM/16 with 2 decoder blocks of width 1024, the
DINOv2-B-with-registers latent from a local Hugging Face checkpoint, class-conditional with interval CFG;
accelerators).
"""

import math

import ml_collections

from jaxlab import claims, configs

SEEDS = (0, 1, 2)             # claim seeds; the calibration ran seeds 100-105 (README)
LF_RATIO_MAX = 0.85           # issue 29, claim 1: FD(cascade) <= 0.85 x FD(pixel-only) on the mean
ENTROPY_MIN = 0.9 * math.log(10)   # issue 29, claim 4: class-histogram entropy of cascade samples
LATENT_FIRST, PIXELS_FIRST = 16.0, 1.0 / 16.0   # the paper's Table 1 alphas compared (latent ahead / behind)

# arm -> (training-time sampler of `jaxlab.diffusion.stream_times`, latent, sampler kind)
ARMS = {
    "pixel": ("pixel_only", "none", "joint"),
    "lf": ("cascaded_noised", "semantic", "cascade"),
    "lf_pix": ("cascaded_noised", "pixel", "cascade"),
    "ms": ("independent", "semantic", "balanced"),
    "ms_pix": ("independent", "pixel", "balanced"),
}
LATENTS = ("semantic", "pixel", "dinov2", "precomputed")
DATASETS = ("digits", "imagenet2012")
GUIDANCE = ("cfg", "autoguidance")


def alpha_key(a: float) -> str:
  return f"a{a:g}"


def fd_key(arm, sampler=None):
  return f"fd/{arm}" if sampler is None else f"fd/{arm}/{sampler}"


def _gap(r, arm):   # log FD(pixels first) - log FD(latent first): > 0 when the latent-first order is better
  return math.log(r[fd_key(arm, alpha_key(PIXELS_FIRST))]) - math.log(r[fd_key(arm, alpha_key(LATENT_FIRST))])


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`latent_forcing` (Latent Forcing, arXiv 2602.11401; method from the official code)",
    claim=("unconditional 8x8 digits, equal network, steps and NFE, judge-feature FD, 3 seeds: the cascade with a "
           "semantic latent <= 0.85x pixel-only FD on the mean and lower on every seed; the multi-schedule model "
           "sampled latent first (alpha 16) beats pixels first (1/16) on the mean; that ordering gap (log FD ratio) "
           "is larger with the semantic latent than with the pixel-downsample latent; cascade samples' "
           "class-histogram entropy >= 0.9 log 10 on every seed"),
    note=("the cascade loses to pixel-only at 8x8 (calibration predicted it); decoding held-out real semantic "
          "latents beats pixel-only, so the jointly generated latent is the bottleneck at this scale (README)"),
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"model.hidden": 32, "model.depth": 2, "model.heads": 2, "train.num_steps": 16,
          "train.optimizer.warmup_steps": 4, "train.checkpoint_every": 8, "train.log_every": 8, "sample.steps": 4,
          "sample.cascade_latent_steps": 2, "sample.num": 64, "sample.batch_size": 32, "judge.steps": 100,
          "latent.semantic.steps": 30, "judge.cache_dir": "{tmp}/cache"}

CLAIMS = [
    claims.Claim("lf_vs_pixel", "mean FD(cascade, semantic latent) / mean FD(pixel-only), same network / steps / NFE",
                 claims.ratio_of_means(fd_key("lf"), fd_key("pixel")), "<=", LF_RATIO_MAX),
    claims.Claim("lf_every_seed", "fraction of seeds on which the cascade's FD is below pixel-only's",
                 claims.fraction(lambda r: r[fd_key("lf")] < r[fd_key("pixel")]), ">=", 1.0),
    claims.Claim("latent_first", "multi-schedule model, semantic latent: mean FD(latent first, alpha 16) / mean "
                 "FD(pixels first, alpha 1/16)",
                 claims.ratio_of_means(fd_key("ms", alpha_key(LATENT_FIRST)), fd_key("ms", alpha_key(PIXELS_FIRST))),
                 "<", 1.0),
    claims.Claim("semantic_gap", "mean over seeds of [ordering gap with the semantic latent - with the pixel-"
                 "downsample latent], gap = log FD(pixels first) - log FD(latent first)",
                 lambda runs: sum(_gap(r, "ms") - _gap(r, "ms_pix") for r in runs) / len(runs), ">", 0.0),
    claims.Claim("coverage", "smallest (over seeds) class-histogram entropy of the judge's labels of cascade samples",
                 claims.minimum("entropy/lf"), ">=", ENTROPY_MIN),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  # data: digits (sklearn, offline; the fixed stratified split of jit_digits, so the same cached judge) |
  # imagenet2012 (tfds, manual download). conditional=False trains and samples with the null label only.
  c.data = ml_collections.ConfigDict(dict(name="digits", split_seed=0, test_fraction=0.25, data_dir="",
                                          image_size=256, num_classes=10, conditional=False))
  # model: the two-stream `jaxlab.nn.dit.DiTConfig`: pixels at `patch`; the latent grid is read at
  # latent.patch onto the same token grid.
  c.model = ml_collections.ConfigDict(dict(
      patch=4, channels=1, hidden=64, depth=4, heads=4, mlp_ratio=4.0, bottleneck=32, class_tokens=4,
      in_context_start=2, head_depth=0, head_hidden=0, dtype="float32", attention="auto", remat=False))
  # latent encoders. semantic: `jaxlab.encoders.TinySemanticEncoder` (3 convolutions, the last one's 2x2 x 16
  # map before its ReLU, LayerNorm without affine: a deep, token-normalised latent like DINOv2's last layer),
  # trained in-process on the training images (seed `seed`, not the run seed: one frozen encoder for every
  # run; cached); pixel: `PixelDownsample(factor)`; dinov2: a local HF DINOv2-with-registers directory (`path`);
  # precomputed: an .npz of latents per training row (`path`). `patch`: the latent's patch on the token grid.
  # dinov2.stats: an .npz of per-channel "mean" / "std" (else measured on the first stats_images images).
  c.latent = ml_collections.ConfigDict(dict(
      semantic=dict(channels=16, width=32, stride=2, depth=3, pool=1, latent="layernorm", steps=1500,
                    batch_size=128, learning_rate=2e-3, seed=0, patch=1),
      pixel=dict(factor=2, patch=2),
      dinov2=dict(path="", input_size=224, patch=1, stats="", stats_images=10000),
      precomputed=dict(path="", patch=1),
      full="dinov2",              # the latent the full variant's "semantic" arms use (dinov2 | precomputed)
      match_pixel_norm=True))     # standardise per channel, then rescale to the pixels' RMS (the official 0.485)
  # method: flow matching (t = 1 clean), x-prediction, v-loss per stream; the training-time samplers and loss
  # weight of the official code (README / Table 12): p_latent 0.4, latent logit-normal (-1.2, 1), pixel
  # logit-normal (-0.4, 0.8) with U(0, 0.5) at p 0.1, latent noise beta 0.25, lambda_lat 0.333.
  c.method = ml_collections.ConfigDict(dict(
      lambda_lat=0.333, p_latent=0.4, latent_mean=-1.2, latent_std=1.0, pixel_mean=-0.4, pixel_std=0.8,
      p_uniform=0.1, uniform_max=0.5, latent_noise=0.25, independent_shift=0.5, t_eps=0.05, label_drop=0.1,
      ema_decay=0.995, noise_scale=1.0, flip=False))
  c.method.arms = ("pixel", "lf", "ms", "ms_pix")   # the arms run (config.ARMS), each its own network
  # sample: `steps` intervals for every arm (Heun, the last Euler: 2 steps - 1 NFE); the cascade gives the
  # latent `cascade_latent_steps` of them; the multi-schedule arms sample at each alpha; guidance per stream
  # (cfg: the null label; autoguidance: a second, smaller run's EMA weights from `autoguidance_from`);
  # euler_at_one: the latent's last cascade step is Euler, like every stream's last step (`flow.heun_step`; the
  # official sampler takes the trapezoid there).
  c.sample = ml_collections.ConfigDict(dict(
      steps=20, cascade_latent_steps=10, alphas=(LATENT_FIRST, PIXELS_FIRST), num=4000, batch_size=1000,
      t_eps=0.05, guidance="cfg", cfg_pixel=1.0, cfg_latent=1.0, interval_pixel=(0.0, 1.0),
      interval_latent=(0.0, 1.0), autoguidance_from="", shift_pixel=1.0, shift_latent=1.0, euler_at_one=False))
  c.eval = ml_collections.ConfigDict(dict(sample_features="", reference_stats=""))
  # judge: `jaxlab.evals.judge` (an MLP on the 64 pixels), cached per data split (shared with jit_digits).
  c.judge = ml_collections.ConfigDict(dict(hidden=(256, 64), steps=3000, batch_size=128, learning_rate=1e-3,
                                           weight_decay=1e-4, cache_dir=""))
  c.train = configs.train_config(
      batch_size=128, num_steps=2000, log_every=100, eval_every=0, checkpoint_every=1000,
      optimizer=dict(name="adamw", learning_rate=2e-3, schedule="warmup_constant", warmup_steps=100,
                     weight_decay=0.0, b2=0.95))
  if arg.variant in ("tiny", "small"):
    # 8x8 digits (README, "Calibration"): no class tokens (unconditional: they would only carry the null label,
    # and they double the token count at patch 4); the latent's time distribution is the pixels' and its loss
    # weight 1 (the paper's (-1.2, 1.0) and 0.333 serve a 768-channel DINOv2 latent; at 8x8 they left the
    # latent under-trained: cascade FD 5.05 against 2.49 on validation seed 100).
    c.model.update(class_tokens=0, in_context_start=0)
    c.method.update(lambda_lat=1.0, latent_mean=-0.4, latent_std=0.8)
  if arg.variant == "small":
    c.model.update(patch=2, hidden=128, depth=6)     # a 4x4 token grid: the 4x4 latents at patch 1
    c.latent.semantic.depth = 2
    c.latent.pixel.patch = 1
    c.train.num_steps = 6000
    c.method.ema_decay = 0.999
  elif arg.variant == "full":   # LF-DiT-LM/16 at 256 x 256 (the spec's main model; `jaxlab.nn.dit.ZOO["LM"]`)
    c.data.update(name="imagenet2012", num_classes=1000, conditional=True)
    c.method.arms = ("lf",)
    c.model.update(patch=16, channels=3, hidden=1024, depth=20, heads=16, bottleneck=128, class_tokens=32,
                   in_context_start=8, head_depth=2, head_hidden=1024, dtype="bfloat16", remat=True)
    c.latent.pixel.update(factor=4, patch=1)
    c.method.update(ema_decay=0.9999, flip=True)
    c.sample.update(steps=50, cascade_latent_steps=25, num=50000, batch_size=256, cfg_pixel=1.5, cfg_latent=2.9,
                    interval_latent=(0.06, 1.0), shift_latent=0.575)
    c.train.update(batch_size=1024, num_steps=250_000, log_every=100, checkpoint_every=5000)
    c.train.optimizer.update(learning_rate=2e-4, warmup_steps=5 * 1251)
    c.mesh = (("data", -1), ("model", 1))
  return configs.finalize(c, validate)


def require_latent_source(c):
  """The full variant's semantic latent needs a local path (checked when a run starts, not when the config
  is built, so the shipped full config validates and `--config.latent.dinov2.path=...` completes it)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  if c.data.name == "imagenet2012" and any(ARMS[a][1] in ("semantic", "none") for a in c.method.arms):
    if not c.latent[c.latent.full].path:
      raise ConfigError(f"the full variant's semantic latent needs config.latent.{c.latent.full}.path (a local "
                        + ("DINOv2-with-registers checkpoint directory" if c.latent.full == "dinov2" else
                           ".npz of latents") + "; nothing is downloaded)")


def validate(c):
  """Experiment-specific checks (run by configs.finalize and again by configs.apply_overrides)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  if c.data.name not in DATASETS:
    raise ConfigError(f"config.data.name={c.data.name!r}: use one of {', '.join(DATASETS)}")
  arms = tuple(c.method.arms)
  bad = [a for a in arms if a not in ARMS]
  if not arms or bad:
    raise ConfigError(f"config.method.arms={arms}: each arm must be one of {', '.join(ARMS)}")
  if len(set(arms)) != len(arms):
    raise ConfigError(f"config.method.arms={arms} names an arm twice")
  size = 8 if c.data.name == "digits" else int(c.data.image_size)
  if size % int(c.model.patch):
    raise ConfigError(f"config.model.patch={c.model.patch} must divide the image size {size}")
  if c.data.name == "digits" and c.model.channels != 1:
    raise ConfigError("digits are 1-channel: set config.model.channels=1")
  if c.data.name == "imagenet2012" and c.model.channels != 3:
    raise ConfigError("imagenet2012 is RGB: set config.model.channels=3")
  if c.latent.full not in ("dinov2", "precomputed"):
    raise ConfigError(f"config.latent.full={c.latent.full!r}: use dinov2 or precomputed")
  if c.data.name == "imagenet2012" and any(ARMS[a][1] in ("semantic", "none") for a in arms):
    if c.latent.full == "precomputed" and c.method.flip:
      raise ConfigError("precomputed latents belong to the unflipped images: set config.method.flip=False")
  s = c.sample
  if int(s.steps) < 2:
    raise ConfigError(f"config.sample.steps={s.steps} must be >= 2")
  if not 1 <= int(s.cascade_latent_steps) < int(s.steps):
    raise ConfigError(f"config.sample.cascade_latent_steps={s.cascade_latent_steps} must be in [1, "
                      f"sample.steps={s.steps})")
  if any(float(a) <= 0 for a in s.alphas):
    raise ConfigError(f"config.sample.alphas={tuple(s.alphas)} must be > 0")
  if s.guidance not in GUIDANCE:
    raise ConfigError(f"config.sample.guidance={s.guidance!r}: use one of {', '.join(GUIDANCE)}")
  guided = float(s.cfg_pixel) != 1.0 or float(s.cfg_latent) != 1.0
  if guided and s.guidance == "cfg" and (not c.data.conditional or float(c.method.label_drop) == 0.0):
    raise ConfigError("classifier-free guidance (sample.cfg_pixel / cfg_latent != 1) needs a conditional model "
                      "trained with label dropout: set data.conditional=True and method.label_drop > 0, or use "
                      "sample.guidance=autoguidance")
  if s.guidance == "autoguidance" and not s.autoguidance_from:
    raise ConfigError("sample.guidance=autoguidance needs sample.autoguidance_from (the workdir of a smaller "
                      "latent_forcing run of the same data and latent)")
  for name in ("interval_pixel", "interval_latent"):
    lo, hi = (float(v) for v in s[name])
    if not 0.0 <= lo <= hi <= 1.0:
      raise ConfigError(f"config.sample.{name}={tuple(s[name])} must be (lo, hi) with 0 <= lo <= hi <= 1")
  me = c.method
  for name in ("p_latent", "p_uniform", "latent_noise", "ema_decay"):
    if not 0.0 <= float(me[name]) <= 1.0:
      raise ConfigError(f"config.method.{name}={me[name]} must be in [0, 1]")
  if not 0.0 <= float(me.label_drop) < 1.0:
    raise ConfigError(f"config.method.label_drop={me.label_drop} must be in [0, 1) (unconditional runs: "
                      "data.conditional=False)")


def sweep(arg=None):
  """The paper's ablations at small scale: p_latent and the latent noise beta (its Table of cascaded ablations)."""
  return [{"method.p_latent": p, "method.latent_noise": b, "method.arms": ("lf",)}
          for p in (0.3, 0.4, 0.6) for b in (0.0, 0.25, 0.5)]
