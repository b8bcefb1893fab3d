"""spectro_diffusion: classifiers, training, inversion checks, sampling and scoring (stages of `run_stages`).

Launch: python -m jaxlab.main --config experiments/spectro_diffusion/config.py:tiny --workdir /tmp/spectro

Stages (synth):
* "classifier": the timbre classifier (4 pitched instruments) and a drums-present classifier on the training
  clips; results: their accuracy on the held-out rendered clips (the ceiling a generator can reach).
* "train": `jaxlab.train.fit` of the text-to-spectrogram DDPM in stages/train/ (resumable; a Polyak average of
  the parameters in the optimizer, which the later stages use).
* "checks": on held-out clips with their own prompts and the trained model: edit-friendly DDPM inversion then the
  reverse process with the recovered noise (max |rebuilt - input|, guidance on and off), DDIM inversion then
  DDIM (its discretisation error, for contrast), and an identity attention controller against no controller
  (bit-identical: 0).
* "sample": `sample.num` mixtures for balanced prompts (instrument x drums), scored by the classifiers; the
  Frechet distance of the classifier's harmonic features between generated and held-out real clips (with the
  train-vs-held floor); spectrograms for the plot and a few Griffin-Lim WAVs in stages/sample/.

The multitrack variant (full) trains on a folder of stem WAVs (prompts = the stems present in a clip) and runs
"train" and "sample" (no classifier: the scores need synthetic ground truth).
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab import data as data_lib
from jaxlab.audio import spectral
from jaxlab.diffusion import controllers as ctl
from jaxlab.diffusion import ddpm
from jaxlab.evals import frechet
from jaxlab.train import fit, optim, run_stages
from jaxlab.train import stages as stages_lib

from . import config as config_lib
from . import method

log = logging.getLogger("jaxlab")
PLOT_PER_PROMPT = 3
WAVS = 4


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages; returns the summary (acc/generated, acc/held_real, checks/..., fd/...)."""
  if config.data.name == "multitrack":
    return _multitrack_run(config, workdir)
  data = method.synth_data(config)
  mean, std = method.stats(data["train"])
  norm = {"spec": ((data["train"]["spec"] - mean) / std).astype(np.float32), "tokens": data["train"]["tokens"]}
  stages = {"classifier": lambda ctx: classifier_stage(ctx, data),
            "train": lambda ctx: train_stage(ctx, norm),
            "checks": lambda ctx: checks_stage(ctx, data, norm, mean, std),
            "sample": lambda ctx: sample_stage(ctx, data, norm, mean, std)}
  return run_stages(config, workdir, stages, summarise=summarise)


def classifier_stage(ctx, data) -> dict:
  inst, drums = method.classifiers(ctx.config, data["train"], method.logmel(ctx.config))
  held = data["held"]
  return {"acc/held_real": inst.accuracy(held["spec"], held["label"]),
          "acc_drums/held_real": drums.accuracy(held["spec"], held["drums"].astype(np.int32))}


_FITTED = {}


def _fit(ctx, norm):
  """`fit` in workdir/stages/train (a finished run is only restored, once per process)."""
  config = ctx.config
  path = os.path.join(ctx.workdir, "stages", "train")
  key = (os.path.abspath(path), config.to_json())
  if key not in _FITTED:
    _FITTED.clear()
    _FITTED[key] = fit(config, path, model_fn=method.make_model_fn(config), loss_fn=method.make_loss_fn(config),
                       train_source=data_lib.ArraySource(norm),
                       wrap_optimizer=lambda tx: optim.with_param_ema(tx, float(config.diffusion.ema_decay)))
  return _FITTED[key]


def _ema_model(result):
  return result.modeldef.merge(optim.param_ema(result.state.opt_state), result.state.model_state)


def train_stage(ctx, norm) -> dict:
  s = _fit(ctx, norm).summary
  return {"train/loss": float(s["train/loss"]), "num_params": int(s["num_params"])}


def checks_stage(ctx, data, norm, mean, std) -> dict:
  """Inversion round trips and the no-op controller on held-out clips (normalised units)."""
  config = ctx.config
  model = _ema_model(_fit(ctx, norm))
  n = int(config.checks.num)
  x = jnp.asarray((data["held"]["spec"][:n] - mean) / std, jnp.float32)
  tokens = jnp.asarray(data["held"]["tokens"][:n])
  sched = method.schedule(config)
  steps, start = int(config.sample.steps), int(config.checks.start)
  graphdef, state = nnx.split(model)
  out = {}
  for scale in (1.0, float(config.sample.cfg)):
    @jax.jit
    def round_trip(state, x, key, scale=scale):
      fn = _denoiser(graphdef, state, tokens, scale)
      xs, zs = ddpm.edit_friendly_inversion(fn, sched, x, key, num_steps=steps, start=start)
      return ddpm.reverse(fn, sched, xs, num_steps=steps, start=start, zs=zs)
    rebuilt = round_trip(state, x, ctx.key())
    out[f"checks/edit_friendly_max_abs/cfg{scale:g}"] = float(jnp.max(jnp.abs(rebuilt - x)))

  @jax.jit
  def ddim_trip(state, x):
    fn = _denoiser(graphdef, state, tokens, 1.0)
    return ddpm.reverse(fn, sched, ddpm.ddim_invert(fn, sched, x, num_steps=steps, start=start), num_steps=steps,
                        start=start, eta=0.0)
  out["checks/ddim_max_abs"] = float(jnp.max(jnp.abs(ddim_trip(state, x) - x)))
  t = jnp.full((n,), 500, jnp.int32)
  plain = model(x, t, tokens)
  hooked = model(x, t, tokens, controller=ctl.identity)
  out["checks/noop_controller_max_abs"] = float(jnp.max(jnp.abs(plain - hooked)))
  log.info("checks: %s", out)
  return out


def _denoiser(graphdef, state, tokens, scale):
  from jaxlab.audio import model as model_lib  # pylint: disable=g-import-not-at-top
  return model_lib.guided_denoiser(nnx.merge(graphdef, state), tokens, scale)


def sample_stage(ctx, data, norm, mean, std) -> dict:
  config = ctx.config
  fspec = method.logmel(config)
  model = _ema_model(_fit(ctx, norm))
  tokens, label, drums = method.prompts(int(config.sample.num))
  gen = method.generate(config, model, tokens, ctx.key(), mean, std)
  inst, dclf = method.classifiers(config, data["train"], fspec)
  pred = inst.predict(gen)
  out = {"acc/generated": float(np.mean(pred == label)),
         "acc_drums/generated": float(np.mean(dclf.predict(gen) == drums.astype(np.int32)))}
  for i, name in enumerate(method.VOCAB[:4]):
    out[f"acc/generated/{name}"] = float(np.mean(pred[label == i] == i))
  held = data["held"]["spec"]
  feats = {k: inst.features(v) for k, v in (("gen", gen), ("held", held), ("train", data["train"]["spec"][:len(held)]))}
  out["fd/harmonic"] = frechet.frechet_from_features(feats["gen"], feats["held"])
  out["fd/harmonic_floor"] = frechet.frechet_from_features(feats["train"], feats["held"])
  keep = np.concatenate([np.flatnonzero((label == i) & (drums == d))[:PLOT_PER_PROMPT]
                         for d in (False, True) for i in range(4)])
  out["samples/generated"] = gen[keep].astype(np.float32)
  out["samples/tokens"] = tokens[keep]
  real = np.concatenate([np.flatnonzero(data["held"]["label"] == i)[:PLOT_PER_PROMPT] for i in range(4)])
  out["samples/real"] = held[real].astype(np.float32)
  wav_dir = os.path.join(ctx.subdir(), "wav")
  audio = np.asarray(fspec.to_audio(jnp.asarray(gen[keep][:WAVS]), key=jax.random.key(0)))
  for j, (w, tok) in enumerate(zip(audio, tokens[keep][:WAVS])):
    name = "+".join(method.VOCAB[t] for t in tok if t >= 0)
    spectral.write_wav(os.path.join(wav_dir, f"{j}_{name}.wav"), w, fspec.sr)
  log.info("generated: timbre accuracy %.3f (held-out real %.3f), drums agreement %.3f, FD %.3f (floor %.3f)",
           out["acc/generated"], ctx.results.get("classifier", {}).get("acc/held_real", float("nan")),
           out["acc_drums/generated"], out["fd/harmonic"], out["fd/harmonic_floor"])
  return out


def summarise(results) -> dict:
  return {k: v for k, v in stages_lib.union(results).items() if not isinstance(v, np.ndarray)}


# ------------------------------------------------------------------------------------------- multitrack (full)


def _multitrack_run(config, workdir: str) -> dict:
  """Trains on a multitrack folder: log-mel clips of the mixtures, prompts = the stems present (rms above
  silence) in the clip; samples one mixture per stem subset to stages/sample/samples.npz."""
  from jaxlab.audio import multitrack  # pylint: disable=g-import-not-at-top
  config_lib.require_data(config)
  fspec = method.logmel(config)
  stems = tuple(config.data.stems)
  songs = multitrack.process_slice(multitrack.list_songs(config.data.path, split=config.data.split or None))
  specs, tokens = [], []
  fn = jax.jit(fspec.__call__)
  for batch in multitrack.iterate_features(songs, sr=fspec.sr, clip_seconds=fspec.clip_seconds,
                                           hop_seconds=float(config.data.hop_seconds), features_fn=None,
                                           batch_size=64, stems=stems):
    specs.append(np.asarray(fn(batch["mix"])))
    present = np.stack([np.sqrt(np.mean(np.square(batch[s]), axis=-1)) > 1e-3 for s in stems], axis=1)
    tok = np.full((len(present), len(stems)), -1, np.int32)
    for i, row in enumerate(present):
      ids = np.flatnonzero(row)
      tok[i, :len(ids)] = ids
    tokens.append(tok)
  spec = np.concatenate(specs)
  mean, std = float(spec.mean()), float(spec.std())
  norm = {"spec": ((spec - mean) / std).astype(np.float32), "tokens": np.concatenate(tokens)}

  def train(ctx):
    config = ctx.config
    path = os.path.join(ctx.workdir, "stages", "train")
    r = fit(config, path, model_fn=method.make_model_fn(config, len(stems), len(stems)),
            loss_fn=method.make_loss_fn(config), train_source=data_lib.ArraySource(norm),
            wrap_optimizer=lambda tx: optim.with_param_ema(tx, float(config.diffusion.ema_decay)))
    _FITTED[("multitrack", path)] = r
    return {"train/loss": float(r.summary["train/loss"]), "num_params": int(r.summary["num_params"]),
            "data/mean": mean, "data/std": std, "data/clips": len(spec)}

  def sample(ctx):
    r = _FITTED.get(("multitrack", os.path.join(ctx.workdir, "stages", "train")))
    if r is None:
      train(ctx)
      r = _FITTED[("multitrack", os.path.join(ctx.workdir, "stages", "train"))]
    n = int(ctx.config.sample.num)
    tok = norm["tokens"][np.random.default_rng(0).integers(0, len(spec), n)]
    gen = method.generate(ctx.config, _ema_model(r), tok, ctx.key(), mean, std)
    path = os.path.join(ctx.subdir(), "samples.npz")
    np.savez(path, logmel=gen, tokens=tok, stems=np.asarray(stems))
    return {"samples_path": path}
  return run_stages(config, workdir, {"train": train, "sample": sample}, summarise=stages_lib.union)


# ------------------------------------------------------------------------------------------------- plots


def plot(runs, workdirs, out_dir):
  """Generated spectrograms per prompt next to real ones (first seed), and per-instrument accuracy."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  if not workdirs or not runs:
    return []
  names = list(runs[0].get("stages", []))
  if "sample" not in names:
    return []
  arrs = stages_lib.stage_arrays(workdirs[0], names.index("sample"), "sample")
  gen, toks, real = (np.asarray(arrs[f"samples/{k}"]) for k in ("generated", "tokens", "real"))
  cols = PLOT_PER_PROMPT
  fig, axes = plt.subplots(3, 4, figsize=(10, 7), squeeze=False)
  lo, hi = float(np.percentile(real, 1)), float(np.percentile(real, 99.5))
  rows = [("real", [real[i * cols:(i + 1) * cols] for i in range(4)], [[i] for i in range(4)])]
  for d in (False, True):
    blocks, prompts = [], []
    for i in range(4):
      sel = (toks[:, 0] == i) & ((toks[:, 1] >= 0) == d)
      blocks.append(gen[sel])
      prompts.append([i] + ([method.DRUMS] if d else []))
    rows.append(("generated", blocks, prompts))
  for r, (title, blocks, prompts) in enumerate(rows):
    for i in range(4):
      ax = axes[r][i]
      if len(blocks[i]):
        ax.imshow(np.concatenate(list(blocks[i]), axis=1), origin="lower", aspect="auto", vmin=lo, vmax=hi,
                  cmap="magma")
      ax.set_title(f"{title}: " + " + ".join(method.VOCAB[t] for t in prompts[i]), fontsize=8)
      ax.set_xticks([])
      ax.set_yticks([])
  fig.suptitle(f"log spectrograms ({real.shape[1]} bands x {real.shape[2]} frames each; first seed)",
               fontsize=9)
  fig.tight_layout()
  paths = [save(fig, out_dir, "spectro_samples.png")]
  fig, ax = plt.subplots(figsize=(6, 3))
  inst = list(method.VOCAB[:4])
  for i, name in enumerate(inst):
    vals = [r[f"acc/generated/{name}"] for r in runs if f"acc/generated/{name}" in r]
    ax.bar(i, np.mean(vals), color="C0", alpha=0.6)
    ax.plot([i] * len(vals), vals, "k.", ms=5)
  ax.axhline(config_lib.ACCURACY_MIN, color="C3", ls="--", lw=1, label="claim threshold (mean)")
  ax.axhline(np.mean([r["acc/held_real"] for r in runs if "acc/held_real" in r]), color="gray", ls=":", lw=1,
             label="classifier on held-out real clips")
  ax.set_xticks(range(4), inst)
  ax.set_ylim(0, 1.05)
  ax.set_ylabel("timbre accuracy on generated")
  ax.legend(fontsize=7, loc="lower right")
  fig.tight_layout()
  paths.append(save(fig, out_dir, "spectro_accuracy.png"))
  return paths
