"""Discrete-time diffusion (DDPM / DDIM) with inversion for editing: schedules, the eta-step, SDEdit, DDIM
inversion and edit-friendly DDPM inversion.

Conventions (Ho et al. 2020, "Denoising Diffusion Probabilistic Models"; Song et al. 2021, "Denoising Diffusion
Implicit Models"): timesteps t = 0 .. T-1 with betas beta_t and abar_t = prod_{s <= t} (1 - beta_s); the forward
process x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps. A sampling run visits a descending subsequence `ts` of the
timesteps (`timesteps`: evenly spaced, "leading" as in diffusers); the level after the last one is the clean
level, whose abar is `Schedule.final_alpha` ("first": abar_0, diffusers' `set_alpha_to_one=False`, which keeps the
last step's variance positive so the edit-friendly noise of that step exists; "one": 1).

One reverse step from level t to level p (the next entry of `ts`, or the clean level), with the model's clean and
noise estimates (x0, eps) at (x_t, t) (`split`: from an eps-, v- or x0-prediction, Salimans & Ho 2022 for v):

    sigma = eta sqrt((1 - abar_p) / (1 - abar_t)) sqrt(1 - abar_t / abar_p)
    x_p   = mu + sigma z,   mu = sqrt(abar_p) x0 + sqrt(1 - abar_p - sigma^2) eps,   z ~ N(0, I)

eta = 1 is DDPM's ancestral sampler (posterior variance beta-tilde), eta = 0 deterministic DDIM.

Editing (the tools Polyphonia's pipeline stands on):

* `sdedit` (Meng et al. 2022): noise the input to the start level, reverse with fresh noise.
* `ddim_invert`: the deterministic DDIM map run backwards from the input (x_t -> x_next with the model
  evaluated at the lower level and the upper timestep, the convention of the null-text inversion code); exact
  only up to its discretisation error.
* `edit_friendly_inversion` (Huberman-Spiegelglas, Kulikov & Michaeli 2024, "An Edit Friendly DDPM Noise
  Space"; used for audio by Manor & Michaeli 2024, "Zero-Shot Unsupervised and Text-Based Audio Editing Using
  DDPM Inversion", code HilaManor/AudioEditingCode): every x_t is drawn INDEPENDENTLY from q(x_t | x_0), then
  the noise maps z_t = (x_p - mu(x_t)) / sigma_t are read off, so that `reverse` from x_start with these z and
  the same denoiser reproduces the input (to float32 rounding) for ANY denoiser. Editing reruns `reverse` with
  the same z and another prompt (or guidance scale, or attention controller).

The denoiser is `fn(x, t) -> prediction` with x (B, ...) and t (B,) int32 timesteps; `cfg` builds one from a
conditional and an unconditional branch (separate source / target scales are two `cfg` denoisers, or a per-
example scale). `start` (the DDPM-Friendly `tstart`) counts the reverse steps run: the last `start` entries of
`ts`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError

PREDICTIONS = ("eps", "v", "x0")
BETA_SCHEDULES = ("linear", "scaled_linear", "cosine")
Denoiser = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class Schedule:
  """A discrete noise schedule (frozen, hashable).

  Attributes:
    kind: "linear" (DDPM: betas linear in [beta_start, beta_end]), "scaled_linear" (Stable Diffusion / AudioLDM:
      sqrt(beta) linear), or "cosine" (Nichol & Dhariwal 2021, abar = cos^2(((t/T + s)/(1 + s)) pi/2), betas
      clipped at 0.999).
    num_train_steps: T.
    beta_start, beta_end: the linear schedules' end points.
    final_alpha: abar of the clean level after the last step: "first" (abar_0) or "one".
    prediction: what the network predicts: "eps", "v" or "x0".
    steps_offset: added to every timestep of a run (diffusers' `steps_offset`; 1 in the Stable Diffusion and
      AudioLDM scheduler configs): with final_alpha "first" the last step then goes from t = 1 to abar_0 with a
      positive variance, which edit-friendly inversion needs.
  """
  kind: str = "linear"
  num_train_steps: int = 1000
  beta_start: float = 1e-4
  beta_end: float = 0.02
  final_alpha: str = "first"
  prediction: str = "eps"
  steps_offset: int = 1

  def __post_init__(self):
    if self.kind not in BETA_SCHEDULES:
      raise ConfigError(f"Schedule.kind={self.kind!r}: use one of {', '.join(BETA_SCHEDULES)}")
    if self.prediction not in PREDICTIONS:
      raise ConfigError(f"Schedule.prediction={self.prediction!r}: use one of {', '.join(PREDICTIONS)}")
    if self.final_alpha not in ("first", "one"):
      raise ConfigError(f"Schedule.final_alpha={self.final_alpha!r}: use 'first' or 'one'")
    if int(self.num_train_steps) < 2:
      raise ConfigError(f"Schedule.num_train_steps={self.num_train_steps} must be >= 2")
    if not 0 < self.beta_start < self.beta_end < 1:
      raise ConfigError(f"Schedule: need 0 < beta_start={self.beta_start} < beta_end={self.beta_end} < 1")

  @property
  def betas(self) -> np.ndarray:
    n = int(self.num_train_steps)
    if self.kind == "linear":
      return np.linspace(self.beta_start, self.beta_end, n, dtype=np.float64)
    if self.kind == "scaled_linear":
      return np.linspace(self.beta_start ** 0.5, self.beta_end ** 0.5, n, dtype=np.float64) ** 2
    s = 0.008
    f = np.cos((np.arange(n + 1) / n + s) / (1 + s) * math.pi / 2) ** 2
    return np.clip(1.0 - f[1:] / f[:-1], 0.0, 0.999)

  @property
  def alphas_cumprod(self) -> np.ndarray:
    """(T,) float64 abar_t."""
    return np.cumprod(1.0 - self.betas)

  @property
  def final(self) -> float:
    return 1.0 if self.final_alpha == "one" else float(self.alphas_cumprod[0])


def timesteps(schedule: Schedule, num_steps: int, start: int | None = None) -> np.ndarray:
  """Descending int32 timesteps of a `num_steps` run ("leading" spacing: t = i * (T // num_steps) + steps_offset),
  restricted to the last `start` of them (None: all)."""
  n, steps = int(schedule.num_train_steps), int(num_steps)
  if not 1 <= steps <= n:
    raise ConfigError(f"num_steps={num_steps} must be in [1, num_train_steps={n}]")
  ts = (np.arange(steps) * (n // steps) + int(schedule.steps_offset))[::-1].astype(np.int32)
  if ts[0] >= n:
    raise ConfigError(f"num_steps={steps} with steps_offset={schedule.steps_offset} reaches timestep {ts[0]} >= "
                      f"num_train_steps={n}: use fewer steps or Schedule(steps_offset=0)")
  if start is None:
    return ts
  if not 1 <= int(start) <= steps:
    raise ConfigError(f"start={start} must count reverse steps in [1, num_steps={steps}]")
  return ts[steps - int(start):]


def _levels(schedule: Schedule, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(abar_t, abar_prev) per step of `ts` (float64): prev is the next entry's level, or the clean level."""
  ab = schedule.alphas_cumprod
  cur = ab[ts]
  prev = np.concatenate([ab[ts[1:]], [schedule.final]])
  return cur, prev


def _bshape(a, x):
  a = jnp.asarray(a, jnp.float32)
  return a.reshape(a.shape + (1,) * (x.ndim - a.ndim))


def q_sample(x0: jax.Array, abar, eps: jax.Array) -> jax.Array:
  """x_t = sqrt(abar) x0 + sqrt(1 - abar) eps (abar a scalar or (B,))."""
  a = _bshape(abar, x0)
  return jnp.sqrt(a) * x0 + jnp.sqrt(1.0 - a) * eps


def target(x0: jax.Array, eps: jax.Array, abar, prediction: str) -> jax.Array:
  """The regression target of a `prediction` network: eps, v = sqrt(abar) eps - sqrt(1 - abar) x0, or x0."""
  if prediction == "eps":
    return eps
  if prediction == "x0":
    return x0
  a = _bshape(abar, x0)
  return jnp.sqrt(a) * eps - jnp.sqrt(1.0 - a) * x0


def split(out: jax.Array, x_t: jax.Array, abar, prediction: str) -> tuple[jax.Array, jax.Array]:
  """(x0, eps) estimates from a network output at (x_t, abar)."""
  a = _bshape(abar, x_t)
  sa, sb = jnp.sqrt(a), jnp.sqrt(1.0 - a)
  if prediction == "eps":
    return (x_t - sb * out) / sa, out
  if prediction == "v":
    return sa * x_t - sb * out, sb * x_t + sa * out
  if prediction == "x0":
    return out, (x_t - sa * out) / sb
  raise ConfigError(f"prediction={prediction!r}: use one of {', '.join(PREDICTIONS)}")


def training_loss(fn: Denoiser, schedule: Schedule, x0: jax.Array, key: jax.Array,
                  weights: jax.Array | None = None) -> jax.Array:
  """Mean squared error of `fn` against its target at a uniform random timestep per example (Ho et al.'s
  "simple" loss for eps; the same for v and x0), optionally weighted per example."""
  kt, ke = jax.random.split(key)
  t = jax.random.randint(kt, (x0.shape[0],), 0, int(schedule.num_train_steps))
  eps = jax.random.normal(ke, x0.shape, x0.dtype)
  ab = jnp.asarray(schedule.alphas_cumprod, jnp.float32)[t]
  err = jnp.mean(jnp.square(fn(q_sample(x0, ab, eps), t) - target(x0, eps, ab, schedule.prediction)),
                 axis=tuple(range(1, x0.ndim)))
  if weights is None:
    return jnp.mean(err)
  return jnp.sum(err * weights) / jnp.maximum(jnp.sum(weights), 1e-8)


def _sigma(ab_t, ab_p, eta):
  return eta * np.sqrt((1.0 - ab_p) / (1.0 - ab_t)) * np.sqrt(np.maximum(1.0 - ab_t / ab_p, 0.0))


def _tables(schedule: Schedule, ts: np.ndarray, eta: float) -> dict:
  """Per-step constants (numpy float32, so they stay concrete under jit)."""
  cur, prev = _levels(schedule, ts)
  sig = _sigma(cur, prev, float(eta))
  f32 = lambda a: np.asarray(a, np.float32)
  return {"t": np.asarray(ts, np.int32), "ab": f32(cur), "ab_prev": f32(prev), "sigma": f32(sig),
          "dir": f32(np.sqrt(np.maximum(1.0 - prev - sig ** 2, 0.0)))}


def _clipped(x, x0, eps, ab, clip):
  """DDPM's clipped x0 (diffusers' clip_sample) and eps re-derived from it; unchanged without `clip`."""
  if clip is None:
    return x0, eps
  x0 = jnp.clip(x0, clip[0], clip[1])
  return x0, (x - jnp.sqrt(ab) * x0) / jnp.sqrt(1.0 - ab)


def _mean(fn, schedule, x, row, clip=None):
  t = jnp.full((x.shape[0],), row["t"], jnp.int32)
  x0, eps = _clipped(x, *split(fn(x, t), x, row["ab"], schedule.prediction), row["ab"], clip)
  return jnp.sqrt(row["ab_prev"]) * x0 + row["dir"] * eps


def reverse(fn: Denoiser, schedule: Schedule, x: jax.Array, *, num_steps: int, start: int | None = None,
            eta: float = 1.0, key: jax.Array | None = None, zs: jax.Array | None = None,
            clip: tuple[float, float] | None = None) -> jax.Array:
  """Runs the reverse process from x at the first level of `timesteps(schedule, num_steps, start)` to the clean
  level. The step noises are `zs` (S, *x.shape) (edit-friendly: from `edit_friendly_inversion`) or drawn from
  `key`; eta = 0 needs neither. `clip` = (lo, hi) clips each x0 estimate to the data range (DDPM's clipping of
  images to [-1, 1]; the noise estimate is re-derived from the clipped x0); invert with the same `clip`."""
  ts = timesteps(schedule, num_steps, start)
  tab = _tables(schedule, ts, eta)
  if zs is None:
    if eta == 0:
      zs = jnp.zeros((len(ts),) + x.shape, x.dtype)
    elif key is None:
      raise ConfigError("reverse: pass key (fresh noise) or zs (edit-friendly noise maps) when eta > 0")
    else:
      zs = jax.random.normal(key, (len(ts),) + x.shape, x.dtype)
  elif zs.shape != (len(ts),) + x.shape:
    raise ConfigError(f"reverse: zs must be (steps={len(ts)}, {', '.join(map(str, x.shape))}), got {zs.shape}: "
                      "invert with the same num_steps and start")

  def step(x, inp):
    row, z = inp
    return _mean(fn, schedule, x, row, clip) + row["sigma"] * z, None
  return jax.lax.scan(step, x, (tab, zs))[0]


def sample(fn: Denoiser, schedule: Schedule, shape, key: jax.Array, *, num_steps: int, eta: float = 1.0,
           dtype=jnp.float32, clip: tuple[float, float] | None = None) -> jax.Array:
  """Generation: x_T ~ N(0, I) then `reverse` (DDPM with eta = 1, DDIM with eta = 0)."""
  k0, k1 = jax.random.split(key)
  return reverse(fn, schedule, jax.random.normal(k0, tuple(shape), dtype), num_steps=num_steps, eta=eta, key=k1,
                 clip=clip)


def sdedit(fn: Denoiser, schedule: Schedule, x0: jax.Array, key: jax.Array, *, num_steps: int, start: int,
           eta: float = 1.0, clip: tuple[float, float] | None = None) -> jax.Array:
  """SDEdit: x_start ~ q(x_start | x0) at the first level of the last `start` steps, then `reverse` with fresh
  noise."""
  ts = timesteps(schedule, num_steps, start)
  k0, k1 = jax.random.split(key)
  x = q_sample(x0, float(schedule.alphas_cumprod[ts[0]]), jax.random.normal(k0, x0.shape, x0.dtype))
  return reverse(fn, schedule, x, num_steps=num_steps, start=start, eta=eta, key=k1, clip=clip)


def ddim_invert(fn: Denoiser, schedule: Schedule, x0: jax.Array, *, num_steps: int,
                start: int | None = None, clip: tuple[float, float] | None = None) -> jax.Array:
  """Deterministic DDIM inversion: from the clean x0 up to the first level of the last `start` steps.

  Step from level p (below; the clean level first) to level t (above), as in the null-text inversion code
  (Mokady et al. 2023): the model is evaluated at (x_p, t), eps_hat read from its output at t's level, then
  x0_hat = (x_p - sqrt(1 - abar_p) eps_hat) / sqrt(abar_p) and x_t = sqrt(abar_t) x0_hat + sqrt(1 - abar_t)
  eps_hat. Running `reverse` with eta = 0 from the result approximately returns x0: the error is the scheme's
  first-order discretisation error (eps_hat is taken at the lower level), vanishing as the step count grows.
  `clip` = (lo, hi): the x0 estimate at each model call clipped as `reverse` clips it (eps re-derived from it), so
  an inversion and a clipped reverse use the same denoiser."""
  ts = timesteps(schedule, num_steps, start)[::-1].copy()          # ascending
  ab = schedule.alphas_cumprod
  tab = {"t": jnp.asarray(ts, jnp.int32), "ab": jnp.asarray(ab[ts], jnp.float32),
         "ab_low": jnp.asarray(np.concatenate([[schedule.final], ab[ts[:-1]]]), jnp.float32)}

  def step(x, row):
    t = jnp.full((x.shape[0],), row["t"], jnp.int32)
    eps = _clipped(x, *split(fn(x, t), x, row["ab"], schedule.prediction), row["ab"], clip)[1]
    x0h = (x - jnp.sqrt(1.0 - row["ab_low"]) * eps) / jnp.sqrt(row["ab_low"])
    return jnp.sqrt(row["ab"]) * x0h + jnp.sqrt(1.0 - row["ab"]) * eps, None
  return jax.lax.scan(step, x0, tab)[0]


def edit_friendly_inversion(fn: Denoiser, schedule: Schedule, x0: jax.Array, key: jax.Array, *, num_steps: int,
                            start: int | None = None, eta: float = 1.0,
                            clip: tuple[float, float] | None = None) -> tuple[jax.Array, jax.Array]:
  """Edit-friendly DDPM inversion: (x_start, zs) such that `reverse(fn, ..., x_start, zs=zs)` returns x0.

  Every x_t of the run is drawn independently, x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps_t, and
  z_t = (x_p - mu(x_t)) / sigma_t with x_p the next level's draw (x0 itself after the last step). Needs eta > 0
  and a positive variance at every step (the "first" final level)."""
  if eta <= 0:
    raise ConfigError("edit_friendly_inversion needs eta > 0 (the noise maps divide by sigma_t)")
  ts = timesteps(schedule, num_steps, start)
  tab = _tables(schedule, ts, eta)
  if float(np.min(tab["sigma"])) <= 0:
    raise ConfigError("edit_friendly_inversion: a step has zero variance; use Schedule(final_alpha='first')")
  eps = jax.random.normal(key, (len(ts),) + x0.shape, x0.dtype)
  xs = jnp.sqrt(_bshape(tab["ab"], eps)) * x0[None] + jnp.sqrt(1.0 - _bshape(tab["ab"], eps)) * eps
  nxt = jnp.concatenate([xs[1:], x0[None]], axis=0)

  def noise(_, inp):
    row, x, xp = inp
    return None, (xp - _mean(fn, schedule, x, row, clip)) / row["sigma"]
  zs = jax.lax.scan(noise, None, (tab, xs, nxt))[1]
  return xs[0], zs


def cfg(cond: Denoiser, uncond: Denoiser, scale) -> Denoiser:
  """Classifier-free guidance (Ho & Salimans 2022): uncond + s (cond - uncond) on the network output; `scale` a
  float or (B,) per example (e.g. the source half of a batch at cfg_src, the target half at cfg_tar). At scale 1
  the conditional branch is returned exactly (the unconditional one is not evaluated for a Python float 1)."""
  if isinstance(scale, (int, float)) and float(scale) == 1.0:
    return cond

  def fn(x, t):
    c, u = cond(x, t), uncond(x, t)
    return u + _bshape(scale, c) * (c - u)
  return fn
