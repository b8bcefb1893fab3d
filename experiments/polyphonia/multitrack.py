"""polyphonia at full scale: a multitrack folder (MUSDB18-HQ / MoisesDB layout) from a path.

Stages:
* "train": the text-to-spectrogram DDPM on clips of the `data.split` songs, the prompt = the stems audible in
  the clip (`jaxlab.audio.multitrack`).
* "edit": clips of the `data.edit_split` songs where `data.edit_stem` is audible, that stem re-prompted as each
  stem absent from the clip (the edited stem's token first in both prompts); the prior from Demucs on the
  mixture (`data.prior="demucs"`, the optional `demucs` extra) or the folder's own stems ("oracle"); the arms
  prompt swap, attention injection, SDEdit and Polyphonia; the non-target log-spectral distance to the source
  (bins where the stem's true mask < 0.2); edits saved to stages/edit/edits.npz with WAVs.

Target accuracy and the distance to a true edit need ground truth a recorded song does not have; CLAP / FAD
scoring with a user's own models works on the saved WAVs.
"""

from __future__ import annotations

import os

import jax
import numpy as np

from jaxlab import data as data_lib
from jaxlab import progress
from jaxlab.audio import metrics as audio_metrics
from jaxlab.audio import multitrack, separation, spectral
from jaxlab.train import fit, optim, run_stages
from jaxlab.train import stages as stages_lib

from . import config as config_lib
from . import method

ARMS = ("prompt_swap", "injection", "sdedit", "polyphonia")


def _clips(config, split):
  """(log-mels (N, F, T), waves {"mix", stem...} (N, L), present (N, S) bool) of a split's clips."""
  fspec = method.logmel(config)
  stems = tuple(config.data.stems)
  songs = multitrack.process_slice(multitrack.list_songs(config.data.path, split=split or None))
  waves = {k: [] for k in ("mix",) + stems}
  for batch in multitrack.iterate_features(songs, sr=fspec.sr, clip_seconds=fspec.clip_seconds,
                                           hop_seconds=float(config.data.hop_seconds), features_fn=None,
                                           batch_size=64, stems=stems):
    for k in waves:
      waves[k].append(np.asarray(batch[k], np.float32))
  waves = {k: np.concatenate(v) for k, v in waves.items()}
  present = np.stack([np.sqrt(np.mean(np.square(waves[s]), axis=-1)) > 1e-3 for s in stems], axis=1)
  return fspec.batched(waves["mix"]), waves, present


def _prompts(present, first=None):
  """(N, S) token ids of the present stems (-1 pads), stem `first` moved to the front where present."""
  out = np.full(present.shape, -1, np.int32)
  for i, row in enumerate(present):
    ids = [int(j) for j in np.flatnonzero(row)]
    if first is not None and first in ids:
      ids.remove(first)
      ids.insert(0, first)
    out[i, :len(ids)] = ids
  return out


def run(config, workdir: str) -> dict:
  config_lib.require_data(config)
  spec, _, present = _clips(config, config.data.split)
  mean, std = float(spec.mean()), float(spec.std())
  norm = {"spec": ((spec - mean) / std).astype(np.float32), "tokens": _prompts(present)}
  path = os.path.join(workdir, "stages", "train")
  fitted = {}
  stems = tuple(config.data.stems)

  def get_fit(config):
    if "r" not in fitted:
      fitted["r"] = fit(config, path, model_fn=method.sd.make_model_fn(config, len(stems), len(stems)),
                        loss_fn=method.make_loss_fn(config), train_source=data_lib.ArraySource(norm),
                        wrap_optimizer=lambda tx: optim.with_param_ema(tx, float(config.diffusion.ema_decay)))
    return fitted["r"]

  def train(ctx):
    r = get_fit(ctx.config)
    return {"train/loss": float(r.summary["train/loss"]), "num_params": int(r.summary["num_params"]),
            "data/mean": mean, "data/std": std, "data/clips": len(spec)}

  def edit(ctx):
    c = ctx.config
    fspec = method.logmel(c)
    r = get_fit(c)
    model = r.modeldef.merge(optim.param_ema(r.state.opt_state), r.state.model_state)
    src_spec, waves, pres = _clips(c, c.data.edit_split)
    e = stems.index(c.data.edit_stem)
    rows, targets = [], []
    for i in np.flatnonzero(pres[:, e]):
      for j in np.flatnonzero(~pres[i]):
        rows.append(int(i))
        targets.append(int(j))
    rows, targets = np.asarray(rows[:int(c.tasks.num_clips)]), np.asarray(targets[:int(c.tasks.num_clips)])
    if not len(rows):
      raise ValueError(f"no clip of split {c.data.edit_split!r} has an audible {c.data.edit_stem!r} stem and an "
                       "absent one to re-prompt it as")
    src_tok = _prompts(pres[rows], first=e)
    tgt_tok = src_tok.copy()
    tgt_tok[:, 0] = targets
    rest = waves["mix"][rows] - waves[c.data.edit_stem][rows]
    oracle = np.asarray(jax.jit(fspec.stem_mask)(waves[c.data.edit_stem][rows], rest))
    if c.data.prior == "demucs":
      prior = []
      with progress.bar(total=len(rows), desc="demucs") as bar:
        for k, i in enumerate(rows):
          prior.append(separation.demucs_prior(fspec, waves["mix"][i], os.path.join(ctx.subdir(), "demucs", str(k)),
                                               stem=c.data.edit_stem, model=c.data.demucs_model))
          bar.update(1)
      prior = np.stack(prior)
    else:
      prior = oracle
    expo = float(c.separator.exponent)
    # the official layout biases every stem phrase of the target prompt with its own prior: position 0 the edited
    # stem's; the others, with prior=oracle, their own stems' masks, with Demucs in two-stem mode the complement
    # of the edited stem's (a two-stem separator does not tell the other stems apart)
    positions = np.zeros((len(rows), tgt_tok.shape[1]) + prior.shape[1:], np.float32)
    positions[:, 0] = prior
    for j in range(1, tgt_tok.shape[1]):
      for k in range(len(rows)):
        if tgt_tok[k, j] < 0:
          continue
        if c.data.prior == "oracle":
          w = waves[stems[tgt_tok[k, j]]][rows[k]]
          positions[k, j] = np.asarray(fspec.stem_mask(w, waves["mix"][rows[k]] - w))
        else:
          positions[k, j] = 1.0 - prior[k]
    prior = np.asarray(prior) ** expo      # the prior G (the paper's sqrt of the power mask)
    given = {"imperfect": prior, "imperfect_positions": np.clip(positions, 0.0, 1.0) ** expo}
    with progress.bar(total=len(rows) * len(ARMS), desc="edits (tasks x arms)") as bar:
      edits = method.run_arms(c, model, src_spec[rows], src_tok, tgt_tok, given, ctx.key(), mean,
                              std, arms=ARMS, bar=bar)
    keep = oracle < config_lib.NONTARGET_MASK
    out = {f"lsd_nontarget/{a}": float(np.nanmean(audio_metrics.log_spectral_distance(y, src_spec[rows], mask=keep)))
           for a, y in edits.items()}
    np.savez(os.path.join(ctx.subdir(), "edits.npz"), source=src_spec[rows], prior=prior, src_tokens=src_tok,
             tgt_tokens=tgt_tok, stems=np.asarray(stems), **edits)
    audio = {a: np.asarray(fspec.to_audio(y[:int(c.edit.wavs)], key=jax.random.key(0))) for a, y in edits.items()}
    for k in range(min(int(c.edit.wavs), len(rows))):
      for a, w in audio.items():
        name = f"{k}_{c.data.edit_stem}_to_{stems[targets[k]]}_{a}.wav"
        spectral.write_wav(os.path.join(ctx.subdir(), "wav", name), w[k], fspec.sr)
    out["tasks/num"] = len(rows)
    return out

  return run_stages(config, workdir, {"train": train, "edit": edit}, summarise=stages_lib.union)
