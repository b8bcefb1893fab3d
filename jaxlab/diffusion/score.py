"""Score functions behind one interface, and the closed-form score of the smoothed empirical measure.

Interface: an object with `denoise(x_bd, t) -> E[x_0 | x_t = x]` (Tweedie's posterior mean, (batch, dim)) and
`score(x_bd, t) -> grad_x log p_t(x)`. Under the OU process the two are tied by Tweedie's formula

    score_t(x) = (alpha_t * denoise_t(x) - x) / sigma_t^2,     alpha_t = e^{-t}, sigma_t^2 = 1 - e^{-2t}.

`EmpiricalScore` is the exact score of p_hat_t = (1/n) sum_i N(alpha_t x_i, sigma_t^2 I), the empirical measure of
the training set pushed through the forward process (the kernel-density score estimator of the paper's proof;
its exact truncation / density floor is reconstructed as "none", see the experiment README):

    denoise_t(x) = sum_i w_i(x) x_i,   w_i(x) = softmax_i(-||x - alpha_t x_i||^2 / (2 sigma_t^2)).

The softmax is computed flash-attention style: a `lax.scan` over chunks of the training set keeps a running
max, normaliser and weighted sum, so memory is O(batch x chunk) whatever n is; a batch larger than
`batch_chunk` is processed in slices with `lax.map`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp

from jaxlab.diffusion.ou import ou_coeffs
from jaxlab.errors import DataError

Denoiser = Callable[[jax.Array, jax.Array], jax.Array]


def _check(x_bd, train_nd):
  if x_bd.ndim != 2 or train_nd.ndim != 2 or x_bd.shape[1] != train_nd.shape[1]:
    raise DataError(f"expected x (batch, dim) and train (n, dim) with the same dim, got {x_bd.shape} and "
                    f"{train_nd.shape}")
  if train_nd.shape[0] == 0:
    raise DataError("the training set is empty")


def _per_row(t, b):
  alpha, sigma2 = ou_coeffs(t)
  return jnp.broadcast_to(alpha, (b,)), jnp.broadcast_to(sigma2, (b,))


def _online_softmax(x_bd, alpha_b, sigma2_b, train_nd, chunk):
  """Running (max, normaliser, weighted sum) of logits a <x, x_i> / s2 - a^2 ||x_i||^2 / (2 s2) over chunks."""
  n, d = train_nd.shape
  chunk = max(1, min(int(chunk), n))
  pad = (-n) % chunk
  train = jnp.pad(train_nd, ((0, pad), (0, 0))).reshape(-1, chunk, d)
  valid = (jnp.arange(n + pad) < n).reshape(-1, chunk)
  a = (alpha_b / sigma2_b)[:, None]                      # (b, 1)
  q = (0.5 * alpha_b ** 2 / sigma2_b)[:, None]           # (b, 1)

  def body(carry, blk):
    m, l, acc = carry
    xi_cd, ok_c = blk
    s_bc = a * (x_bd @ xi_cd.T) - q * jnp.sum(xi_cd * xi_cd, -1)[None, :]
    s_bc = jnp.where(ok_c[None, :], s_bc, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s_bc, 1))
    p_bc = jnp.exp(s_bc - m_new[:, None])
    scale = jnp.exp(m - m_new)
    return (m_new, l * scale + jnp.sum(p_bc, 1), acc * scale[:, None] + p_bc @ xi_cd), None

  b = x_bd.shape[0]
  init = (jnp.full((b,), -jnp.inf, x_bd.dtype), jnp.zeros((b,), x_bd.dtype), jnp.zeros((b, d), x_bd.dtype))
  (m, l, acc), _ = jax.lax.scan(body, init, (train, valid))
  return m, l, acc


def _batched(fn, x_bd, alpha_b, sigma2_b, batch_chunk):
  """Applies fn(x, alpha, sigma2) -> pytree of (rows, ...) arrays in slices of batch_chunk rows."""
  b = x_bd.shape[0]
  if not batch_chunk or b <= batch_chunk:
    return fn(x_bd, alpha_b, sigma2_b)
  pad = (-b) % batch_chunk
  parts = [jnp.pad(v, ((0, pad),) + ((0, 0),) * (v.ndim - 1), constant_values=1.0).reshape(
      (-1, batch_chunk) + v.shape[1:]) for v in (x_bd, alpha_b, sigma2_b)]
  out = jax.lax.map(lambda args: fn(*args), tuple(parts))
  return jax.tree.map(lambda v: v.reshape((-1,) + v.shape[2:])[:b], out)


def kde_denoiser(x_bd: jax.Array, t, train_nd: jax.Array, *, chunk: int = 1024, batch_chunk: int = 0) -> jax.Array:
  """E[x_0 | x_t = x] when x_0 is uniform on the training set (the smoothed empirical measure's Tweedie mean).

  Args:
    x_bd: (batch, dim) float32 query points.
    t: scalar time or (batch,) times (> 0).
    train_nd: (n, dim) float32 training points.
    chunk: training points per scan step (memory O(batch x chunk)).
    batch_chunk: if > 0, process the batch in slices of this many rows.

  Returns:
    (batch, dim) float32 posterior means (convex combinations of training points).
  """
  _check(x_bd, train_nd)
  alpha_b, sigma2_b = _per_row(t, x_bd.shape[0])

  def fn(x, a, s2):
    _, l, acc = _online_softmax(x, a, s2, train_nd, chunk)
    return acc / l[:, None]
  return _batched(fn, x_bd, alpha_b, sigma2_b, batch_chunk)


def kde_score(x_bd: jax.Array, t, train_nd: jax.Array, *, chunk: int = 1024, batch_chunk: int = 0) -> jax.Array:
  """grad_x log p_hat_t(x) = (alpha_t E[x_0 | x] - x) / sigma_t^2, (batch, dim) float32 (see kde_denoiser)."""
  denoise = functools.partial(kde_denoiser, train_nd=train_nd, chunk=chunk, batch_chunk=batch_chunk)
  return score_from_denoiser(denoise)(x_bd, t)


def kde_log_density(x_bd: jax.Array, t, train_nd: jax.Array, *, chunk: int = 1024,
                    batch_chunk: int = 0) -> jax.Array:
  """log p_hat_t(x) = log (1/n) sum_i N(x; alpha_t x_i, sigma_t^2 I), (batch,) float32 (chunked, differentiable)."""
  _check(x_bd, train_nd)
  n, d = train_nd.shape
  alpha_b, sigma2_b = _per_row(t, x_bd.shape[0])

  def fn(x, a, s2):
    m, l, _ = _online_softmax(x, a, s2, train_nd, chunk)
    return (m + jnp.log(l) - jnp.sum(x * x, -1) / (2 * s2) - math.log(n)
            - 0.5 * d * jnp.log(2 * jnp.pi * s2))
  return _batched(fn, x_bd, alpha_b, sigma2_b, batch_chunk)


def score_from_denoiser(denoise: Denoiser) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """Tweedie: turns a denoiser (x, t) -> E[x_0 | x_t = x] into the score (x, t) -> grad log p_t(x)."""
  def score(x_bd, t):
    alpha, sigma2 = ou_coeffs(t)
    return (jnp.reshape(alpha, (-1, 1)) * denoise(x_bd, t) - x_bd) / jnp.reshape(sigma2, (-1, 1))
  return score


@dataclasses.dataclass(frozen=True)
class EmpiricalScore:
  """The closed-form score of the Gaussian-smoothed empirical measure of `train` (the score interface).

  Attributes:
    train: (n, dim) float32 training points (may be a traced array inside jit).
    chunk: training points per scan step.
    batch_chunk: query rows per slice (0: all at once).
  """
  train: jax.Array
  chunk: int = 1024
  batch_chunk: int = 0

  def denoise(self, x_bd: jax.Array, t) -> jax.Array:
    """E[x_0 | x_t = x], (batch, dim)."""
    return kde_denoiser(x_bd, t, self.train, chunk=self.chunk, batch_chunk=self.batch_chunk)

  def score(self, x_bd: jax.Array, t) -> jax.Array:
    """grad_x log p_hat_t(x), (batch, dim)."""
    return kde_score(x_bd, t, self.train, chunk=self.chunk, batch_chunk=self.batch_chunk)

  def log_density(self, x_bd: jax.Array, t) -> jax.Array:
    """log p_hat_t(x), (batch,)."""
    return kde_log_density(x_bd, t, self.train, chunk=self.chunk, batch_chunk=self.batch_chunk)
