"""Latent Forcing: judge, latents, then train / sample per arm (stages of `jaxlab.train.run_stages`, resumable).

Launch: python -m jaxlab.main --config experiments/latent_forcing/config.py:tiny --workdir /tmp/latent_forcing

Stages (MNIST, v2; the 8x8 digits of tiny_v1 alike):
* "judge": the cached judge of the data split (MNIST: the 28x28 kit's CNN, `jaxlab.evals.mnist_kit`; digits: the
  MLP of `jaxlab.evals.judge`); results: its held-out accuracy, the floor FD(held-out real, train) in its
  features and, on MNIST, the FD of sample.num random real digits over 20 draws (the FD's sampling noise).
* "latents": the frozen encoders' latents of every training image (the semantic encoder is trained once per
  data split and cached; the pixel-downsample latent is computed); arrays in stages/1_latents.npz.
* "train_<arm>": `jaxlab.train.fit` of the arm's two-stream DiT in stages/<arm>/ (its own resumable run, the
  optimizer wrapped with `with_param_ema`); results: final losses, parameter count.
* "sample_<arm>": sample.num samples per time table of the arm with the EMA weights (equal steps / NFE for every
  arm); results: FD to the training images, FD / floor, the judge's class-histogram entropy and confidence,
  a few samples for the plot; the cascade arms also decode the held-out images' real latents.

The full variant (ImageNet) runs "train_<arm>" and "sample_<arm>" only, with the latent encoded in the step
by the frozen encoder held inside the model, and writes samples in ADM's evaluator layout (FID from local files).
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np

from jaxlab import data as data_lib
from jaxlab.nn import dit
from jaxlab.train import fit, optim, run_stages
from jaxlab.train import stages as stages_lib

from . import method

log = logging.getLogger("jaxlab")
PLOT_SAMPLES = 40
SAMPLE_KEY = 7919     # the sampling noise key is fold_in(key(seed), SAMPLE_KEY) for every arm


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages; returns the summary (fd/<arm>[/<sampler>], entropy/..., fd_floor, train losses)."""
  if config.data.name == "imagenet2012":
    from . import full  # pylint: disable=g-import-not-at-top  (the ImageNet path: tfds, DINOv2)
    return full.train_and_evaluate(config, workdir)
  train, held = method.digits(config)
  stages = {"judge": lambda ctx: judge_stage(ctx, train, held),
            "latents": lambda ctx: latents_stage(ctx, train, held)}
  for arm in config.method.arms:
    stages[f"train_{arm}"] = lambda ctx, arm=arm: train_stage(ctx, arm, train)
    stages[f"sample_{arm}"] = lambda ctx, arm=arm: sample_stage(ctx, arm, train, held)
  return run_stages(config, workdir, stages, summarise=summarise)


def judge_stage(ctx, train, held) -> dict:
  scorer = method.scorer(ctx.config, train)
  log.info("judge: %s", "read from the cache" if scorer.cached else "trained and cached")
  return scorer.floor(held, int(ctx.config.sample.num), balanced=False)


def _latent_kinds(config) -> set[str]:
  kinds = {method.arm_spec(a)[1] for a in config.method.arms}
  return {"semantic" if k == "none" else k for k in kinds}


def latents_stage(ctx, train, held) -> dict:
  out = method.digits_latents(ctx.config, train, _latent_kinds(ctx.config), held)
  res = {f"latent/{k}": np.asarray(v) for k, v in out.items() if isinstance(v, np.ndarray)}
  if "semantic_acc" in out:
    res["latent/semantic_acc"] = out["semantic_acc"]
    res["latent/semantic_scale"] = out["semantic_scale"]
  if "semantic_held_acc" in out:
    res["latent/semantic_held_acc"] = out["semantic_held_acc"]
  return res


def _arm_latents(ctx, arm) -> np.ndarray:
  kind = method.arm_spec(arm)[1]
  return np.asarray(ctx.results["latents"][f"latent/{'semantic' if kind == 'none' else kind}"])


def _arm_model(ctx, arm) -> dit.DiTConfig:
  lat = _arm_latents(ctx, arm)
  spec = method.latent_spec(ctx.config, method.arm_spec(arm)[1], lat.shape[-1])
  method.check_latent_grid(ctx.config, spec.kind, lat, spec.patch)
  return method.dit_config(ctx.config, spec)


_FITTED = {}   # (arm folder, arm, config) -> (FitResult, DiTConfig) of this process: the sample stage reuses the
               # train stage's instead of restoring it (a restore compiles the state's init again)


def _fit(ctx, arm, train):
  """`fit` of the arm's DiT in workdir/stages/<arm> (EMA in the optimizer state); a finished run is only
  restored (once per process)."""
  config = ctx.config
  path = os.path.join(ctx.workdir, "stages", arm)
  key = (os.path.abspath(path), arm, config.to_json())
  if key not in _FITTED:
    cfg = _arm_model(ctx, arm)
    source = data_lib.ArraySource({"image": train["image"], "label": train["label"],
                                   "latent": _arm_latents(ctx, arm)})
    ema = float(config.method.ema_decay)
    result = fit(config, path, model_fn=lambda rngs: dit.DiT(cfg, rngs=rngs), loss_fn=method.make_loss_fn(config, arm),
                 train_source=source, wrap_optimizer=lambda tx: optim.with_param_ema(tx, ema))
    _FITTED.clear()
    _FITTED[key] = (result, cfg)
  return _FITTED[key]


def train_stage(ctx, arm, train) -> dict:
  result, _ = _fit(ctx, arm, train)
  s = result.summary
  return {f"train/{arm}/loss": float(s["train/loss"]), f"train/{arm}/loss_pixel": float(s["train/loss_pixel"]),
          f"train/{arm}/loss_latent": float(s["train/loss_latent"]), f"num_params/{arm}": int(s["num_params"])}


def sample_stage(ctx, arm, train, held) -> dict:
  config = ctx.config
  result, cfg = _fit(ctx, arm, train)
  graphdef, params = method.ema_dit(result)
  guide = None
  if config.sample.guidance == "autoguidance":
    lat = _arm_latents(ctx, arm)
    guide = method.load_guide(config, arm, method.latent_spec(config, method.arm_spec(arm)[1], lat.shape[-1]))
  scorer = method.scorer(config, train)
  n = int(config.sample.num)
  labels = np.arange(n) % int(config.data.num_classes)
  tables = method.time_tables(config, arm)
  floor = ctx.results["judge"]["fd_floor"]
  key = jax.random.fold_in(jax.random.key(int(config.seed)), SAMPLE_KEY)   # common to the arms (paired)
  sampler = method.make_sampler(config, graphdef, guide)
  out = {}
  for name, table in tables.items():
    fd_key = method.config_lib.fd_key(arm, None if len(tables) == 1 else name)
    x = method.generate(config, arm, sampler, table, params, cfg, labels, key, ctx.mesh)
    s = scorer.score(x)
    suffix = fd_key[len("fd/"):]
    out.update({fd_key: s["fd"], f"fd_ratio/{suffix}": s["fd"] / floor, f"entropy/{suffix}": s["entropy"],
                f"confidence/{suffix}": s["confidence"], f"pixel_fd/{suffix}": method.pixel_fd(config, x, train),
                f"samples/{suffix}": x[:PLOT_SAMPLES].astype(np.float32)})
  if method.arm_spec(arm)[2] == "cascade":   # the pixel phase from the held-out images' real latents (report)
    kind = method.arm_spec(arm)[1]
    real = np.resize(np.asarray(ctx.results["latents"][f"latent/{kind}_held"]),
                     (n, *cfg.stream_shape(method.LATENT)))
    table = tables["cascade"]
    k = int(config.sample.cascade_latent_steps)
    x = method.decode_latents(config, sampler, {s: v[k:] for s, v in table.items()}, params, cfg, real, labels,
                              key, ctx.mesh)
    out[f"fd/{arm}/decode_heldout"] = scorer.score(x)["fd"]
  return out


def summarise(results) -> dict:
  return {k: v for k, v in stages_lib.union(results).items() if not isinstance(v, np.ndarray)}


def _flat(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _sample_grids(workdir, arms) -> dict[str, np.ndarray]:
  """{arm[/sampler]: (n, s, s, 1) samples} saved by the sample stages of a run."""
  out = {}
  for i, arm in enumerate(arms):
    for k, v in _flat(stages_lib.stage_arrays(workdir, 3 + 2 * i, f"sample_{arm}")).items():
      if k.startswith("samples/"):
        out[k[len("samples/"):]] = v
  return out


def plot(runs, workdirs, out_dir):
  """Samples of every arm / sampler (first seed) and the judge-feature FD per arm / sampler (seeds as points)."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  if not workdirs or not runs:
    return []
  arms = [s[len("train_"):] for s in runs[0].get("stages", []) if s.startswith("train_")]
  grids = _sample_grids(workdirs[0], arms)
  if not grids:
    return []
  per_row = 10
  names = list(grids)
  fig, axes = plt.subplots(len(names), 1, figsize=(per_row * 0.55, len(names) * 1.35 + 0.3), squeeze=False)
  for ax, name in zip(axes[:, 0], names):
    x = np.asarray(grids[name])[:2 * per_row, ..., 0]
    h, w = x.shape[1:3]
    rows = -(-len(x) // per_row)
    canvas = np.full((rows * (h + 1), per_row * (w + 1)), -1.0)
    for j, img in enumerate(x):
      r, cc = divmod(j, per_row)
      canvas[r * (h + 1):r * (h + 1) + h, cc * (w + 1):cc * (w + 1) + w] = img
    ax.imshow(canvas, cmap="gray_r", vmin=-1, vmax=1, interpolation="nearest")
    fd = np.mean([r[f"fd/{name}"] for r in runs if f"fd/{name}" in r])
    ax.set_title(f"{name}: FD {fd:.2f} (mean of {len(runs)} seeds)", fontsize=8)
    ax.axis("off")
  fig.tight_layout()
  paths = [save(fig, out_dir, "latent_forcing_samples.png")]
  fig, ax = plt.subplots(figsize=(1.1 * len(names) + 1.5, 3.2))
  for i, name in enumerate(names):
    vals = [r[f"fd/{name}"] for r in runs if f"fd/{name}" in r]
    ax.bar(i, np.mean(vals), color="C0" if not name.startswith(("ms", "lf_pix")) else "C1", alpha=0.6)
    ax.plot([i] * len(vals), vals, "k.", ms=4)
  ax.axhline(np.mean([r["fd_floor"] for r in runs]), color="gray", ls="--", lw=1, label="held-out real (floor)")
  ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
  ax.set_ylabel("judge-feature FD (lower is better)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  paths.append(save(fig, out_dir, "latent_forcing_fd.png"))
  return paths
