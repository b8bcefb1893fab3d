"""polyphonia, the pieces: edit tasks with ground truth, the separator prior, the arms (prompt swap, attention
injection, SDEdit, Polyphonia and its ablations and negative controls) and their scores.

The model, its data pipeline and the timbre classifier are the audio core's reference setting
(`jaxlab.experiments.spectro_diffusion.method`: log-frequency spectrograms, `jaxlab.audio.model.TextToSpec`,
x0-prediction DDPM); here the clips always carry drums (the background stem to preserve) and the prompt reaches
the network only through cross-attention (`model.pooled=False`), as in AudioLDM 2's UNet, so that a controller
of the cross-attention logits controls all of the prompt's influence.

An edit task (a PolyEvalPrompts analogue) is (clip, stem, target instrument): the clip's pitched stem re-timbred
to another pitched instrument, the drums unchanged. Every arm starts from the same edit-friendly DDPM inversion
of the source mixture under the source prompt (the noise maps `zs`), and runs the reverse process from the
same start level with the target prompt; the arms differ only in the attention controller (and SDEdit, which
re-noises instead of inverting).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.audio import metrics as audio_metrics
from jaxlab.audio import model as model_lib
from jaxlab.audio import separation, synth
from jaxlab.diffusion import controllers as ctl
from jaxlab.diffusion import ddpm
from jaxlab.experiments.spectro_diffusion import method as sd

VOCAB = sd.VOCAB
PITCHED = synth.PITCHED
DRUMS = sd.DRUMS
TARGET_POS = 0                      # the edited stem's token is the prompt's first (context tokens are a set)
MAIN_ARMS = ("prompt_swap", "injection", "sdedit", "polyphonia")
BASELINES = ("prompt_swap", "injection", "sdedit")
ABLATIONS = ("oracle", "gamma0", "prior_ones")
NEGATIVES = ("neg_one_minus", "neg_transposed", "neg_post_softmax")
ARMS = MAIN_ARMS + ABLATIONS + NEGATIVES


def arms_of(config) -> tuple[str, ...]:
  """The arms a run edits with: every arm under the v1 layout; under the official layout the negative controls
  (written for v1's target-token calibration) are left out."""
  return ARMS if config.calibration.layout == "v1" else MAIN_ARMS + ABLATIONS


def down_blocks(config) -> tuple[int, ...] | None:
  """The calibrated blocks: calibration.layers when given, else the first half of the blocks for blocks="down"
  (the official code hooks AudioLDM 2's down blocks, the UNet's first half; our DiT is isotropic, so its first
  half is the counterpart) or None (all) for blocks="all"."""
  k = config.calibration
  if len(k.layers):
    return tuple(int(i) for i in k.layers)
  return tuple(range(int(config.model.depth) // 2)) if k.blocks == "down" else None

logmel = sd.logmel
schedule = sd.schedule
stats = sd.stats
clip_range = sd.clip_range


make_model_fn = sd.make_model_fn
make_loss_fn = sd.make_loss_fn
train_data = sd.synth_data      # the training clips ({"train", "held"}) with this experiment's drums rate


@dataclasses.dataclass
class Tasks:
  """Edit tasks over `clips` held-out clips (float32 log-mels (F, T) unless marked).

  source (N, F, T): the source mixture; truth (N, F, T): the ground-truth edited mixture (the stem's notes
  re-rendered by the target instrument); irm (N, F, T): the source stem's oracle ideal ratio mask against the
  rest; irm_truth (N, F, T): the edited stem's mask in the truth; src_tokens / tgt_tokens (N, 2); source /
  target (N,) instrument ids; clip (N,) the clip index; stems: per clip the Stem specs."""
  source: np.ndarray
  truth: np.ndarray
  irm: np.ndarray
  irm_truth: np.ndarray
  src_tokens: np.ndarray
  tgt_tokens: np.ndarray
  src_label: np.ndarray
  tgt_label: np.ndarray
  clip: np.ndarray
  seeds: np.ndarray

  def __len__(self):
    return len(self.clip)


def make_tasks(config, seed: int) -> Tasks:
  """tasks.num_clips held-out clips (one pitched stem + drums), each edited to every other pitched instrument
  (3 tasks a clip); clip seeds drawn from `seed` (so different from the training clips')."""
  fspec = logmel(config)
  n = int(config.tasks.num_clips)
  seeds = np.random.default_rng([int(seed), 7919]).integers(0, 2 ** 31, n)
  rows = {k: [] for k in ("source", "truth", "irm", "irm_truth", "src", "tgt", "clip", "seed")}
  waves_src, waves_truth, tgt_stems, rest = [], [], [], []
  for i, s in enumerate(seeds):
    stems = synth.sample_clip(int(s), num_pitched=1, drums_prob=1.0, sr=fspec.sr, duration=fspec.clip_seconds,
                              max_notes=int(config.data.max_notes))
    mix, per = synth.render_mixture(stems, sr=fspec.sr, duration=fspec.clip_seconds)
    src = VOCAB.index(stems[0].instrument)
    for tgt in range(len(PITCHED)):
      if tgt == src:
        continue
      edited = synth.edit_clip(stems, 0, PITCHED[tgt])
      mix_t, per_t = synth.render_mixture(edited, sr=fspec.sr, duration=fspec.clip_seconds)
      waves_src.append(mix)
      waves_truth.append(mix_t)
      tgt_stems.append(np.stack([per[0], per_t[0]]))
      rest.append(np.stack([mix - per[0], mix_t - per_t[0]]))
      rows["src"].append(src)
      rows["tgt"].append(tgt)
      rows["clip"].append(i)
      rows["seed"].append(int(s))
  stem_w, rest_w = np.asarray(tgt_stems), np.asarray(rest)
  irm = np.asarray(jax.jit(fspec.stem_mask)(stem_w, rest_w))
  src_l, tgt_l = np.asarray(rows["src"], np.int32), np.asarray(rows["tgt"], np.int32)
  tok = lambda lab: np.stack([lab, np.full_like(lab, DRUMS)], axis=1).astype(np.int32)
  return Tasks(source=fspec.batched(np.asarray(waves_src)), truth=fspec.batched(np.asarray(waves_truth)),
               irm=irm[:, 0], irm_truth=irm[:, 1], src_tokens=tok(src_l), tgt_tokens=tok(tgt_l), src_label=src_l,
               tgt_label=tgt_l, clip=np.asarray(rows["clip"], np.int32), seeds=np.asarray(rows["seed"]))


def write_jsonl(tasks: Tasks, path: str) -> str:
  """The task grid as JSON lines (one edit task a line: clip seed, stem, source and target instrument, the two
  prompts as instrument names)."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  name = lambda t: [VOCAB[int(j)] for j in t if j >= 0]  # noqa: E731
  with open(path + ".tmp", "w") as f:
    for k in range(len(tasks)):
      f.write(json.dumps({"task": k, "clip": int(tasks.clip[k]), "clip_seed": int(tasks.seeds[k]), "stem": 0,
                          "source": PITCHED[int(tasks.src_label[k])], "target": PITCHED[int(tasks.tgt_label[k])],
                          "source_prompt": name(tasks.src_tokens[k]),
                          "target_prompt": name(tasks.tgt_tokens[k])}) + "\n")
  os.replace(path + ".tmp", path)
  return path


def priors(config, tasks: Tasks, key) -> dict[str, np.ndarray]:
  """{"imperfect", "oracle"}: the separator priors G (N, F, T) of the source stem (`jaxlab.audio.separation`):
  the power ratio mask, or the imperfect separator's version of it, to the power separator.exponent; and
  {"imperfect_drums", "oracle_drums"}: the drums' priors, (1 - mask) ** exponent (in a two-stem mix the drums'
  power ratio is the complement of the stem's, as a two-stem separator returns it)."""
  s = config.separator
  imperfect = np.asarray(separation.imperfect_mask(key, tasks.irm, blur=float(s.blur), threshold=float(s.threshold),
                                                   flip=float(s.flip), soften=float(s.soften)))
  e = float(s.exponent)
  rest = lambda m: np.clip(1.0 - m, 0.0, 1.0) ** e  # noqa: E731
  return {"imperfect": imperfect ** e, "oracle": tasks.irm ** e, "imperfect_drums": rest(imperfect),
          "oracle_drums": rest(tasks.irm)}


def _controller(config, arm, max_tokens: int):
  """(cross-attention controller or None, self-attention controller or None, prior key or None) for an arm
  ("ones": a prior of ones)."""
  if config.calibration.layout == "v1" or arm == "injection":
    c, which = _controller_v1(config, arm, max_tokens)
    return c, None, which
  k = config.calibration
  kw = dict(layers=down_blocks(config), t_range=None if k.t_max <= 0 else (int(k.t_min), int(k.t_max)))
  if arm == "prompt_swap":
    return None, None, None
  which = {"polyphonia": "imperfect", "oracle": "oracle", "gamma0": "imperfect", "prior_ones": "ones"}.get(arm)
  if which is None:
    raise ValueError(f"arm {arm!r} has no official-layout controller")
  bias = None if arm == "gamma0" else ctl.stem_bias(gamma=float(k.gamma), **kw)
  return bias, ctl.interpolate_source(**kw), which


def _controller_v1(config, arm, max_tokens: int):
  """v1's layout: (controller or None, prior key or None); the calibration on the cross-attention only, the
  stem token's bias and the source interpolation on the same logits (`controllers.calibrate`)."""
  c = config.calibration
  layers = None if not len(c.layers) else tuple(int(i) for i in c.layers)
  t_range = None if c.t_max <= 0 else (int(c.t_min), int(c.t_max))
  kw = dict(eps=float(c.eps), layers=layers, t_range=t_range, modulation=str(c.modulation))
  gamma = float(c.gamma)
  if arm == "prompt_swap":
    return None, None
  if arm == "injection":
    # P2P's word swap: the source's maps of the whole prompt (or of every token but the stem's) in the first
    # injection.fraction of the edit's steps (padding columns are masked by the model anyway)
    inj = config.injection
    ts = ddpm.timesteps(schedule(config), int(config.edit.steps), int(config.edit.start))
    last = ts[max(1, int(round(float(inj.fraction) * len(ts)))) - 1]
    first = TARGET_POS if inj.tokens == "all" else TARGET_POS + 1
    return ctl.inject_source(range(first, max_tokens), t_range=(int(last), int(ts[0]))), None
  if arm in ("polyphonia", "neg_one_minus", "neg_transposed"):
    return ctl.calibrate(gamma=gamma, **kw), "imperfect"
  if arm == "oracle":
    return ctl.calibrate(gamma=gamma, **kw), "oracle"
  if arm == "gamma0":
    return ctl.calibrate(gamma=0.0, **kw), "imperfect"
  if arm == "prior_ones":
    return ctl.calibrate(gamma=gamma, **kw), "ones"
  if arm == "neg_post_softmax":
    return ctl.calibrate(gamma=gamma, mode="probs", **kw), "imperfect"
  raise ValueError(arm)


def stem_token_priors(prior: dict, which: str, spec_config, shape) -> tuple[np.ndarray, np.ndarray]:
  """The official layout's priors on the token grid: (self-attention prior (N, L): the edited stem's; per prompt
  position (N, S, L): position 0 (the target instrument's phrase) the edited stem's prior, the others their own
  stems'). The per-position maps (N, S, F, T) are prior[f"{which}_positions"] when given (a multitrack prompt of
  several stems), else [prior[which], prior[f"{which}_drums"]] (the synthetic [instrument, drums] prompt).
  which: "imperfect" | "oracle" | "ones" (every position and query 1)."""
  n, s_max = shape[0], spec_config.max_tokens
  if which == "ones":
    maps = np.ones((n, s_max) + tuple(shape[1:]), np.float32)
  elif f"{which}_positions" in prior:
    maps = np.asarray(prior[f"{which}_positions"], np.float32)
  else:
    maps = np.stack([prior[which], prior[f"{which}_drums"]], axis=1).astype(np.float32)
  per = np.zeros((n, s_max, spec_config.grid[0] * spec_config.grid[1]), np.float32)
  for j in range(min(s_max, maps.shape[1])):
    per[:, j] = np.asarray(model_lib.token_map(jnp.asarray(maps[:, j]), spec_config))
  return per[:, TARGET_POS], per


def token_prior(m: np.ndarray, spec_config, arm: str) -> np.ndarray:
  """The prior pooled to the model's token grid (N, L) in its token order; the negative controls get it as
  1 - M, or with the (frequency, time) token grid flattened time-major (frequency and time swapped)."""
  pooled = np.asarray(model_lib.token_map(jnp.asarray(m), spec_config))
  if arm == "neg_one_minus":
    return 1.0 - pooled
  if arm == "neg_transposed":
    gh, gw = spec_config.grid
    return pooled.reshape(-1, gh, gw).transpose(0, 2, 1).reshape(len(m), gh * gw)
  return pooled


def sdedit_start(config) -> int:
  """SDEdit's start: edit.sdedit_frac of the steps (a fixed strength; at the edit's own start, a full inversion's
  1.0, SDEdit would be generation from noise, not an edit)."""
  e = config.edit
  return max(1, min(int(e.steps), int(round(float(e.sdedit_frac) * int(e.steps)))))


def editor(config, graphdef, clip=None):
  """jitted edit functions over a batch of P tasks (normalised log-mels):

  invert(state, x0, src_tokens, key) -> (x_start, zs): edit.inversion "edit_friendly" (edit-friendly DDPM
    inversion under the source prompt at edit.cfg_src) or "ddim_null" (the official code's: DDIM inversion under
    the empty prompt; zs are zeros, every reverse is then DDIM, eta 0);
  pair(state, x_start, zs, src_tokens, tgt_tokens, prior, stem_priors, controller, self_controller) -> target
    half: the [source; target] reverse with the same noise maps, source at cfg_src and target at cfg_tar, the
    controllers (static) on every block's cross- / self-attention;
  sdedit(state, x0, tgt_tokens, key): re-noise to `sdedit_start` and reverse with fresh noise."""
  e = config.edit
  sched = schedule(config)
  steps, start = int(e.steps), int(e.start)
  ddim = e.inversion == "ddim_null"
  eta = 0.0 if ddim else float(e.eta)

  @jax.jit
  def invert(state, x0, src_tokens, key):
    model = nnx.merge(graphdef, state)
    if ddim:
      fn = model_lib.denoiser(model, model_lib.null_prompts(x0.shape[0], model.config))
      xs = ddpm.ddim_invert(fn, sched, x0, num_steps=steps, start=start, clip=clip)
      return xs, jnp.zeros((len(ddpm.timesteps(sched, steps, start)),) + x0.shape, x0.dtype)
    fn = model_lib.guided_denoiser(model, src_tokens, float(e.cfg_src))
    return ddpm.edit_friendly_inversion(fn, sched, x0, key, num_steps=steps, start=start, eta=eta, clip=clip)

  @jax.jit
  def swap(state, xs, zs, tgt_tokens):
    model = nnx.merge(graphdef, state)
    fn = model_lib.guided_denoiser(model, tgt_tokens, float(e.cfg_tar))
    return ddpm.reverse(fn, sched, xs, num_steps=steps, start=start, eta=eta, zs=zs, clip=clip)

  @jax.jit
  def sdedit(state, x0, tgt_tokens, key):
    model = nnx.merge(graphdef, state)
    fn = model_lib.guided_denoiser(model, tgt_tokens, float(e.cfg_tar))
    return ddpm.sdedit(fn, sched, x0, key, num_steps=steps, start=sdedit_start(config), eta=eta, clip=clip)

  @functools.partial(jax.jit, static_argnames=("controller", "self_controller"))
  def pair(state, xs, zs, src_tokens, tgt_tokens, prior, stem_priors, controller, self_controller=None):
    model = nnx.merge(graphdef, state)
    p = xs.shape[0]
    tokens = jnp.concatenate([src_tokens, tgt_tokens])
    scale = jnp.concatenate([jnp.full((p,), float(e.cfg_src)), jnp.full((p,), float(e.cfg_tar))])
    ctx = {"prior": prior, "stem_priors": stem_priors, "target": jnp.full((p,), TARGET_POS, jnp.int32),
           "mask": tgt_tokens >= 0}
    fn = model_lib.paired_guided_denoiser(model, tokens, scale, controller=controller, ctx=ctx,
                                          self_controller=self_controller)
    out = ddpm.reverse(fn, sched, jnp.concatenate([xs, xs]), num_steps=steps, start=start, eta=eta,
                       zs=jnp.concatenate([zs, zs], axis=1), clip=clip)
    return out[p:]
  return invert, pair, swap, sdedit


def run_arms(config, model, source: np.ndarray, src_tokens: np.ndarray, tgt_tokens: np.ndarray,
             prior: dict[str, np.ndarray], key, mean: float, std: float, arms=None, bar=None) -> dict[str, np.ndarray]:
  """Edited log-mels (N, F, T) per arm for N tasks (source log-mels (N, F, T), prompts (N, S) with the edited
  stem's token first), in batches of edit.batch_size tasks (one inversion per batch). `prior`: (N, F, T) maps by
  name ("imperfect": the separator's, "oracle", and their "_drums" maps), as the arms need them; `arms` defaults
  to `arms_of(config)`."""
  graphdef, state = nnx.split(model)
  cfg = model.config
  arms = arms_of(config) if arms is None else arms
  invert, pair, swap, sdedit_fn = editor(config, graphdef, clip_range(config, mean, std))
  controllers = {a: _controller(config, a, cfg.max_tokens) for a in arms if a not in ("prompt_swap", "sdedit")}
  official = config.calibration.layout != "v1"
  tprior, tstem = {}, {}
  for a, (_, self_c, which) in controllers.items():
    if which is None:
      continue
    if official and self_c is not None:
      tprior[a], tstem[a] = stem_token_priors(prior, which, cfg, source.shape)
    else:
      m = np.ones_like(source) if which == "ones" else prior[which]
      tprior[a] = token_prior(m, cfg, a)
  # the official source branch: the inversion's empty prompt under "ddim_null" (its self-attention is what the
  # official code caches while inverting); injection copies the source PROMPT's maps, so keeps the source prompt
  null_src = official and config.edit.inversion == "ddim_null"
  n_tok = cfg.grid[0] * cfg.grid[1]
  out = {a: [] for a in arms}
  b = int(config.edit.batch_size)
  for i in range(0, len(source), b):
    sl = slice(i, i + b)
    x0 = jnp.asarray((source[sl] - mean) / std, jnp.float32)
    src, tgt = jnp.asarray(src_tokens[sl]), jnp.asarray(tgt_tokens[sl])
    kb = jax.random.fold_in(key, i)
    xs, zs = invert(state, x0, src, jax.random.fold_in(kb, 0))
    null = jnp.asarray(model_lib.null_prompts(x0.shape[0], cfg)) if null_src else None
    for a in arms:
      if a == "prompt_swap":
        y = swap(state, xs, zs, tgt)
      elif a == "sdedit":
        y = sdedit_fn(state, x0, tgt, jax.random.fold_in(kb, 1))
      else:
        c, self_c, _ = controllers[a]
        pr = jnp.asarray(tprior[a][sl]) if a in tprior else jnp.zeros((x0.shape[0], n_tok))
        st = jnp.asarray(tstem[a][sl]) if a in tstem else jnp.zeros((x0.shape[0], cfg.max_tokens, n_tok))
        s_tok = null if null_src and a != "injection" else src
        y = pair(state, xs, zs, s_tok, tgt, pr, st, c, self_c)
      out[a].append(np.asarray(y) * std + mean)
      if bar is not None:
        bar.update(int(x0.shape[0]))
  return {a: np.concatenate(v) for a, v in out.items()}


def score(edits: dict, tasks: Tasks, classifier, nontarget_max: float) -> dict[str, np.ndarray]:
  """Per-task scores of each arm: "lsd_nontarget/<arm>" (log-spectral distance to the source on bins where
  neither the source stem nor the edited stem's oracle mask reaches `nontarget_max`), "lsd_nontarget_truth/<arm>"
  (the same bins against the ground-truth edit), "acc/<arm>" (1 if the
  timbre classifier names the target instrument), "lsd_truth/<arm>" (log-spectral distance to the ground-truth
  edited mixture, all bins), "lsd_target/<arm>" (the same on the edited stem's bins, truth mask > 0.5)."""
  keep = (tasks.irm < nontarget_max) & (tasks.irm_truth < nontarget_max)
  target = tasks.irm_truth > 0.5
  out = {}
  lsd = lambda a, b, m=None: np.asarray(audio_metrics.log_spectral_distance(a, b, mask=m))
  for a, y in edits.items():
    out[f"lsd_nontarget/{a}"] = lsd(y, tasks.source, keep)
    out[f"lsd_nontarget_truth/{a}"] = lsd(y, tasks.truth, keep)
    out[f"acc/{a}"] = (classifier.predict(y) == tasks.tgt_label).astype(np.float32)
    out[f"lsd_truth/{a}"] = lsd(y, tasks.truth)
    out[f"lsd_target/{a}"] = lsd(y, tasks.truth, target)
  return out
