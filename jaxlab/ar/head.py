"""A per-token flow-matching head (MAR-style MLP with adaLN), its loss, and its sampler with CFG.

MAR (Li et al. 2024, "Autoregressive Image Generation without Vector Quantization", arXiv 2406.11838; code
LTH14/mar `SimpleMLPAdaLN`) models p(x_i | f_i) of one continuous token x_i given the transformer's feature f_i
with a small denoising MLP. SAR ("Autoregression with Self-Token Prediction", ICML 2026) uses token-level flow
matching with the linear interpolant (rectified flow) instead of DDPM; we follow `jaxlab.diffusion.flow`'s
convention, t = 1 CLEAN:

    z_t = t x + (1 - t) eps,   v = x - eps,   loss = mean ||v_hat(z_t, t, f) - v||^2,   t ~ U(0, 1)

with `batch_mul` independent (t, eps) draws per token (MAR's diffusion_batch_mul). Sampling integrates the ODE
with Euler from z_0 = temperature * eps over a reparameterised time grid t_k = shift(k / K, s) (`flow.shift`:
s < 1 spends more steps near the noise). The paper's "time reparameterisation" (its Eq. 9) is not public; this
shift is our reconstruction, a config value. Classifier-free guidance mixes the velocities:
v = v_u + w (v_c - v_u).

Network: x_in = W x, c = TimeMLP(sinusoid(1000 t)) + W_c f; `depth` residual blocks
h <- h + gate * MLP(LN(h) (1 + scale) + shift) with (shift, scale, gate) = W(SiLU(c)) zero-initialised; the output
layer adaLN-modulated and zero-initialised.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.diffusion import flow
from jaxlab.errors import ConfigError
from jaxlab.nn import layers


@dataclasses.dataclass(frozen=True)
class HeadConfig:
  """token_dim: token channels; cond_dim: feature width; width / depth: the MLP; freq_dim: time features."""
  token_dim: int
  cond_dim: int
  width: int = 128
  depth: int = 3
  freq_dim: int = 64
  init_std: float = 0.02

  def __post_init__(self):
    if min(self.token_dim, self.cond_dim, self.width, self.depth) < 1 or self.freq_dim % 2:
      raise ConfigError(f"HeadConfig: sizes must be >= 1 and freq_dim even, got {self}")


def _dense(i, o, c: HeadConfig, rngs, *, zero=False):
  return layers.dense(i, o, names=(None, None), kernel_init=layers.zeros() if zero else layers.normal(c.init_std),
                      use_bias=True, rngs=rngs)


def _ln(x, eps=1e-6):
  mu = jnp.mean(x, -1, keepdims=True)
  return (x - mu) * jax.lax.rsqrt(jnp.mean(jnp.square(x - mu), -1, keepdims=True) + eps)


class ResBlock(nnx.Module):
  def __init__(self, c: HeadConfig, rngs):
    self.ada = _dense(c.width, 3 * c.width, c, rngs, zero=True)
    self.fc1 = _dense(c.width, c.width, c, rngs)
    self.fc2 = _dense(c.width, c.width, c, rngs)

  def __call__(self, h, cs):
    shift, scale, gate = jnp.split(self.ada(cs), 3, -1)
    return h + gate * self.fc2(jax.nn.silu(self.fc1(_ln(h) * (1 + scale) + shift)))


class FlowHead(nnx.Module):
  """v_hat(z (M, token_dim), t (M,), f (M, cond_dim)) -> (M, token_dim) (see the module docstring)."""

  def __init__(self, config: HeadConfig, *, rngs: nnx.Rngs):
    c = self.config = config
    with nnx.use_eager_sharding(False):
      self.x_in = _dense(c.token_dim, c.width, c, rngs)
      self.t1 = _dense(c.freq_dim, c.width, c, rngs)
      self.t2 = _dense(c.width, c.width, c, rngs)
      self.c_in = _dense(c.cond_dim, c.width, c, rngs)
      self.blocks = nnx.List([ResBlock(c, rngs) for _ in range(c.depth)])
      self.final_ada = _dense(c.width, 2 * c.width, c, rngs, zero=True)
      self.out = _dense(c.width, c.token_dim, c, rngs, zero=True)

  def time_embedding(self, t):
    """(M,) times -> (M, width)."""
    half = self.config.freq_dim // 2
    freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    a = 1000.0 * t.astype(jnp.float32)[:, None] * freqs[None]
    return self.t2(jax.nn.silu(self.t1(jnp.concatenate([jnp.cos(a), jnp.sin(a)], -1))))

  def velocity(self, z, c):
    """v_hat from z (M, token_dim) and the conditioning c = time_embedding(t) + c_in(f) (M or 1, width)."""
    cs = jax.nn.silu(c)
    h = self.x_in(z)
    for blk in self.blocks:
      h = blk(h, cs)
    shift, scale = jnp.split(self.final_ada(cs), 2, -1)
    return self.out(_ln(h) * (1 + scale) + shift)

  def __call__(self, z, t, f):
    return self.velocity(z, self.time_embedding(t) + self.c_in(f))


def flow_loss(head: FlowHead, x, f, key, *, batch_mul: int = 4, weight=None):
  """Rectified-flow loss of tokens x (M, D) given features f (M, C), `batch_mul` draws per token; `weight`
  (M,) optional per-token weights (mean over weighted tokens)."""
  x = jnp.repeat(x, batch_mul, 0)
  f = jnp.repeat(f, batch_mul, 0)
  kt, ke = jax.random.split(key)
  t = jax.random.uniform(kt, (x.shape[0],))
  eps = jax.random.normal(ke, x.shape, x.dtype)
  z = flow.interpolate(x, eps, t)
  err = jnp.mean(jnp.square(head(z, t, f).astype(jnp.float32) - (x - eps).astype(jnp.float32)), -1)
  if weight is None:
    return jnp.mean(err)
  w = jnp.repeat(weight.astype(jnp.float32), batch_mul, 0)
  return jnp.sum(err * w) / jnp.maximum(jnp.sum(w), 1.0)


def time_grid(steps: int, shift: float = 1.0) -> np.ndarray:
  """(steps + 1,) times 0 -> 1 reparameterised by `flow.shift(., shift)`."""
  if steps < 1 or shift <= 0:
    raise ConfigError(f"time_grid: steps >= 1 and shift > 0 needed, got steps={steps}, shift={shift}")
  return np.asarray(flow.shift(np.linspace(0.0, 1.0, steps + 1), shift), np.float32)


def integrate(velocity, z0, grid):
  """Euler integration of dz/dt = velocity(z, t (M,)) from z0 (M, D) along the times `grid` (K + 1,)."""
  grid = jnp.asarray(grid, jnp.float32)

  def body(i, z):
    return z + (grid[i + 1] - grid[i]) * velocity(z, jnp.full((z.shape[0],), grid[i]))
  return jax.lax.fori_loop(0, grid.shape[0] - 1, body, z0)


def sample(head: FlowHead, f, key, *, steps: int = 20, shift: float = 1.0, temperature: float = 1.0,
           f_uncond=None, cfg: float = 1.0):
  """Tokens (M, D) for features f (M, C) by Euler on `time_grid(steps, shift)`; with `f_uncond` and cfg != 1,
  classifier-free guidance v_u + cfg (v_c - v_u). The feature projection is computed once per token and the
  time embedding once per step (shared by the M tokens): the same function as `head(z, t, f)` per step."""
  m = f.shape[0]
  z0 = temperature * jax.random.normal(key, (m, head.config.token_dim), jnp.float32)
  guided = f_uncond is not None and cfg != 1.0
  cf = head.c_in(jnp.concatenate([f, f_uncond], 0) if guided else f)

  def v(z, t):
    c = cf + head.time_embedding(t[:1])
    if not guided:
      return head.velocity(z, c).astype(jnp.float32)
    out = head.velocity(jnp.concatenate([z, z], 0), c).astype(jnp.float32)
    return out[m:] + cfg * (out[:m] - out[m:])
  return integrate(v, z0, time_grid(steps, shift))
