"""Guidance for multi-stream flow denoisers (`jaxlab.diffusion.flow`): per-stream classifier-free guidance with
per-stream time intervals, and autoguidance.

With x-prediction, guiding the predicted x or the velocity is the same at fixed (z, t), since
v_hat = (x_hat - z) / max(1 - t, t_eps) is affine in x_hat:

    x_i = x_uncond,i + s_i (x_cond,i - x_uncond,i)     where t_i is inside [lo_i, hi_i] (per example),
    x_i = x_cond,i                                     outside the interval (guidance off).

* Classifier-free guidance (Ho & Salimans 2022): the unconditional branch is the same model with the class
  dropped (the label embedding's extra "null" class).
* Guidance interval (Kynkaanniemi et al. 2024): guidance only inside a time interval; here one per stream,
  as Latent Forcing uses (arXiv 2602.11401: e.g. latent interval [0.06, 1.0]).
* Autoguidance (Karras et al. 2024, "Guiding a Diffusion Model with a Bad Version of Itself"): the
  unconditional branch is a second, smaller / less trained model (its own parameters), conditioned or not.

At scale 1 every variant returns the conditional prediction exactly.
"""

from __future__ import annotations

from typing import Mapping

import jax.numpy as jnp

from jaxlab.diffusion.flow import Denoiser, Streams
from jaxlab.errors import ConfigError


def combine(cond: Streams, uncond: Streams, t: Streams, scales: Mapping[str, float],
            intervals: Mapping[str, tuple[float, float]] | None = None) -> dict:
  """uncond + s (cond - uncond) per stream where its time is in the stream's interval, else cond.

  Args:
    cond, uncond: {stream: (B, ...)} predictions.
    t: {stream: (B,)} times of the prediction.
    scales: {stream: s}; a stream without a scale is not guided (s = 1).
    intervals: {stream: (lo, hi)} inclusive; a stream without one is guided at every time.
  """
  intervals = dict(intervals or {})
  unknown = (set(scales) | set(intervals)) - set(cond)
  if unknown:
    raise ConfigError(f"guidance: scales / intervals for unknown streams {sorted(unknown)} (streams: "
                      f"{sorted(cond)})")
  out = {}
  for s, c in cond.items():
    scale = float(scales.get(s, 1.0))
    if scale == 1.0:
      out[s] = c
      continue
    guided = uncond[s] + scale * (c - uncond[s])
    if s in intervals:
      lo, hi = intervals[s]
      on = (t[s] >= lo) & (t[s] <= hi)
      guided = jnp.where(on.reshape(on.shape + (1,) * (c.ndim - 1)), guided, c)
    out[s] = guided
  return out


def guided(cond: Denoiser, uncond: Denoiser, scales: Mapping[str, float],
           intervals: Mapping[str, tuple[float, float]] | None = None) -> Denoiser:
  """A denoiser combining `cond` and `uncond` by `combine` (both evaluated at the same (z, t)).

  Classifier-free guidance: `uncond` is the model with the null class; autoguidance: `uncond` is the
  smaller model's denoiser (e.g. `lambda z, t: small(params_small, z, t, y)`).
  """
  def denoise(z, t):
    return combine(cond(z, t), uncond(z, t), t, scales, intervals)
  return denoise
