"""Flow matching with the linear interpolant, t = 1 CLEAN (the JiT / Latent Forcing convention), per stream.

Convention (Li & He 2025, "Back to Basics: Let Denoising Generative Models Denoise", arXiv 2511.13720; Latent
Forcing, arXiv 2602.11401, which builds on it): for data x and noise eps ~ N(0, I),

    z_t = t x + (1 - t) eps,        t in [0, 1]:  t = 0 pure noise, t = 1 clean data,
    v   = dz/dt = x - eps = (x - z_t) / (1 - t).

NOTE the direction: `jaxlab.diffusion.ou` (the score-based part of this package) runs its OU process with
t = 0 CLEAN and t -> infinity noise. Functions here never take OU times, and the OU ones never take these.

The network predicts x (x-prediction); the loss is on velocities (v-loss): with a clamp t_eps on 1 - t,

    v(x, z, t)     = (x - z) / max(1 - t, t_eps),
    v_hat          = (x_hat - z) / max(1 - t, t_eps),
    L              = mean over the example's elements of (v - v_hat)^2   (then a weighted batch mean).

Several STREAMS (e.g. pixels and a latent) each have their own data, noise and time; every function that
integrates takes dicts {stream: array} of states and {stream: (batch,) times}. A denoiser is
`denoise(z: {stream: (B, ...)}, t: {stream: (B,)}) -> {stream: x_hat}`.

* Time samplers for training: `logit_normal(key, shape, mean, std)` = sigmoid(N(mean, std^2)) (JiT:
  mean -0.8, std 0.8), `uniform(key, shape, lo, hi)`, and the warp `shift(t, s) = s t / (1 + (s - 1) t)`
  (s < 1 spends more time near noise).
* Integrators: `euler_step`, `heun_step` and `sample` (Heun on every step but the last, which is Euler: the
  JiT sampler; or Euler throughout), over a time table {stream: (num_steps + 1,)} non-decreasing.
* Schedules (time tables): `joint_times` (every stream 0 -> 1 together, each with its own shift: covers the
  "independent" multi-schedule when shifts differ and the variance-shifted alignment t_l = shift(t_p, a)),
  `cascaded_times` (streams one after another: the earlier ones reach their final time while the later stay
  at 0, then stay there), `offset_times` (every stream on the same grid, stream i delayed by offset_i).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError

T_EPS = 0.05          # JiT's clamp of 1 - t in the velocity conversion
Streams = Mapping[str, jax.Array]
Denoiser = Callable[[Streams, Streams], Streams]


def _bt(t: jax.Array, like: jax.Array) -> jax.Array:
  """(B,) times broadcast against a (B, ...) array."""
  t = jnp.asarray(t, like.dtype)
  return t.reshape(t.shape + (1,) * (like.ndim - t.ndim))


def interpolate(x: jax.Array, eps: jax.Array, t: jax.Array) -> jax.Array:
  """z_t = t x + (1 - t) eps with per-example times t (B,) (t = 1 clean)."""
  tb = _bt(t, x)
  return tb * x + (1 - tb) * eps


def velocity(x: jax.Array, z: jax.Array, t: jax.Array, t_eps: float = T_EPS) -> jax.Array:
  """(x - z) / max(1 - t, t_eps): the velocity of z toward the (predicted or true) clean x."""
  return (x - z) / jnp.maximum(1 - _bt(t, z), t_eps)


def v_loss(x_hat: jax.Array, x: jax.Array, z: jax.Array, t: jax.Array, *, t_eps: float = T_EPS,
           weight: jax.Array | None = None) -> jax.Array:
  """The v-loss of an x-prediction: per example the mean over elements of (v - v_hat)^2, then the batch mean
  (weighted by `weight` (B,) when given: sum(w l) / B, so a weight of 0 drops an example's stream)."""
  diff = velocity(x, z, t, t_eps) - velocity(x_hat, z, t, t_eps)
  per = jnp.mean(jnp.square(diff.astype(jnp.float32)), axis=tuple(range(1, diff.ndim)))
  if weight is not None:
    per = per * jnp.asarray(weight, jnp.float32)
  return jnp.mean(per)


def logit_normal(key: jax.Array, shape: Sequence[int], mean: float = -0.8, std: float = 0.8) -> jax.Array:
  """sigmoid(N(mean, std^2)) times (JiT's training distribution: mean -0.8, std 0.8)."""
  return jax.nn.sigmoid(mean + std * jax.random.normal(key, tuple(shape)))


def uniform(key: jax.Array, shape: Sequence[int], lo: float = 0.0, hi: float = 1.0) -> jax.Array:
  """U(lo, hi) times."""
  return jax.random.uniform(key, tuple(shape), minval=lo, maxval=hi)


def shift(t, s: float):
  """The time warp s t / (1 + (s - 1) t) (identity at s = 1; keeps 0 and 1 fixed)."""
  return s * t / (1 + (s - 1) * t)


# ------------------------------------------------------------------------------------------ schedules


def joint_times(streams: Sequence[str], num_steps: int, shifts: Mapping[str, float] | None = None
                ) -> dict[str, np.ndarray]:
  """Every stream from 0 to 1 on a uniform grid of num_steps steps, each warped by its shift (default 1)."""
  _check_steps(num_steps)
  u = np.linspace(0.0, 1.0, num_steps + 1)
  shifts = dict(shifts or {})
  unknown = set(shifts) - set(streams)
  if unknown:
    raise ConfigError(f"joint_times: shifts for unknown streams {sorted(unknown)} (streams: {list(streams)})")
  return {s: _unit(shift(u, float(shifts.get(s, 1.0)))) for s in streams}


def cascaded_times(order: Sequence[str], steps: Sequence[int], *, final: Mapping[str, float] | None = None,
                   shifts: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
  """Streams integrated one after another: stream order[k] runs 0 -> final[k] (default 1) during its
  steps[k] steps while the later streams stay at 0 and the earlier ones at their final time (Latent
  Forcing's sampler: the latent first, then the pixels).

  Returns:
    {stream: (sum(steps) + 1,)} time tables.
  """
  if len(order) != len(steps) or not order:
    raise ConfigError(f"cascaded_times: one step count per stream, got {list(order)} and {list(steps)}")
  for n in steps:
    _check_steps(n)
  final, shifts = dict(final or {}), dict(shifts or {})
  total = int(sum(steps))
  out = {s: np.zeros(total + 1) for s in order}
  start = 0
  for s, n in zip(order, steps):
    end_t = float(final.get(s, 1.0))
    seg = _unit(shift(np.linspace(0.0, 1.0, n + 1), float(shifts.get(s, 1.0)))) * end_t
    out[s][start:start + n + 1] = seg
    out[s][start + n + 1:] = end_t
    start += n
  return out


def offset_times(offsets: Mapping[str, float], num_steps: int) -> dict[str, np.ndarray]:
  """A global clock u from 0 to 1 + max(offset) in num_steps steps; stream i's time is clip(u - offset_i, 0, 1)
  (offset 0: starts at once; offset 0.5: starts denoising when the others are half-way)."""
  _check_steps(num_steps)
  if any(o < 0 for o in offsets.values()):
    raise ConfigError(f"offset_times: offsets must be >= 0, got {dict(offsets)}")
  u = np.linspace(0.0, 1.0 + max(offsets.values()), num_steps + 1)
  return {s: np.clip(u - o, 0.0, 1.0) for s, o in offsets.items()}


def balanced_times(shifts: Mapping[str, float], num_steps: int) -> dict[str, np.ndarray]:
  """Streams on one clock, each warped by its own shift, with the steps balanced between them (Latent
  Forcing's multi-schedule sampler, `get_generate_timesteps` of the official code): stream i's time is
  shift(u, a_i) on a clock u whose points are every k-th of the merged grids on which each of the k streams
  is uniform (u = shift(y, 1 / a_i) for y on a uniform grid), so every stream gets its share of small steps.

  Two streams with shifts (s, 1 / s) run the first at shift(t, s^2) of the second's time: the relative shift
  alpha = s^2 of the paper's Table 1 (alpha > 1: the first stream leads).
  """
  _check_steps(num_steps)
  if not shifts or any(a <= 0 for a in shifts.values()):
    raise ConfigError(f"balanced_times: one shift > 0 per stream, got {dict(shifts)}")
  y = np.linspace(0.0, 1.0, num_steps + 1)
  u = np.sort(np.concatenate([shift(y, 1.0 / float(a)) for a in shifts.values()]))[::len(shifts)]
  u[0], u[-1] = 0.0, 1.0
  return {s: _unit(shift(u, float(a))) for s, a in shifts.items()}


def _unit(t: np.ndarray) -> np.ndarray:
  """Times clipped into [0, 1] (a shift's rounding can leave the last one a hair above 1)."""
  return np.clip(t, 0.0, 1.0)


def _check_steps(n):
  if not isinstance(n, (int, np.integer)) or n < 1:
    raise ConfigError(f"the number of sampling steps must be a positive integer, got {n!r}")


# ---------------------------------------------------------------------------------------- integrators


def _times(table: Mapping[str, np.ndarray], i: int, batch: int) -> dict[str, jax.Array]:
  return {s: jnp.full((batch,), float(v[i]), jnp.float32) for s, v in table.items()}


def euler_step(denoise: Denoiser, z: Streams, t: Streams, t_next: Streams, *, t_eps: float = T_EPS) -> dict:
  """z + (t_next - t) v_hat(z, t) per stream."""
  x_hat = denoise(z, t)
  return {s: z[s] + _bt(t_next[s] - t[s], z[s]) * velocity(x_hat[s], z[s], t[s], t_eps) for s in z}


def heun_step(denoise: Denoiser, z: Streams, t: Streams, t_next: Streams, *, t_eps: float = T_EPS,
              euler_at_one: bool = False) -> dict:
  """Heun (trapezoidal predictor-corrector): the mean of the velocities at (z, t) and at the Euler
  prediction (z', t_next). euler_at_one: a stream whose step ends at t = 1 takes the Euler update instead (the
  reason JiT ends on an Euler step, applied per stream: at t = 1 the clamped velocity of a denoiser that
  returns its clean input is ~0, so the trapezoid would go only half-way)."""
  x1 = denoise(z, t)
  v1 = {s: velocity(x1[s], z[s], t[s], t_eps) for s in z}
  z_e = {s: z[s] + _bt(t_next[s] - t[s], z[s]) * v1[s] for s in z}
  x2 = denoise(z_e, t_next)
  out = {}
  for s in z:
    v = 0.5 * (v1[s] + velocity(x2[s], z_e[s], t_next[s], t_eps))
    if euler_at_one:
      v = jnp.where(_bt(t_next[s], z[s]) >= 1.0, v1[s], v)
    out[s] = z[s] + _bt(t_next[s] - t[s], z[s]) * v
  return out


def sample(denoise: Denoiser, noise: Streams, table: Mapping[str, np.ndarray], *, method: str = "heun",
           t_eps: float = T_EPS, jit: bool = True, scan: bool = False, euler_at_one: bool = False) -> dict:
  """Integrates from `noise` (z at the table's first times) along the time table.

  Args:
    denoise: `(z, t) -> x_hat` per stream (pure; jitted here unless jit=False).
    noise: {stream: (B, ...)} starting states (eps at t = 0).
    table: {stream: (num_steps + 1,)} non-decreasing times, every noise stream included.
    method: "heun" (Heun on every step but the last, which is Euler, as JiT samples) or "euler".
    t_eps: the velocity clamp at sampling. The default is JiT's training clamp (0.05), which its sampler
      also uses; it damps the velocity once 1 - t < t_eps, so the last steps do not fully denoise (with the
      exact x-predictor of a Gaussian, Frechet distance ~1e-3 at 50 steps instead of ~1e-7). A clamp below
      the last step size (e.g. 1e-3; Latent Forcing's code has a separate `t_eps_inference`) removes that
      bias; the last Euler step then lands on the predicted x.
    euler_at_one: with "heun", a stream's step that ends at t = 1 before the table's last step (the latent's
      last step in a cascade) is Euler for that stream, as the last step is for every stream (`heun_step`).
      Off by default: Latent Forcing's official sampler takes the trapezoid there.
    scan: loop over the steps with `jax.lax.fori_loop` (the denoiser is traced twice, for the Heun steps and
      the final Euler one, instead of once per step: much faster to compile) reading the times from the table
      as arrays, which may then be traced values (one compile serves every table of the same length; the
      checks on the values are skipped for traced tables). Same arithmetic as the unrolled loop.

  Returns:
    {stream: (B, ...)} states at the table's last times.
  """
  if method not in ("heun", "euler"):
    raise ConfigError(f"flow.sample: method={method!r} is not 'heun' or 'euler'")
  if set(table) != set(noise):
    raise ConfigError(f"flow.sample: the time table has streams {sorted(table)}, the noise {sorted(noise)}")
  lengths = {len(v) for v in table.values()}
  if len(lengths) != 1 or lengths.pop() < 2:
    raise ConfigError("flow.sample: every stream's time table needs the same length >= 2")
  for s, v in table.items():
    if isinstance(v, jax.core.Tracer):
      continue
    if np.any(np.diff(v) < 0) or v[0] < 0 or v[-1] > 1:
      raise ConfigError(f"flow.sample: stream {s!r}'s times must be non-decreasing within [0, 1]")
  n = len(next(iter(table.values()))) - 1
  batch = next(iter(noise.values())).shape[0]
  def heun(den, z, t, u, *, t_eps):
    return heun_step(den, z, t, u, t_eps=t_eps, euler_at_one=euler_at_one)
  if scan:
    tab = {s: jnp.asarray(v, jnp.float32) for s, v in table.items()}

    def at(i):
      return {s: jnp.full((batch,), v[i], jnp.float32) for s, v in tab.items()}

    def steps(step_fn, lo, hi, z):
      return jax.lax.fori_loop(lo, hi, lambda i, z: step_fn(denoise, z, at(i), at(i + 1), t_eps=t_eps), z)

    def run(z):
      heun_steps = n - 1 if method == "heun" else 0
      return steps(euler_step, heun_steps, n, steps(heun, 0, heun_steps, z))
    return (jax.jit(run) if jit else run)(dict(noise))
  heun_fn = jax.jit(lambda z, t, u: heun(denoise, z, t, u, t_eps=t_eps)) if jit else (
      lambda z, t, u: heun(denoise, z, t, u, t_eps=t_eps))
  euler = jax.jit(lambda z, t, u: euler_step(denoise, z, t, u, t_eps=t_eps)) if jit else (
      lambda z, t, u: euler_step(denoise, z, t, u, t_eps=t_eps))
  z = dict(noise)
  for i in range(n):
    step = heun_fn if method == "heun" and i < n - 1 else euler
    z = step(z, _times(table, i, batch), _times(table, i + 1, batch))
  return z
