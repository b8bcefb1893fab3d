"""SAR: judge, train the two models, exactness / leakage checks, sample and time (stages of `run_stages`).

Launch: python -m jaxlab.main --config experiments/sar/config.py:tiny --workdir /tmp/sar

Stages (digits):
* "judge": the cached judge MLP of the data split; results: its held-out accuracy, the floor FD(held-out real,
  train) in its features.
* "train_sar", "train_regression": `jaxlab.train.fit` of each model in stages/<arm>/ (its own resumable run; the
  optimizer keeps a Polyak average of the parameters, which the samples use).
* "checks": claim 3 (the KV-cached incremental features against the full masked forward, every schedule scored,
  128 held-out digits) and claim 4 (the leakage test of the SAR mask and of the causal / full / MAR controls).
* "sample_sar": `sample.num` class-balanced samples per schedule (1, 2, 4, 8 tokens per step and a cosine
  schedule), each scored by the judge (FD to the training images, class-histogram entropy, accuracy on the
  conditioning class); images/s per schedule at `speed_batch` images (compiled once, best of `speed_repeats`).
* "sample_regression": the baseline's greedy samples, scored alike.

The latents variant (full) runs "train_sar" and "sample_sar" on precomputed KL-VAE latents and writes the
sampled latents (decode them with the VAE the latents came from).
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import data as data_lib
from jaxlab import progress
from jaxlab.ar import generate as gen
from jaxlab.ar import tokenizers
from jaxlab.train import fit, optim, run_stages
from jaxlab.train import stages as stages_lib

from . import config as config_lib
from . import method

log = logging.getLogger("jaxlab")
PLOT_PER_CLASS = 6
CHECK_IMAGES = 128


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages; returns the summary (fd/<schedule>, entropy/..., speed/..., exact/..., leak/...)."""
  if config.data.name == "latents":
    return _latents_run(config, workdir)
  train, held = method.digits(config)
  tok = method.tokenizer(config, train)
  data = {"train": {"tokens": np.asarray(tok.encode(train["image"]), np.float32), "label": train["label"]},
          "held": {"tokens": np.asarray(tok.encode(held["image"]), np.float32), "label": held["label"]}}
  stages = {"judge": lambda ctx: judge_stage(ctx, train, held)}
  for arm in config.method.arms:
    stages[f"train_{arm}"] = lambda ctx, arm=arm: train_stage(ctx, arm, data, tok.grid)
  if "sar" in config.method.arms:
    stages["checks"] = lambda ctx: checks_stage(ctx, data, tok.grid)
    stages["sample_sar"] = lambda ctx: sample_sar_stage(ctx, data, tok, train)
  if "regression" in config.method.arms:
    stages["sample_regression"] = lambda ctx: sample_regression_stage(ctx, data, tok, train)
  return run_stages(config, workdir, stages, summarise=summarise)


def judge_stage(ctx, train, held) -> dict:
  scorer = method.scorer(ctx.config, train)
  log.info("judge: %s", "read from the cache" if scorer.cached else "trained and cached")
  return scorer.floor(held, int(ctx.config.sample.num), balanced=True)


_FITTED = {}   # (workdir, arm) -> FitResult of this process (later stages reuse it instead of restoring again)


def _fit(ctx, arm, data, grid):
  """`fit` of the arm's model in workdir/stages/<arm> (Polyak average in the optimizer); a finished run is only
  restored (once per process)."""
  config = ctx.config
  train = data["train"]
  path = os.path.join(ctx.workdir, "stages", arm)
  key = (os.path.abspath(path), arm, config.to_json())
  if key not in _FITTED:
    _FITTED.clear()
    _FITTED[key] = fit(config, path, model_fn=method.make_model_fn(config, arm, train["tokens"].shape[-1], grid),
                       loss_fn=method.make_loss_fn(config, arm), train_source=data_lib.ArraySource(train),
                       wrap_optimizer=lambda tx: optim.with_param_ema(tx, float(config.method.ema_decay)))
  return _FITTED[key]


def _ema_model(result):
  """The trained model with the averaged parameters (what the samples and checks use)."""
  return result.modeldef.merge(optim.param_ema(result.state.opt_state), result.state.model_state)


def train_stage(ctx, arm, data, grid) -> dict:
  s = _fit(ctx, arm, data, grid).summary
  out = {f"train/{arm}/loss": float(s["train/loss"]), f"num_params/{arm}": int(s["num_params"])}
  for k in ("loss_flow", "loss_jepa", "loss_mse"):
    if f"train/{k}" in s:
      out[f"train/{arm}/{k}"] = float(s[f"train/{k}"])
  return out


def checks_stage(ctx, data, grid) -> dict:
  config = ctx.config
  net = _ema_model(_fit(ctx, "sar", data, grid)).net
  x = jnp.asarray(data["held"]["tokens"][:CHECK_IMAGES])
  y = jnp.asarray(data["held"]["label"][:CHECK_IMAGES])
  scheds = method.schedules(config, x.shape[1])
  leak = method.leakage(net, x, y, ctx.key(), tuple(int(s) for s in config.method.group_sizes),
                        ("sar", "causal", "full", "mar"))
  return {"exact/max_abs": method.exactness(net, x, y, scheds), **{f"leak/{k}": v for k, v in leak.items()}}


def _score(scorer, images, labels) -> dict:
  s = scorer.score(images, labels)
  return {k: s[k] for k in ("fd", "entropy", "judge_acc", "confidence")}


def _labels(config) -> np.ndarray:
  return (np.arange(int(config.sample.num)) % int(config.data.num_classes)).astype(np.int32)


def _batched(fn, labels, batch, desc):
  out = []
  with progress.bar(total=len(labels), desc=desc) as bar:
    for i in range(0, len(labels), batch):
      out.append(np.asarray(fn(labels[i:i + batch], i)))
      bar.update(len(labels[i:i + batch]))
  return np.concatenate(out)


def sample_sar_stage(ctx, data, tok, train) -> dict:
  config = ctx.config
  s = config.sample
  model = _ema_model(_fit(ctx, "sar", data, tok.grid))
  sampler = gen.GroupedSampler(model, head_steps=int(s.head_steps), shift=float(s.shift),
                               temperature=float(s.temperature), cfg=float(s.cfg))
  scorer = method.scorer(config, train)
  labels = _labels(config)
  key = ctx.key()
  out = {}
  speed_labels = jnp.asarray(labels[:int(s.speed_batch)])
  for name, sizes in method.schedules(config, data["train"]["tokens"].shape[1]).items():
    toks = _batched(lambda y, i, sizes=sizes: sampler(y, sizes, jax.random.fold_in(key, i)), labels,
                    int(s.batch_size), f"sampling {name}")
    images = np.asarray(tok.decode(toks), np.float32)
    for k, v in _score(scorer, images, labels).items():
      out[f"{k}/{name}"] = v
    out[f"steps/{name}"] = len(sizes)
    out[f"speed/{name}"] = gen.images_per_second(lambda sizes=sizes: sampler(speed_labels, sizes, key),
                                                 len(speed_labels), repeats=int(s.speed_repeats))
    keep = np.concatenate([np.flatnonzero(labels == c)[:PLOT_PER_CLASS] for c in np.unique(labels)])
    out[f"samples/{name}"] = images[keep]
    log.info("%s: FD %.3f, entropy %.3f, %.1f images/s", name, out[f"fd/{name}"], out[f"entropy/{name}"],
             out[f"speed/{name}"])
  base = out.get(f"speed/{config_lib.k_name(1)}")
  if base:
    for k in s.tokens_per_step:
      if f"speed/{config_lib.k_name(int(k))}" in out:
        out[f"speedup/k{int(k)}"] = out[f"speed/{config_lib.k_name(int(k))}"] / base
  return out


def sample_regression_stage(ctx, data, tok, train) -> dict:
  config = ctx.config
  model = _ema_model(_fit(ctx, "regression", data, tok.grid))
  sampler = gen.RegressionSampler(model)
  scorer = method.scorer(config, train)
  labels = _labels(config)
  toks = _batched(lambda y, i: sampler(y), labels, int(config.sample.batch_size), "sampling regression")
  images = np.asarray(tok.decode(toks), np.float32)
  out = {f"{k}/regression": v for k, v in _score(scorer, images, labels).items()}
  out["distinct/regression"] = int(len(np.unique(np.round(images.reshape(len(images), -1), 4), axis=0)))
  keep = np.concatenate([np.flatnonzero(labels == c)[:PLOT_PER_CLASS] for c in np.unique(labels)])
  out["samples/regression"] = images[keep]
  return out


def summarise(results) -> dict:
  return {k: v for k, v in stages_lib.union(results).items() if not isinstance(v, np.ndarray)}


# ------------------------------------------------------------------------------------------- latents (full)


def _latents_run(config, workdir: str) -> dict:
  config_lib.require_data(config)
  lat = tokenizers.load_latents(config.data.path, float(config.tokens.scale))
  data = {"train": {"tokens": lat["tokens"], "label": lat["label"]}}
  stages = {"train_sar": lambda ctx: train_stage(ctx, "sar", data, lat["grid"]),
            "sample_sar": lambda ctx: latents_sample_stage(ctx, data, lat)}
  return run_stages(config, workdir, stages, summarise=stages_lib.union)


def _vae(config, lat):
  """The KL-VAE decoder of config.vae for latents of this grid and channel count (None without a path)."""
  v = config.vae
  if not v.path:
    return None
  from jaxlab.ar import kl_vae  # pylint: disable=g-import-not-at-top
  h, _ = lat["grid"]
  c = lat["tokens"].shape[-1]
  cfg = kl_vae.KLConfig(ch=int(v.ch), ch_mult=tuple(v.ch_mult), num_res_blocks=int(v.num_res_blocks), z_channels=c,
                        embed_dim=c, resolution=h * 2 ** (len(v.ch_mult) - 1), norm_groups=int(v.norm_groups))
  return kl_vae.load_decoder(v.path, cfg, strict=bool(v.strict))


def _decode_to_uint8(decoder, latents, batch: int) -> np.ndarray:
  from flax import nnx  # pylint: disable=g-import-not-at-top
  dec = nnx.jit(lambda m, z: m(z))
  out = [np.asarray(jnp.clip(jnp.round((dec(decoder, jnp.asarray(latents[i:i + batch])) + 1) * 127.5), 0, 255))
         for i in range(0, len(latents), batch)]
  return np.concatenate(out).astype(np.uint8)


def latents_sample_stage(ctx, data, lat) -> dict:
  """sample.num class-balanced latents per schedule to stages/sample_sar/<schedule>.npz ("latent" (N, h, w, c)
  divided back by tokens.scale, "label"), with vae.path their decoded images (uint8 "arr_0" (N, H, W, 3) and
  "labels": the layout of ADM's evaluator, for FID with any local Inception), and images/s per schedule."""
  config = ctx.config
  s = config.sample
  model = _ema_model(_fit(ctx, "sar", data, lat["grid"]))
  sampler = gen.GroupedSampler(model, head_steps=int(s.head_steps), shift=float(s.shift),
                               temperature=float(s.temperature), cfg=float(s.cfg))
  labels = _labels(config)
  key = ctx.key()
  out = {}
  h, w = lat["grid"]
  decoder = _vae(config, lat)
  for name, sizes in method.schedules(config, data["train"]["tokens"].shape[1]).items():
    toks = _batched(lambda y, i, sizes=sizes: sampler(y, sizes, jax.random.fold_in(key, i)), labels,
                    int(s.batch_size), f"sampling {name}")
    path = os.path.join(ctx.subdir(), f"{name}.npz")
    raw = toks.reshape(len(toks), h, w, -1) / float(config.tokens.scale)
    np.savez(path, latent=raw, label=labels)
    out[f"samples_path/{name}"] = path
    if decoder is not None:
      ipath = os.path.join(ctx.subdir(), f"{name}_images.npz")
      np.savez(ipath, arr_0=_decode_to_uint8(decoder, raw, int(config.vae.batch_size)), labels=labels)
      out[f"images_path/{name}"] = ipath
    out[f"speed/{name}"] = gen.images_per_second(
        lambda sizes=sizes: sampler(jnp.asarray(labels[:int(s.speed_batch)]), sizes, key), int(s.speed_batch),
        repeats=int(s.speed_repeats))
  return out


# ------------------------------------------------------------------------------------------------- plots


def plot(runs, workdirs, out_dir):
  """Samples per schedule and of the regression baseline (first seed), and FD / images/s per schedule."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  if not workdirs or not runs:
    return []
  names = list(runs[0].get("stages", []))
  grids = {}
  for i, stage in enumerate(names):
    if stage.startswith("sample_"):
      for k, v in stages_lib.stage_arrays(workdirs[0], i, stage).items():
        if isinstance(v, dict) and k == "samples":
          grids.update(v)
        elif k.startswith("samples/"):
          grids[k[len("samples/"):]] = v
  if not grids:
    return []
  order = [n for n in grids if n != "regression"] + (["regression"] if "regression" in grids else [])
  fig, axes = plt.subplots(1, len(order), figsize=(2.1 * len(order), 3.3), squeeze=False)
  for ax, name in zip(axes[0], order):
    x = np.asarray(grids[name])[..., 0]          # (10 * PLOT_PER_CLASS, s, s), class-major
    per, side = len(x) // 10, x.shape[1]
    canvas = np.full((10 * (side + 1), per * (side + 1)), -1.0)
    for j, img in enumerate(x):
      r, cc = divmod(j, per)
      canvas[r * (side + 1):r * (side + 1) + side, cc * (side + 1):cc * (side + 1) + side] = img
    ax.imshow(canvas, cmap="gray_r", vmin=-1, vmax=1, interpolation="nearest")
    fd = np.mean([r[f"fd/{name}"] for r in runs if f"fd/{name}" in r])
    ax.set_title(f"{name}\nFD {fd:.2f}", fontsize=8)
    ax.axis("off")
  fig.tight_layout()
  paths = [save(fig, out_dir, "sar_samples.png")]
  scheds = [n for n in order if n != "regression"]
  fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.2))
  for i, name in enumerate(order):
    vals = [r[f"fd/{name}"] for r in runs if f"fd/{name}" in r]
    ax.bar(i, np.mean(vals), color="C1" if name == "regression" else "C0", alpha=0.6)
    ax.plot([i] * len(vals), vals, "k.", ms=4)
  ax.axhline(np.mean([r["fd_floor"] for r in runs]), color="gray", ls="--", lw=1, label="held-out real (floor)")
  ax.set_xticks(range(len(order)), order, rotation=30, fontsize=8)
  ax.set_ylabel("judge-feature FD (lower is better)")
  ax.set_yscale("log")
  ax.legend(fontsize=8)
  for i, name in enumerate(scheds):
    vals = [r[f"speed/{name}"] for r in runs if f"speed/{name}" in r]
    bx.bar(i, np.mean(vals), color="C0", alpha=0.6)
    bx.plot([i] * len(vals), vals, "k.", ms=4)
  bx.set_xticks(range(len(scheds)), [f"{n}\n({runs[0].get(f'steps/{n}', '?')} steps)" for n in scheds], fontsize=7)
  bx.set_ylabel("images / s (sampling)")
  fig.tight_layout()
  paths.append(save(fig, out_dir, "sar_fd_speed.png"))
  return paths
