"""Score-based diffusion: the OU forward process, reverse samplers, empirical and learned scores, metrics.

* `ou`: the Ornstein-Uhlenbeck forward process x_t = e^{-t} x_0 + sqrt(1 - e^{-2t}) z, its transitions and
  the geometric time grid.
* `score`: the score / denoiser interface (`denoise(x, t) -> E[x_0 | x_t = x]`, `score(x, t)`), the closed-form
  score of the Gaussian-smoothed empirical measure (`EmpiricalScore`, chunked online log-sum-exp) and its
  log-density.
* `dsm`: a small MLP noise predictor trained by denoising score matching (`LearnedScore`, same interface).
* `samplers`: the exponential-integrator (DDPM-posterior) sampler with early stopping and a final Tweedie
  denoise, and Euler-Maruyama on the reverse SDE.
* `data`: unions of M random k-dimensional subspaces of R^D with Gaussian or uniform coordinates.
* `metrics`: exact W1 (POT), entropic W1 (ott-jax), sliced W1, nearest-subspace distance and assignment,
  log-log slope fits with confidence intervals.
* `flow` (import it directly): flow matching with the linear interpolant z = t x + (1 - t) eps, where t = 1 is
  CLEAN, the opposite direction of the OU time above (t = 0 clean); x-prediction with the v-loss, Euler / Heun
  over per-stream times, sampling schedules. `guidance`: per-stream classifier-free guidance and autoguidance.
"""

from jaxlab.diffusion.ou import geometric_grid, ou_coeffs, ou_sample, ou_transition  # noqa: F401
from jaxlab.diffusion.score import (EmpiricalScore, kde_denoiser, kde_log_density, kde_score,  # noqa: F401
                                    score_from_denoiser)
from jaxlab.diffusion.samplers import euler_maruyama, exponential_integrator  # noqa: F401

__all__ = ["EmpiricalScore", "euler_maruyama", "exponential_integrator", "geometric_grid", "kde_denoiser",
           "kde_log_density", "kde_score", "ou_coeffs", "ou_sample", "ou_transition", "score_from_denoiser"]
