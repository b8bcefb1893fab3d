"""A learned score: an MLP denoiser trained by denoising score matching (DSM), same interface as `EmpiricalScore`.

The OU marginal x_t = alpha_t x_0 + sigma_t z is, after y = x_t / alpha_t, the variance-exploding form
y = x_0 + s z with noise level s = sigma_t / alpha_t. The network F is wrapped in the EDM preconditioning
(Karras et al. 2022) with data scale sigma_d (the training set's RMS coordinate):

    denoise(x, t) = c_skip(s) y + c_out(s) F(c_in(s) y, log s),
    c_skip = sigma_d^2 / (s^2 + sigma_d^2), c_out = s sigma_d / sqrt(s^2 + sigma_d^2), c_in = 1 / sqrt(s^2 + sigma_d^2),

and trained by DSM, E_{x_0 ~ train, t, z} ||denoise(x_t, t) - x_0||^2 / c_out^2 (every noise level weighted to unit
scale), with log t uniform on [t_min, t_max]. The score follows by Tweedie: (alpha_t denoise - x) / sigma_t^2.
Unlike the empirical score it does not memorise the training set exactly (a non-memorising comparison).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxlab.diffusion.ou import ou_coeffs, ou_sample
from jaxlab.diffusion.score import score_from_denoiser
from jaxlab.errors import ConfigError, DataError
from jaxlab.nn.mlp import MLP


class ScoreMLP(nnx.Module):
  """F(y_in, log s): an MLP on [y_in, Fourier features of log s, log s / 4].

  Args:
    dim: data dimension D.
    width: hidden width.
    depth: number of hidden layers.
    time_features: number of sin/cos pairs of log s.
    rngs: NNX random streams.
  """

  def __init__(self, dim: int, width: int = 128, depth: int = 3, time_features: int = 8, *, rngs: nnx.Rngs):
    self.freqs = nnx.Variable(jnp.exp(jnp.linspace(math.log(0.1), math.log(4.0), time_features)))
    with nnx.use_eager_sharding(False):   # unsharded: the MLP's logical axis names are never mapped here
      self.mlp = MLP(dim + 2 * time_features + 1, [width] * depth, dim, activation=nnx.silu, rngs=rngs)

  def __call__(self, y_bd: jax.Array, log_s_b: jax.Array) -> jax.Array:
    """Maps (batch, D) scaled inputs and (batch,) log noise levels to (batch, D)."""
    ls = log_s_b[:, None]
    ang = ls * self.freqs[...][None, :]
    return self.mlp(jnp.concatenate([y_bd, jnp.sin(ang), jnp.cos(ang), ls / 4.0], axis=-1))


def _precond(t, b, sigma_d):
  alpha, sigma2 = ou_coeffs(t)
  alpha, sigma2 = jnp.broadcast_to(alpha, (b,)), jnp.broadcast_to(sigma2, (b,))
  s = jnp.sqrt(sigma2) / alpha
  r = jnp.sqrt(s ** 2 + sigma_d ** 2)
  return alpha, s, sigma_d ** 2 / r ** 2, s * sigma_d / r, 1.0 / r


def precond_denoise(model: ScoreMLP, x_bd: jax.Array, t, sigma_d) -> jax.Array:
  """EDM-preconditioned denoiser E[x_0 | x_t = x] ~ c_skip y + c_out F(c_in y, log s), (batch, D)."""
  alpha, s, c_skip, c_out, c_in = _precond(t, x_bd.shape[0], sigma_d)
  y = x_bd / alpha[:, None]
  return c_skip[:, None] * y + c_out[:, None] * model(c_in[:, None] * y, jnp.log(s))


@dataclasses.dataclass(frozen=True)
class LearnedScore:
  """Score interface over a trained ScoreMLP (graphdef + state from nnx.split) and its data scale sigma_d."""
  graphdef: nnx.GraphDef
  state: nnx.State

  def denoise(self, x_bd: jax.Array, t) -> jax.Array:
    """E[x_0 | x_t = x] as learned, (batch, D)."""
    model = nnx.merge(self.graphdef, self.state)
    return precond_denoise(model, x_bd, t, model.sigma_d[...])

  def score(self, x_bd: jax.Array, t) -> jax.Array:
    """Tweedie: (alpha_t denoise - x) / sigma_t^2, (batch, D)."""
    return score_from_denoiser(self.denoise)(x_bd, t)


def dsm_loss(model: ScoreMLP, x0_bd: jax.Array, t_b: jax.Array, key: jax.Array, sigma_d) -> jax.Array:
  """Preconditioned DSM loss: mean over the batch and coordinates of ||denoise(x_t, t) - x_0||^2 / c_out^2."""
  xt, _ = ou_sample(key, x0_bd, t_b)
  c_out = _precond(t_b, x0_bd.shape[0], sigma_d)[3]
  return jnp.mean(((precond_denoise(model, xt, t_b, sigma_d) - x0_bd) / c_out[:, None]) ** 2)


def train_dsm(key: jax.Array, train_nd: jax.Array, *, width: int = 128, depth: int = 3, steps: int = 2000,
              batch: int = 256, learning_rate: float = 1e-3, t_min: float = 1e-3, t_max: float = 6.0
              ) -> tuple[LearnedScore, jax.Array]:
  """Trains a ScoreMLP on the training set by DSM (Adam, cosine decay; one compiled lax.scan).

  Args:
    key: PRNG key (init, minibatches, times, noise).
    train_nd: (n, D) float32 training points.
    width, depth: network size.
    steps, batch, learning_rate: optimisation.
    t_min, t_max: range of the log-uniform training times.

  Returns:
    (LearnedScore, losses (steps,) float32).
  """
  if train_nd.ndim != 2 or train_nd.shape[0] < 1:
    raise DataError(f"train must be (n, D) with n >= 1, got {train_nd.shape}")
  if steps < 1 or batch < 1 or not 0 < t_min < t_max:
    raise ConfigError(f"train_dsm needs steps, batch >= 1 and 0 < t_min < t_max, got steps={steps}, "
                      f"batch={batch}, t_min={t_min}, t_max={t_max}")
  train_nd = jnp.asarray(train_nd, jnp.float32)
  k_init, k_loop = jax.random.split(key)
  model = ScoreMLP(train_nd.shape[1], width, depth, rngs=nnx.Rngs(k_init))
  model.sigma_d = nnx.Variable(jnp.sqrt(jnp.mean(train_nd ** 2)) + 1e-6)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt = optax.adam(optax.cosine_decay_schedule(learning_rate, steps, alpha=0.05))
  n = train_nd.shape[0]

  def loss_fn(p, x0, t, k):
    m = nnx.merge(graphdef, p, rest)
    return dsm_loss(m, x0, t, k, m.sigma_d[...])

  def step(carry, i):
    p, o = carry
    k = jax.random.fold_in(k_loop, i)
    k_idx, k_t, k_z = jax.random.split(k, 3)
    x0 = train_nd[jax.random.randint(k_idx, (batch,), 0, n)]
    t = jnp.exp(jax.random.uniform(k_t, (batch,), jnp.float32, math.log(t_min), math.log(t_max)))
    loss, g = jax.value_and_grad(loss_fn)(p, x0, t, k_z)
    upd, o = opt.update(g, o, p)
    return (optax.apply_updates(p, upd), o), loss

  @jax.jit
  def run(p):
    return jax.lax.scan(step, (p, opt.init(p)), jnp.arange(steps))

  (params, _), losses = run(params)
  graphdef, state = nnx.split(nnx.merge(graphdef, params, rest))
  return LearnedScore(graphdef, state), losses
