"""Latent Forcing at full scale: ImageNet 256 x 256 (tfds `imagenet2012`), the DINOv2 latent encoded in the step.

Stages (`jaxlab.train.run_stages`, resumable):
* "latent_stats" (DINOv2 latents): per-channel statistics of the latent, read from latent.dinov2.stats (an .npz
  with "mean" / "std", e.g. converted from the RAE statistics the official code uses) or measured on the first
  latent.dinov2.stats_images training images; the scale is the pixels' RMS of those images (the official 0.485).
* "train_<arm>": `fit` of the two-stream DiT in stages/<arm>/. With the DINOv2 latent the model is `LFModel`: the
  DiT plus a `jaxlab.encoders.Dinov2Module` whose weights are parameters frozen by the optimizer
  (`optax.multi_transform` with `set_to_zero`: no optimizer state for them) and loaded sharded from the local
  checkpoint before the first step; the latent of each (flipped) image is encoded in the step under
  `stop_gradient` and normalised. Precomputed latents come with the batch (rows joined by index; no flips);
  the pixel-downsample latent is computed in the step.
* "sample_<arm>": sample.num class-balanced samples to stages/<arm>_samples/samples.npz (uint8 `arr_0` + labels,
  ADM's evaluator layout), with interval CFG per stream or autoguidance by a smaller run; FID when
  eval.sample_features and eval.reference_stats are local files.
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlab import mesh as mesh_lib
from jaxlab import progress
from jaxlab import state as state_lib
from jaxlab.data import images
from jaxlab.encoders import LatentNormalizer, PixelDownsample, PrecomputedLatents, dinov2, match_pixel_norm
from jaxlab.errors import CheckpointError, DataError
from jaxlab.evals import frechet
from jaxlab.nn import dit
from jaxlab.train import fit, optim, run_stages
from jaxlab.train import stages as stages_lib

from . import config as lf_config
from . import method

log = logging.getLogger("jaxlab")
ENCODER = "encoder"


class LFModel(nnx.Module):
  """The two-stream DiT (`.dit`) with a frozen DINOv2 (`.encoder`) whose latent it is trained on."""

  def __init__(self, cfg: dit.DiTConfig, enc: dinov2.Dinov2Config, input_size: int, *, rngs: nnx.Rngs):
    self.dit = dit.DiT(cfg, rngs=rngs)
    with nnx.use_eager_sharding(False):
      self.encoder = dinov2.Dinov2Module(enc, input_size)

  def __call__(self, *args, **kwargs):
    return self.dit(*args, **kwargs)


def freeze_encoder(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` on the DiT's parameters; exactly zero updates (and no state) for the encoder's."""
  def labels(params):
    def one(path, _):
      return "frozen" if path and getattr(path[0], "key", None) == ENCODER else "train"
    return jax.tree_util.tree_map_with_path(one, params)
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def _semantic_kind(config) -> str:
  return config.latent.full


class ImagesWithLatents:
  """ImageNet rows joined with precomputed latents of the same rows (by index)."""

  def __init__(self, source, latents: PrecomputedLatents):
    if len(latents) != len(source):
      raise DataError(f"precomputed latents hold {len(latents)} rows, the image split {len(source)}: they must be "
                      "computed for the same split in the same order")
    self.source, self.latents = source, latents

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, indices):
    out = dict(self.source[indices])
    out["latent"] = self.latents[indices]
    return out


def train_and_evaluate(config, workdir: str) -> dict:
  lf_config.require_latent_source(config)
  source = images.ImageNetSource("train", image_size=config.data.image_size, data_dir=config.data.data_dir or None)
  stages = {}
  kinds = {method.arm_spec(a)[1] for a in config.method.arms}
  if "semantic" in kinds and _semantic_kind(config) == "dinov2":
    stages["latent_stats"] = lambda ctx: stats_stage(ctx, source)
  for arm in config.method.arms:
    stages[f"train_{arm}"] = lambda ctx, arm=arm: train_stage(ctx, arm, source)
    stages[f"sample_{arm}"] = lambda ctx, arm=arm: sample_stage(ctx, arm, source)
  return run_stages(config, workdir, stages, summarise=stages_lib.union)


# -------------------------------------------------------------------------------------------- latents


def stats_stage(ctx, source) -> dict:
  """Per-channel mean / std of the DINOv2 latent (a file, or measured on the first stats_images images)."""
  d = ctx.config.latent.dinov2
  if d.get("stats"):
    if not os.path.exists(d.stats):
      raise DataError(f"config.latent.dinov2.stats={d.stats!r} does not exist (an .npz with 'mean' and 'std')")
    with np.load(d.stats) as f:
      if "mean" not in f.files or "std" not in f.files:
        raise DataError(f"{d.stats} holds {f.files}; expected 'mean' and 'std' per channel")
      mean, std = np.asarray(f["mean"], np.float32).reshape(-1), np.asarray(f["std"], np.float32).reshape(-1)
    n = min(int(d.stats_images), len(source))
    pixels = images.to_value_range(source[np.arange(n)])["image"]
    return {"latent/mean": mean, "latent/std": std, "latent/scale": match_pixel_norm(pixels)}
  enc = dinov2.Dinov2Encoder(d.path, input_size=int(d.input_size))
  n = min(int(d.stats_images), len(source))
  fn = jax.jit(enc.encode)
  raw, pix = [], []
  with progress.bar(total=n, desc="latent statistics") as bar:
    for start in range(0, n, int(ctx.config.sample.batch_size)):
      batch = images.to_value_range(source[np.arange(start, min(n, start + int(ctx.config.sample.batch_size)))])
      raw.append(np.asarray(fn(jnp.asarray(batch["image"]))))
      pix.append(batch["image"])
      bar.update(len(batch["image"]))
  norm = LatentNormalizer.fit(np.concatenate(raw), pixels=np.concatenate(pix) if ctx.config.latent.match_pixel_norm
                              else None)
  return {"latent/mean": norm.mean, "latent/std": norm.std, "latent/scale": norm.scale}


def _normalizer(ctx) -> LatentNormalizer:
  r = ctx.results["latent_stats"]
  return LatentNormalizer(np.asarray(r["latent/mean"], np.float32), np.asarray(r["latent/std"], np.float32),
                          float(r["latent/scale"]))


def _latent_setup(ctx, arm):
  """(latent spec, dinov2 config or None, latent_fn or None, train source) of an arm."""
  config = ctx.config
  kind = method.arm_spec(arm)[1]
  src = images.ImageNetSource("train", image_size=config.data.image_size, data_dir=config.data.data_dir or None)
  g = method.grid(config)
  if kind == "pixel":
    p = config.latent.pixel
    pd = PixelDownsample(int(p.factor), (g[0] * int(p.patch), g[1] * int(p.patch)))
    ch = pd.channels(int(config.model.channels), (method.image_size(config),) * 2)
    return method.latent_spec(config, kind, ch), None, lambda model, x: pd.encode(x), src
  if kind == "none":   # plain JiT: the semantic latent's shape, zeroed (no encoder in the model)
    if _semantic_kind(config) == "precomputed":
      ch = PrecomputedLatents(config.latent.precomputed.path).latents.shape[-1]
    else:
      ch = dinov2.Dinov2Config.from_json(_dinov2_config_path(config.latent.dinov2.path)).hidden_size
    spec = method.latent_spec(config, kind, ch)
    shape = (g[0] * spec.patch, g[1] * spec.patch, ch)
    return spec, None, lambda model, x: jnp.zeros((x.shape[0], *shape), x.dtype), src
  if _semantic_kind(config) == "precomputed":
    lat = PrecomputedLatents(config.latent.precomputed.path)
    source = ImagesWithLatents(src, lat)
    spec = method.latent_spec(config, kind, lat.latents.shape[-1])
    method.check_latent_grid(config, "precomputed", lat.latents[:1], spec.patch)
    return spec, None, None, source
  d = config.latent.dinov2
  enc_cfg = dinov2.Dinov2Config.from_json(_dinov2_config_path(d.path))
  spec = method.latent_spec(config, kind, enc_cfg.hidden_size)
  norm = _normalizer(ctx)

  def latent_fn(model, x):
    return norm(model.encoder(x))
  return spec, enc_cfg, latent_fn, src


def _dinov2_config_path(path: str) -> str:
  cfg = os.path.join(path, "config.json")
  if not os.path.exists(cfg):
    raise CheckpointError(f"config.latent.dinov2.path={path!r} has no config.json: give a local Hugging Face "
                          "DINOv2-with-registers checkpoint directory (nothing is downloaded)")
  return cfg


# ------------------------------------------------------------------------------------------------ fit


def model_fn(config, arm, spec, enc_cfg):
  cfg = method.dit_config(config, spec)
  if enc_cfg is None:
    return cfg, lambda rngs: dit.DiT(cfg, rngs=rngs)
  size = int(config.latent.dinov2.input_size)
  return cfg, lambda rngs: LFModel(cfg, enc_cfg, size, rngs=rngs)


def _has_checkpoint(path: str) -> bool:
  ck = os.path.join(path, "checkpoints")
  return os.path.isdir(ck) and any(p.isdigit() for p in os.listdir(ck))


def _initial_params(config, build, enc_cfg):
  """The full parameter tree: the DiT's init (the key `fit` uses, so the EMA starts from the same values) with
  the encoder's weights read sharded from the checkpoint."""
  modeldef = state_lib.ModelDef(build)
  with mesh_lib.use_config(config) as mesh:
    rules = mesh_lib.current_rules()
    abstract = modeldef.abstract()[0]
    shardings = state_lib.tree_shardings(modeldef.param_specs, abstract, mesh, rules)
    key = jax.random.fold_in(jax.random.key(int(config.seed)), 0)
    params = jax.jit(lambda: modeldef.init(key)[0], out_shardings=shardings)()
    params[ENCODER]["weights"] = dinov2.load_arrays(config.latent.dinov2.path, enc_cfg,
                                                    shardings[ENCODER]["weights"])
  return params


def run_fit(config, workdir, arm, source, spec, enc_cfg, latent_fn):
  """`fit` of an arm in `workdir` (a finished run is only restored); (FitResult, DiTConfig)."""
  cfg, build = model_fn(config, arm, spec, enc_cfg)
  init = None
  if enc_cfg is not None and not _has_checkpoint(workdir):
    init = _initial_params(config, build, enc_cfg)

  def wrap(tx):
    return optim.with_param_ema(freeze_encoder(tx) if enc_cfg is not None else tx, float(config.method.ema_decay))
  result = fit(config, workdir, model_fn=build, loss_fn=method.make_loss_fn(config, arm, latent_fn),
               train_source=source, transform=images.to_value_range, wrap_optimizer=wrap, initial_params=init)
  return result, cfg


def train_stage(ctx, arm, _source) -> dict:
  spec, enc_cfg, latent_fn, source = _latent_setup(ctx, arm)
  result, _ = run_fit(ctx.config, os.path.join(ctx.workdir, "stages", arm), arm, source, spec, enc_cfg, latent_fn)
  s = result.summary
  return {f"train/{arm}/loss": float(s["train/loss"]), f"num_params/{arm}": int(s["num_params"])}


# ------------------------------------------------------------------------------------------- sampling


def sample_stage(ctx, arm, _source) -> dict:
  config = ctx.config
  spec, enc_cfg, latent_fn, source = _latent_setup(ctx, arm)
  result, cfg = run_fit(config, os.path.join(ctx.workdir, "stages", arm), arm, source, spec, enc_cfg, latent_fn)
  graphdef, params = method.ema_dit(result)
  guide = method.load_guide(config, arm, spec) if config.sample.guidance == "autoguidance" else None
  sampler = method.make_sampler(config, graphdef, guide)
  n, nc = int(config.sample.num), int(config.data.num_classes)
  labels = (np.arange(n) % nc).astype(np.int32)
  side = int(config.data.image_size)
  out = {}
  for name, table in method.time_tables(config, arm).items():
    arr = np.zeros((n, side, side, int(config.model.channels)), np.uint8)
    with progress.bar(total=n, desc=f"sampling {arm} {name}") as bar:
      for start, x in method.generate_chunks(config, arm, sampler, table, params, cfg, labels, ctx.key(), ctx.mesh):
        arr[start:start + len(x)] = np.round((x + 1) * 127.5).astype(np.uint8)
        bar.update(len(x))
    folder = os.path.join(ctx.workdir, "stages", f"{arm}_samples", name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "samples.npz")
    np.savez(path, arr_0=arr, labels=labels)
    out[f"samples_path/{arm}/{name}"] = path
    if config.eval.sample_features and config.eval.reference_stats:
      out[f"fid/{arm}/{name}"] = frechet.fid_from_files(config.eval.sample_features, config.eval.reference_stats)
  out[f"num_samples/{arm}"] = n
  return out
