"""polyphonia: classifier, model, edit tasks, edits and scores (stages of `run_stages`).

Launch: python -m jaxlab.main --config experiments/polyphonia/config.py:tiny --workdir /tmp/polyphonia

Stages (synth):
* "classifier": the timbre classifier (4 pitched instruments) on the training clips; results: its accuracy on
  held-out rendered clips and on the tasks' ground-truth edits (the ceiling an editor can reach).
* "train": `jaxlab.train.fit` of the text-to-spectrogram DDPM in stages/train/ (resumable; the Polyak average
  of the parameters is what edits), as spectro_diffusion's train stage.
* "tasks": the edit grid (tasks.num_clips held-out clips x 3 target instruments) written to stages/tasks/
  tasks.jsonl, with the separator prior's agreement with the oracle mask.
* "edit": every arm on every task (`method.run_arms`), per-task scores, paired statistics, example WAVs
  (source, each main arm, truth) in stages/edit/wav/, spectrograms for the plot.

The multitrack variant (full) trains on a folder of stem WAVs and edits `data.edit_stem` of held-out clips with
Demucs priors (no scores: they need the synthesiser's ground truth); see the README.
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import progress
from jaxlab.audio import spectral
from jaxlab.experiments.spectro_diffusion import train as sd_train
from jaxlab.train import run_stages
from jaxlab.train import stages as stages_lib

from . import config as config_lib
from . import method

log = logging.getLogger("jaxlab")
EXAMPLES = 6      # tasks kept for the spectrogram figure


def train_and_evaluate(config, workdir: str) -> dict:
  """Runs the stages; returns the summary (acc/<arm>, lsd_*/<arm>, ratio/..., paired/..., ablation/...)."""
  if config.data.name == "multitrack":
    from . import multitrack  # pylint: disable=g-import-not-at-top
    return multitrack.run(config, workdir)
  data = method.train_data(config)
  mean, std = method.stats(data["train"])
  norm = {"spec": ((data["train"]["spec"] - mean) / std).astype(np.float32), "tokens": data["train"]["tokens"]}
  stages = {"classifier": lambda ctx: classifier_stage(ctx, data),
            "train": lambda ctx: sd_train.train_stage(ctx, norm),
            "tasks": tasks_stage,
            "edit": lambda ctx: edit_stage(ctx, data, norm, mean, std)}
  return run_stages(config, workdir, stages, summarise=summarise)


_CACHE = {}


def _classifier(config, data):
  from jaxlab.audio import timbre  # pylint: disable=g-import-not-at-top
  key = ("clf", config.data.to_json(), config.features.to_json(), config.classifier.to_json())
  if key not in _CACHE:
    fspec = method.logmel(config)
    _CACHE[key] = timbre.TimbreClassifier(method.PITCHED, fspec.centres_hz, c=float(config.classifier.c)).fit(
        data["train"]["spec"], data["train"]["label"])
  return _CACHE[key]


def _task_key(config) -> tuple:
  """What the tasks depend on (an edit setting's config shares the run's tasks, classifier and priors)."""
  return (config.data.to_json(), config.features.to_json(), config.tasks.to_json(), int(config.seed))


def _tasks(config):
  key = ("tasks",) + _task_key(config)
  if key not in _CACHE:
    _CACHE[key] = method.make_tasks(config, int(config.seed))
  return _CACHE[key]


def _priors(config):
  key = ("priors", config.separator.to_json()) + _task_key(config)
  if key not in _CACHE:
    _CACHE[key] = method.priors(config, _tasks(config), jax.random.key(int(config.seed)))
  return _CACHE[key]


def classifier_stage(ctx, data) -> dict:
  clf = _classifier(ctx.config, data)
  tasks = _tasks(ctx.config)
  return {"acc/held_real": clf.accuracy(data["held"]["spec"], data["held"]["label"]),
          "acc/truth": clf.accuracy(tasks.truth, tasks.tgt_label),
          "acc/source_as_target": clf.accuracy(tasks.source, tasks.tgt_label)}


def tasks_stage(ctx) -> dict:
  tasks = _tasks(ctx.config)
  path = method.write_jsonl(tasks, os.path.join(ctx.subdir(), "tasks.jsonl"))
  prior = _priors(ctx.config)
  hard = lambda m: m >= 0.5
  inter = np.sum(hard(prior["imperfect"]) & hard(prior["oracle"]))
  union = np.sum(hard(prior["imperfect"]) | hard(prior["oracle"]))
  return {"tasks/num": len(tasks), "tasks/clips": int(ctx.config.tasks.num_clips), "tasks/path": path,
          "prior/iou_imperfect_vs_oracle": float(inter / max(union, 1)),
          "prior/mean_abs_error": float(np.mean(np.abs(prior["imperfect"] - prior["oracle"])))}


def _moments(x) -> dict:
  x = np.asarray(x, np.float64)
  return {"n": float(len(x)), "mean": float(np.mean(x)), "m2": float(np.sum((x - np.mean(x)) ** 2))}


def edit_stage(ctx, data, norm, mean, std, config=None) -> dict:
  """Every arm on every task and the statistics of the claims. `config`: the edit's settings when they differ
  from the run's (the calibration's edit passes over one trained model); the model is the run's."""
  config = ctx.config if config is None else config
  tasks = _tasks(config)
  prior = _priors(config)
  model = sd_train._ema_model(sd_train._fit(ctx, norm))  # pylint: disable=protected-access
  arms = method.arms_of(config)
  with progress.bar(total=len(tasks) * len(arms), desc="edits (tasks x arms)") as bar:
    edits = method.run_arms(config, model, tasks.source, tasks.src_tokens, tasks.tgt_tokens, prior, ctx.key(), mean,
                            std, arms=arms, bar=bar)
  per = method.score(edits, tasks, _classifier(config, data), config_lib.NONTARGET_MASK)
  out = {k: float(np.mean(v)) for k, v in per.items()}
  acc, truth = (lambda a: per[f"acc/{a}"]), (lambda a: per[f"lsd_truth/{a}"])
  nt_truth = lambda a: per[f"lsd_nontarget_truth/{a}"]  # noqa: E731
  # claims v2 (config.CLAIMS): per-task paired differences, pooled over the seeds by the claims
  best = max(method.BASELINES, key=lambda a: out[f"acc/{a}"])      # the strongest baseline of this run
  out["paired/best_baseline"] = method.BASELINES.index(best)
  out["rel/acc_gain_best"] = out["acc/polyphonia"] / max(out[f"acc/{best}"], 1e-9) - 1.0
  for name, d in (("acc_gain_best", acc("polyphonia") - acc(best)),
                  ("nontarget_vs_swap", nt_truth("polyphonia") - nt_truth("prompt_swap")),
                  ("truth_vs_injection", truth("polyphonia") - truth("injection")),
                  ("ones_vs_best", acc("prior_ones") - acc(best)),
                  ("oracle_vs_imperfect", acc("oracle") - acc("polyphonia"))):
    for k, v in _moments(d).items():
      out[f"paired/{name}/{k}"] = v
  # the v1 statistics (README, v1 claims), kept for comparison
  out["ratio/nontarget"] = out["lsd_nontarget/polyphonia"] / out["lsd_nontarget/prompt_swap"]
  out["ratio/acc_vs_swap"] = out["acc/polyphonia"] / max(out["acc/prompt_swap"], 1e-9)
  for k, v in _moments(acc("polyphonia") - acc("injection")).items():
    out[f"paired/acc_gain/{k}"] = v
  others = [a for a in method.MAIN_ARMS if a != "polyphonia"]
  nearest = min(others, key=lambda a: out[f"lsd_truth/{a}"])
  out["paired/truth_nearest_other"] = method.MAIN_ARMS.index(nearest)
  for k, v in _moments(truth(nearest) - truth("polyphonia")).items():
    out[f"paired/truth_margin/{k}"] = v
  out["ablation/gamma0_acc_drop"] = out["acc/polyphonia"] - out["acc/gamma0"]
  out["ablation/prior_ones_dev"] = abs(out["lsd_nontarget/prior_ones"] / out["lsd_nontarget/prompt_swap"] - 1.0)
  out["ablation/oracle_gain"] = out["lsd_truth/polyphonia"] - out["lsd_truth/oracle"]
  passing = 0
  for a in (n for n in method.NEGATIVES if n in arms):
    ratio = out[f"lsd_nontarget/{a}"] / out["lsd_nontarget/prompt_swap"]
    gain = out[f"acc/{a}"] - out["acc/injection"]
    out[f"negatives/{a}/nontarget_ratio"] = ratio
    out[f"negatives/{a}/acc_gain"] = gain
    passing += int(ratio <= config_lib.NONTARGET_RATIO_MAX and gain >= config_lib.ACC_GAIN_MIN)
  if method.NEGATIVES[0] in arms:
    out["negatives/passing"] = passing
  keep = np.arange(min(EXAMPLES, len(tasks)))
  out["examples/source"] = tasks.source[keep]
  out["examples/truth"] = tasks.truth[keep]
  out["examples/prior"] = prior["imperfect"][keep]
  out["examples/labels"] = np.stack([tasks.src_label[keep], tasks.tgt_label[keep]], axis=1)
  for a in method.MAIN_ARMS + ("oracle",):
    out[f"examples/{a}"] = edits[a][keep].astype(np.float32)
  for k, v in per.items():
    out[f"per_task/{k}"] = v.astype(np.float32)
  _write_wavs(config, ctx.subdir(), tasks, edits)
  log.info("edit: nontarget LSD polyphonia %.3f vs swap %.3f (ratio %.3f); accuracy polyphonia %.3f, swap %.3f, "
           "injection %.3f, sdedit %.3f; truth LSD %s", out["lsd_nontarget/polyphonia"],
           out["lsd_nontarget/prompt_swap"], out["ratio/nontarget"], out["acc/polyphonia"], out["acc/prompt_swap"],
           out["acc/injection"], out["acc/sdedit"],
           {a: round(out[f"lsd_truth/{a}"], 3) for a in arms})
  return out


def _write_wavs(config, folder, tasks, edits):
  """Griffin-Lim renderings of the first `edit.wavs` tasks: source, truth and each main arm."""
  n = min(int(config.edit.wavs), len(tasks))
  if n <= 0:
    return
  fspec = method.logmel(config)
  for i in range(n):
    name = f"{i}_{method.PITCHED[tasks.src_label[i]]}_to_{method.PITCHED[tasks.tgt_label[i]]}"
    items = [("source", tasks.source[i]), ("truth", tasks.truth[i])] + [(a, edits[a][i]) for a in method.MAIN_ARMS]
    specs = jnp.asarray(np.stack([x for _, x in items]))
    audio = np.asarray(fspec.to_audio(specs, key=jax.random.key(0)))
    for (label, _), w in zip(items, audio):
      spectral.write_wav(os.path.join(folder, "wav", f"{name}_{label}.wav"), w, fspec.sr)


def summarise(results) -> dict:
  return {k: v for k, v in stages_lib.union(results).items() if not isinstance(v, (np.ndarray, str))}


# ------------------------------------------------------------------------------------------------- plots


def plot(runs, workdirs, out_dir):
  """Spectrograms of example edits (first seed) and the arms' scores over seeds."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  if not workdirs or not runs or "edit" not in runs[0].get("stages", []):
    return []
  names = list(runs[0]["stages"])
  arrs = stages_lib.stage_arrays(workdirs[0], names.index("edit"), "edit")
  cols = ["source", "prior", "truth"] + list(method.MAIN_ARMS) + ["oracle"]
  labels = np.asarray(arrs["examples/labels"])
  n = len(labels)
  src = np.asarray(arrs["examples/source"])
  lo, hi = float(np.percentile(src, 1)), float(np.percentile(src, 99.5))
  fig, axes = plt.subplots(n, len(cols), figsize=(1.5 * len(cols), 1.3 * n), squeeze=False)
  for r in range(n):
    for j, c in enumerate(cols):
      ax = axes[r][j]
      img = np.asarray(arrs[f"examples/{c}"])[r]
      ax.imshow(img, origin="lower", aspect="auto", cmap="gray" if c == "prior" else "magma",
                vmin=0 if c == "prior" else lo, vmax=1 if c == "prior" else hi)
      ax.set_xticks([])
      ax.set_yticks([])
      if r == 0:
        ax.set_title(c.replace("_", " "), fontsize=7)
    axes[r][0].set_ylabel(f"{method.PITCHED[labels[r, 0]]}\n-> {method.PITCHED[labels[r, 1]]}", fontsize=6)
  fig.suptitle("edits of the pitched stem (drums kept); prior = the imperfect separator's mask", fontsize=8)
  fig.tight_layout()
  paths = [save(fig, out_dir, "polyphonia_edits.png")]
  arms = [a for a in method.ARMS if f"acc/{a}" in runs[0]]
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
  for ax, (metric, title) in zip(axes, (("lsd_nontarget", "non-target LSD to the source (lower: drums kept)"),
                                        ("acc", "target-timbre accuracy"),
                                        ("lsd_truth", "LSD to the ground-truth edit (lower)"))):
    for i, a in enumerate(arms):
      vals = [r[f"{metric}/{a}"] for r in runs if f"{metric}/{a}" in r]
      ax.bar(i, np.mean(vals), color="C1" if a == "polyphonia" else ("C7" if a.startswith("neg") else "C0"),
             alpha=0.7)
      ax.plot([i] * len(vals), vals, "k.", ms=4)
    ax.set_xticks(range(len(arms)), [a.replace("_", " ") for a in arms], rotation=60, fontsize=7, ha="right")
    ax.set_title(title, fontsize=8)
  if "acc/truth" in runs[0]:
    axes[1].axhline(np.mean([r["acc/truth"] for r in runs]), color="gray", ls=":", lw=1, label="truth")
    axes[1].legend(fontsize=7)
  fig.tight_layout()
  paths.append(save(fig, out_dir, "polyphonia_scores.png"))
  return paths
