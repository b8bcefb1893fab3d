"""spectro_diffusion, the pieces: synthetic clips as log-mel spectrograms with instrument prompts, the model and
its DDPM loss, balanced prompts, guided sampling, and the timbre classifiers that score the samples.

The library side is `jaxlab.audio` (synthesiser, features, timbre classifier, the text-to-spectrogram model) and
`jaxlab.diffusion.ddpm` (schedule, loss, sampler, inversion).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.audio import features as features_lib
from jaxlab.audio import model as model_lib
from jaxlab.audio import synth, timbre
from jaxlab.diffusion import ddpm

VOCAB = synth.INSTRUMENTS          # token ids: flute, clarinet, violin, organ, drums
DRUMS = VOCAB.index("drums")
MAX_TOKENS = 2                     # [instrument] or [instrument, drums]


def logmel(config) -> features_lib.LogMel:
  return features_lib.LogMel.from_config(config.features)


def _prompt(stems) -> list[int]:
  return [VOCAB.index(s.instrument) for s in stems]


@functools.lru_cache(maxsize=2)
def _synth(seed: int, n_train: int, n_held: int, drums_prob: float, num_pitched: int, max_notes: int, fspec):
  rng = np.random.default_rng(seed)
  out = {}
  for split, n in (("train", n_train), ("held", n_held)):
    mix, _, specs = synth.batch_render(rng, n, sr=fspec.sr, duration=fspec.clip_seconds, num_pitched=num_pitched,
                                       drums_prob=drums_prob, max_notes=max_notes)
    tokens = np.full((n, MAX_TOKENS), -1, np.int32)
    for i, s in enumerate(specs):
      p = _prompt(s)
      tokens[i, :len(p)] = p
    out[split] = {"spec": fspec.batched(mix), "tokens": tokens,
                  "label": np.asarray([VOCAB.index(s[0].instrument) for s in specs], np.int32),
                  "drums": np.asarray([s[-1].instrument == "drums" for s in specs])}
  return out


def synth_data(config) -> dict:
  """{"train", "held"}: {"spec" (N, n_mels, frames) log-mel, "tokens" (N, 2) prompt ids (-1 pads), "label" (N,)
  the pitched instrument, "drums" (N,) bool}; deterministic from data.seed (cached per process)."""
  d = config.data
  return _synth(int(d.seed), int(d.num_train), int(d.num_held), float(d.drums_prob), int(d.num_pitched),
                int(d.max_notes), logmel(config))


def stats(train: dict) -> tuple[float, float]:
  """(mean, std) of the training log-mels: the model sees (x - mean) / std."""
  x = train["spec"]
  return float(np.mean(x)), float(np.std(x))


def spec_config(config, vocab: int = len(VOCAB), max_tokens: int = MAX_TOKENS) -> model_lib.SpecConfig:
  m, f = config.model, config.features
  return model_lib.SpecConfig(freq=int(f.n_mels), frames=int(f.frames), patch=int(m.patch), vocab=vocab,
                              max_tokens=max_tokens, hidden=int(m.hidden), depth=int(m.depth), heads=int(m.heads),
                              mlp_ratio=float(m.mlp_ratio), bottleneck=int(m.bottleneck), freq_dim=int(m.freq_dim),
                              num_train_steps=int(config.diffusion.num_train_steps), pooled=bool(m.pooled),
                              dtype=m.dtype, attention=m.attention, scan_layers=bool(m.scan_layers),
                              remat=bool(m.remat))


def schedule(config) -> ddpm.Schedule:
  d = config.diffusion
  return ddpm.Schedule(kind=d.kind, num_train_steps=int(d.num_train_steps), beta_start=float(d.beta_start),
                       beta_end=float(d.beta_end), prediction=d.prediction)


def make_model_fn(config, vocab: int = len(VOCAB), max_tokens: int = MAX_TOKENS):
  cfg = spec_config(config, vocab, max_tokens)
  return lambda rngs: model_lib.TextToSpec(cfg, rngs=rngs)


def make_loss_fn(config):
  """`(model, batch, key) -> (loss, metrics)`; batch {"spec": normalised (B, F, T), "tokens": (B, S)}."""
  sched = schedule(config)
  drop = float(config.diffusion.prompt_drop)

  def loss_fn(model, batch, key):
    kd, kl = jax.random.split(key)
    tokens = model_lib.drop_prompts(kd, batch["tokens"], drop, model.config) if drop else batch["tokens"]
    loss = ddpm.training_loss(model_lib.denoiser(model, tokens), sched, batch["spec"], kl)
    return loss, {"loss_ddpm": loss}
  return loss_fn


def prompts(n: int, num_instruments: int = len(synth.PITCHED)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """n balanced prompts (instrument x drums on / off in turn): (tokens (n, 2), label (n,), drums (n,) bool)."""
  i = np.arange(n)
  label = (i % num_instruments).astype(np.int32)
  drums = (i // num_instruments) % 2 == 1
  tokens = np.full((n, MAX_TOKENS), -1, np.int32)
  tokens[:, 0] = label
  tokens[drums, 1] = DRUMS
  return tokens, label, drums


def clip_range(config, mean: float, std: float):
  """The normalised data range for DDPM's x0 clipping: [log(eps), log(eps) + sample.clip_span] (None: off)."""
  span = float(config.sample.clip_span)
  if span <= 0:
    return None
  lo = float(np.log(float(config.features.eps)))
  return ((lo - mean) / std, (lo + span - mean) / std)


def sampler(config, graphdef, clip=None):
  """jitted `(state, tokens, key) -> normalised samples (B, F, T)`: ancestral DDPM with CFG (x0 clipped)."""
  s = config.sample
  sched = schedule(config)

  @jax.jit
  def run(state, tokens, key):
    model = nnx.merge(graphdef, state)
    f = model.config
    fn = model_lib.guided_denoiser(model, tokens, float(s.cfg))
    return ddpm.sample(fn, sched, (tokens.shape[0], f.freq, f.frames), key, num_steps=int(s.steps),
                       eta=float(s.eta), clip=clip)
  return run


def generate(config, model, tokens: np.ndarray, key, mean: float, std: float, desc: str = "sampling") -> np.ndarray:
  """Log-mel samples (n, F, T) for the prompts, in batches of sample.batch_size."""
  from jaxlab import progress  # pylint: disable=g-import-not-at-top
  graphdef, state = nnx.split(model)
  run = sampler(config, graphdef, clip_range(config, mean, std))
  b = int(config.sample.batch_size)
  out = []
  with progress.bar(total=len(tokens), desc=desc) as bar:
    for i in range(0, len(tokens), b):
      out.append(np.asarray(run(state, jnp.asarray(tokens[i:i + b]), jax.random.fold_in(key, i))))
      bar.update(len(tokens[i:i + b]))
  return np.concatenate(out) * std + mean


def classifiers(config, train: dict, fspec) -> tuple[timbre.TimbreClassifier, timbre.TimbreClassifier]:
  """(instrument classifier over the 4 pitched instruments, drums-present classifier), both on the training
  clips' log-mels."""
  c = float(config.classifier.c)
  inst = timbre.TimbreClassifier(synth.PITCHED, fspec.centres_hz, c=c).fit(train["spec"], train["label"])
  drums = timbre.TimbreClassifier(("no drums", "drums"), fspec.centres_hz, c=c).fit(
      train["spec"], train["drums"].astype(np.int32))
  return inst, drums
