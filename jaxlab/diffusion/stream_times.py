"""Training-time samplers of per-stream times for two-stream flow models (Latent Forcing, arXiv 2602.11401).

Each draws, for a batch, one time per stream (t = 1 clean, as in `jaxlab.diffusion.flow`) and one loss weight
per stream, so the training loss is sum_s lambda_s * v_loss_s(weight=w_s). The modes follow the official code's
`sample_mode` (AlanBaade/LatentForcing, `DenoiserCoT.sample_t`, read for the spec; written here from the spec):

* "cascaded_noised" (`dino_first_cascaded_noised`, the method): with probability p_latent a LATENT step,
  t_lat = sigmoid(N(latent_mean, latent_std)), t_pix = 0 (the pixels are pure noise), weights (0, 1); otherwise a
  PIXEL step, t_pix = sigmoid(N(pixel_mean, pixel_std)) (replaced by U(0, uniform_max) with probability
  p_uniform), t_lat ~ U(1 - latent_noise, 1) (an almost clean latent, noised by up to latent_noise), weights
  (1, 0).
* "cascaded" (`dino_first_cascaded`): the same with t_lat = 1 exactly on pixel steps.
* "shifted_aligned" (`dino_first_shifted_aligned`): one logit-normal time t (pixel_mean, pixel_std) for the
  pixels and t_lat = shift(t, alpha) for the latent, both weighted 1.
* "independent" (`shifted_independent_uniform`, the paper's multi-schedule model): t_pix and t_lat drawn
  independently, each shift(U(0, 1), independent_shift), both weighted 1; sampled afterwards along any
  schedule (e.g. `flow.joint_times` with shifts alpha / 1 / alpha: latent first for alpha > 1).
* "pixel_only" / "latent_only" (ablations): one stream logit-normal with weight 1, the other at t = 0 with
  weight 0 (pixel_only is plain JiT when the latent input is zeroed).

Reconstructed (not fixed by the sources read): the time distribution of the pixels in "shifted_aligned" (taken
as the pixel logit-normal) and that "pixel_only" / "latent_only" hold the other stream at t = 0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxlab.diffusion.flow import shift
from jaxlab.errors import ConfigError

MODES = ("cascaded_noised", "cascaded", "shifted_aligned", "independent", "pixel_only", "latent_only")


@dataclasses.dataclass(frozen=True)
class StreamTimes:
  """The sampler's settings (defaults: the paper's, ImageNet; Table 12 and the official README via the spec).

  Attributes:
    mode: one of MODES.
    pixel, latent: the two stream names.
    p_latent: probability of a latent step (cascaded modes; 0.4).
    latent_mean, latent_std: logit-normal of the latent's time on latent steps (-1.2, 1.0).
    pixel_mean, pixel_std: logit-normal of the pixels' time (-0.4, 0.8).
    p_uniform, uniform_max: probability of replacing the pixel time by U(0, uniform_max) (0.1, 0.5).
    latent_noise: beta, the latent's noise on pixel steps: t_lat ~ U(1 - beta, 1) (0.25).
    alpha: the variance shift of "shifted_aligned".
    independent_shift: the shift of each uniform time in "independent" (0.5).
  """
  mode: str = "cascaded_noised"
  pixel: str = "pixel"
  latent: str = "latent"
  p_latent: float = 0.4
  latent_mean: float = -1.2
  latent_std: float = 1.0
  pixel_mean: float = -0.4
  pixel_std: float = 0.8
  p_uniform: float = 0.1
  uniform_max: float = 0.5
  latent_noise: float = 0.25
  alpha: float = 9.0
  independent_shift: float = 0.5

  def __post_init__(self):
    if self.mode not in MODES:
      raise ConfigError(f"stream times: mode={self.mode!r} is not one of {', '.join(MODES)}")
    if self.pixel == self.latent:
      raise ConfigError(f"stream times: the pixel and latent streams need different names, got {self.pixel!r}")
    for name in ("p_latent", "p_uniform", "latent_noise"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ConfigError(f"stream times: {name}={getattr(self, name)} must be in [0, 1]")
    if self.alpha <= 0 or self.independent_shift <= 0:
      raise ConfigError(f"stream times: shifts must be > 0, got alpha={self.alpha}, "
                        f"independent_shift={self.independent_shift}")

  def __call__(self, key: jax.Array, batch: int) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """({stream: t (batch,)}, {stream: loss weight (batch,)}) for one training batch."""
    k_step, k_lat, k_pix, k_uni, k_sw, k_noise = jax.random.split(key, 6)
    ones, zeros = jnp.ones((batch,)), jnp.zeros((batch,))
    ln = lambda k, m, s: jax.nn.sigmoid(m + s * jax.random.normal(k, (batch,)))  # noqa: E731
    t_pix = ln(k_pix, self.pixel_mean, self.pixel_std)
    if self.mode in ("cascaded_noised", "cascaded"):
      t_pix = jnp.where(jax.random.uniform(k_sw, (batch,)) < self.p_uniform,
                        jax.random.uniform(k_uni, (batch,), maxval=self.uniform_max), t_pix)
    m = self.mode
    if m in ("cascaded_noised", "cascaded"):
      latent_step = jax.random.uniform(k_step, (batch,)) < self.p_latent
      t_lat_latent = ln(k_lat, self.latent_mean, self.latent_std)
      t_lat_pixel = (jax.random.uniform(k_noise, (batch,), minval=1.0 - self.latent_noise, maxval=1.0)
                     if m == "cascaded_noised" else ones)
      times = {self.pixel: jnp.where(latent_step, 0.0, t_pix),
               self.latent: jnp.where(latent_step, t_lat_latent, t_lat_pixel)}
      weights = {self.pixel: jnp.where(latent_step, 0.0, 1.0), self.latent: jnp.where(latent_step, 1.0, 0.0)}
    elif m == "shifted_aligned":
      times, weights = {self.pixel: t_pix, self.latent: shift(t_pix, self.alpha)}, {self.pixel: ones,
                                                                                    self.latent: ones}
    elif m == "independent":
      u_p, u_l = jax.random.uniform(k_pix, (batch,)), jax.random.uniform(k_lat, (batch,))
      times = {self.pixel: shift(u_p, self.independent_shift), self.latent: shift(u_l, self.independent_shift)}
      weights = {self.pixel: ones, self.latent: ones}
    elif m == "pixel_only":
      times, weights = {self.pixel: t_pix, self.latent: zeros}, {self.pixel: ones, self.latent: zeros}
    else:   # latent_only
      times = {self.pixel: zeros, self.latent: ln(k_lat, self.latent_mean, self.latent_std)}
      weights = {self.pixel: zeros, self.latent: ones}
    return times, weights
