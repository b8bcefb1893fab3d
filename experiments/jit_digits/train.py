"""JiT on digits: judge, train, sample (stages of `jaxlab.train.run_stages`, each resumable).

Launch: python -m jaxlab.main --config experiments/jit_digits/config.py:tiny --workdir /tmp/jit_digits
Expected (tiny, 2 CPU cores, 2.5-4 minutes per seed with other jobs on the cores): judge-feature FD ratio about
1.2 (samples vs held-out real images, both against the training images) and judge accuracy about 0.98 on the
conditioning class.

Stages:
* "judge": the judge MLP of the data split (trained once, then read from the cache; `method.load_or_train_judge`);
  results: its held-out accuracy and the floor FD(held-out real, train).
* "train": `jaxlab.train.fit` of the DiT in `stages/train/` (its own resumable run: checkpoints every
  train.checkpoint_every steps), the optimizer wrapped with `with_param_ema`; results: the final losses and the
  EMA parameters (stages/1_train.npz), which the samples are drawn with.
* "sample": as many samples as held-out images, with the held-out labels (so the class mix matches the floor's),
  20 Heun steps; results: FD, floor, ratio, judge accuracy (overall and per class), pixel-space FD, the samples.
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
from flax import nnx

from jaxlab import data as data_lib
from jaxlab import progress
from jaxlab.data import images
from jaxlab.evals import frechet
from jaxlab.nn import dit
from jaxlab.train import fit, optim, run_stages
from jaxlab.train import stages as stages_lib

from . import config as config_lib  # noqa: F401  (relative: works for installed and path-loaded experiments)
from . import method

log = logging.getLogger("jaxlab")
PLOT_PER_CLASS = 8


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages and returns the summary (fd, fd_floor, fd_ratio, judge_acc, train/loss, ...)."""
  if config.data.name == "imagenet2012":
    source = images.ImageNetSource("train", image_size=config.data.image_size, data_dir=config.data.data_dir or None)
    stages = {"train": lambda ctx: train_stage(ctx, source, images.to_value_range),
              "sample": lambda ctx: imagenet_sample_stage(ctx, source)}
    return run_stages(config, workdir, stages, summarise=stages_lib.union)
  train, held = method.digits(config)
  source = data_lib.ArraySource(train)
  stages = {"judge": lambda ctx: judge_stage(ctx, train, held),
            "train": lambda ctx: train_stage(ctx, source),
            "sample": lambda ctx: sample_stage(ctx, source, train, held)}
  return run_stages(config, workdir, stages, summarise=summarise)


def judge_stage(ctx, train, held) -> dict:
  judge, cached = method.load_or_train_judge(ctx.config, train)
  log.info("judge: %s", "read from the cache" if cached else "trained and cached")
  f = jax.jit(lambda x: method.judge_features(judge, x))
  pred = np.asarray(jax.numpy.argmax(method.judge_logits(judge, held["image"]), -1))
  return {"judge/held_acc": float(np.mean(pred == held["label"])),
          "judge/floor_fd": frechet.frechet_from_features(np.asarray(f(held["image"])),
                                                          np.asarray(f(train["image"])))}


def _fit(ctx, source, transform=None):
  """`fit` of the DiT in workdir/stages/train (EMA in the optimizer state); a finished run is only restored."""
  config = ctx.config
  cfg = method.dit_config(config)
  return fit(config, os.path.join(ctx.workdir, "stages", "train"), model_fn=lambda rngs: dit.DiT(cfg, rngs=rngs),
             loss_fn=method.make_loss_fn(config), train_source=source, transform=transform,
             wrap_optimizer=lambda tx: optim.with_param_ema(tx, float(config.method.ema_decay)))


def _ema_model(result):
  """(graphdef, state) of the DiT with the EMA parameters (what the samples are drawn with)."""
  model = result.modeldef.merge(optim.param_ema(result.state.opt_state), result.state.model_state)
  return nnx.split(model)


def train_stage(ctx, source, transform=None) -> dict:
  result = _fit(ctx, source, transform)
  return {"train/loss": float(result.summary["train/loss"]), "train/x_mse": float(result.summary["train/x_mse"]),
          "num_params": int(result.summary["num_params"])}


def sample_stage(ctx, source, train, held) -> dict:
  config = ctx.config
  graphdef, params = _ema_model(_fit(ctx, source))
  judge, _ = method.load_or_train_judge(config, train)
  labels = np.asarray(held["label"], np.int32)
  samples = method.generate(config, graphdef, params, labels, ctx.key(), ctx.mesh)
  out = method.scores(judge, samples, labels, train, held)
  keep = np.concatenate([np.flatnonzero(labels == c)[:PLOT_PER_CLASS] for c in np.unique(labels)])
  out["samples"] = samples[keep].astype(np.float32)         # for the plot: the first few of each class
  out["sample_labels"] = labels[keep]
  return out


def imagenet_sample_stage(ctx, source) -> dict:
  """sample.num class-balanced samples to stages/sample/samples.npz (uint8 arr_0 + labels: ADM's evaluator
  layout, for any local Inception); FID when eval.sample_features and eval.reference_stats are given."""
  config = ctx.config
  graphdef, params = _ema_model(_fit(ctx, source, images.to_value_range))
  n, nc = int(config.sample.num), int(config.data.num_classes)
  labels = (np.arange(n) % nc).astype(np.int32)
  side = int(config.data.image_size)
  arr = np.zeros((n, side, side, int(config.model.channels)), np.uint8)   # uint8 as they come (50k x 256^2 x 3)
  with progress.bar(total=n, desc="sampling") as bar:
    for start, x in method.generate_chunks(config, graphdef, params, labels, ctx.key(), ctx.mesh):
      arr[start:start + len(x)] = np.round((x + 1) * 127.5).astype(np.uint8)
      bar.update(len(x))
  path = os.path.join(ctx.subdir(), "samples.npz")
  np.savez(path, arr_0=arr, labels=labels)
  out = {"samples_path": path, "num_samples": n}
  if config.eval.sample_features and config.eval.reference_stats:
    out["fid"] = frechet.fid_from_files(config.eval.sample_features, config.eval.reference_stats)
  return out


def summarise(results) -> dict:
  return {k: v for k, v in stages_lib.union(results).items() if not isinstance(v, np.ndarray)}


def plot(runs, workdirs, out_dir):
  """Samples of the first seed (one row per class) and the judge's per-class accuracy (mean over seeds)."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  if not workdirs:
    return []
  arr = stages_lib.stage_arrays(workdirs[0], 2, "sample")
  if "samples" not in arr:
    return []
  x, y = np.asarray(arr["samples"])[..., 0], np.asarray(arr["sample_labels"])
  classes = np.unique(y)
  h, w = x.shape[1:3]
  grid = np.full((len(classes) * (h + 1), PLOT_PER_CLASS * (w + 1)), -1.0)
  for i, c in enumerate(classes):
    for j, img in enumerate(x[y == c][:PLOT_PER_CLASS]):
      grid[i * (h + 1):i * (h + 1) + h, j * (w + 1):j * (w + 1) + w] = img
  fig, (ax, bx) = plt.subplots(1, 2, figsize=(8, 4.6), gridspec_kw={"width_ratios": [PLOT_PER_CLASS, 4]})
  ax.imshow(grid, cmap="gray_r", vmin=-1, vmax=1, interpolation="nearest")
  ax.set_yticks([i * (h + 1) + h / 2 - 0.5 for i in range(len(classes))], [str(int(c)) for c in classes])
  ax.set_xticks([])
  ax.set_title("samples of the first seed, by conditioning class", fontsize=9)
  accs = np.array([[r.get(f"judge_acc/{int(c)}", np.nan) for c in classes] for r in runs])
  bx.barh(np.arange(len(classes)), np.nanmean(accs, 0), xerr=np.nanstd(accs, 0) if len(runs) > 1 else None,
          color="C0")
  bx.set_yticks(np.arange(len(classes)), [str(int(c)) for c in classes])
  bx.invert_yaxis()
  bx.set_xlim(0.5, 1.0)
  bx.set_xlabel("judge accuracy on the class")
  bx.set_title(f"FD ratio {np.mean([r['fd_ratio'] for r in runs]):.2f} (floor = 1)" if runs else "", fontsize=9)
  fig.tight_layout()
  return [save(fig, out_dir, "jit_digits_samples.png")]
