"""Implicit graphs (i-graphs): edge weights W(x_i, x_j) = f(x_i, x_j) computed from node features on demand.

Weight functions (`kind`):
  rbf          scale * exp(-||x - y||^2 / (2 bandwidth^2))
  eps          scale * 1[||x - y|| <= eps]                     (epsilon-neighbourhood graph)
  smooth_step  scale * sigmoid((eps - ||x - y||) / sharpness)  (a smooth surrogate of `eps`)
Self-loops are excluded (W_ii = 0). Nothing here forms an N x N matrix except `materialise`, which the
baselines use and which refuses sizes that would not fit in memory.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxlab.errors import ConfigError

KINDS = ("rbf", "eps", "smooth_step")


@dataclasses.dataclass(frozen=True)
class IGraph:
  """An implicit graph over node features x (N, d).

  Attributes:
    kind: "rbf" | "eps" | "smooth_step".
    bandwidth: RBF length scale h.
    eps: radius of the epsilon-neighbourhood (eps, smooth_step).
    sharpness: width of the smooth step's sigmoid.
    scale: global weight multiplier (e.g. set so that the spectral radius of W is below 1).
  """
  kind: str = "rbf"
  bandwidth: float = 1.0
  eps: float = 1.0
  sharpness: float = 0.1
  scale: float = 1.0

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ConfigError(f"i-graph kind={self.kind!r} is not one of {KINDS}")
    if min(self.bandwidth, self.eps, self.sharpness) <= 0 or self.scale < 0:
      raise ConfigError(f"i-graph parameters must be positive, got {self}")

  def weight(self, x_bd: jax.Array, y_bd: jax.Array) -> jax.Array:
    """W(x, y) for paired rows: (..., d), (..., d) -> (...). Self-loops are not excluded here."""
    sq = jnp.sum((x_bd - y_bd) ** 2, axis=-1)
    return self.scale * self.profile(sq)

  def profile(self, sq_dist: jax.Array) -> jax.Array:
    """The unscaled weight as a function of the squared distance."""
    if self.kind == "rbf":
      return jnp.exp(-sq_dist / (2.0 * self.bandwidth ** 2))
    dist = jnp.sqrt(jnp.maximum(sq_dist, 0.0))
    if self.kind == "eps":
      return (dist <= self.eps).astype(jnp.float32)
    return jax.nn.sigmoid((self.eps - dist) / self.sharpness)

  def with_scale(self, scale: float) -> "IGraph":
    return dataclasses.replace(self, scale=float(scale))


def check_fits(n: int, max_bytes: float = 2 ** 30) -> None:
  """Raises ConfigError when a dense N x N float32 weight matrix would exceed `max_bytes`."""
  need = 4.0 * n * n
  if need > max_bytes:
    raise ConfigError(f"materialising the i-graph needs an {n} x {n} matrix ({need / 2**30:.1f} GiB > "
                      f"{max_bytes / 2**30:.1f} GiB allowed); use the SWING path, which never forms it, or "
                      "raise max_bytes")


def materialise(graph: IGraph, x_nd: jax.Array, max_bytes: float = 2 ** 30) -> jax.Array:
  """The dense weight matrix W (N, N) with a zero diagonal (baselines and evaluation only).

  Raises:
    ConfigError: when N x N float32 would exceed `max_bytes` (default 1 GiB); SWING needs no such matrix.
  """
  n = x_nd.shape[0]
  check_fits(n, max_bytes)
  sq = jnp.sum((x_nd[:, None, :] - x_nd[None, :, :]) ** 2, axis=-1)
  return graph.scale * graph.profile(sq) * (1.0 - jnp.eye(n, dtype=jnp.float32))


def matvec(graph: IGraph, x_nd: jax.Array, v_n: jax.Array, chunk: int = 1024) -> jax.Array:
  """W @ v in O(N^2 d) time and O(N * chunk) memory (rows computed chunk by chunk)."""
  n = x_nd.shape[0]
  pad = (-n) % chunk
  xp = jnp.pad(x_nd, ((0, pad), (0, 0)))
  idx = jnp.arange(n + pad)

  def rows(i):
    xs = jax.lax.dynamic_slice_in_dim(xp, i * chunk, chunk)
    ids = jax.lax.dynamic_slice_in_dim(idx, i * chunk, chunk)
    sq = jnp.sum((xs[:, None, :] - x_nd[None, :, :]) ** 2, axis=-1)
    w = graph.scale * graph.profile(sq) * (ids[:, None] != jnp.arange(n)[None, :])
    return w @ v_n

  out = jax.lax.map(rows, jnp.arange((n + pad) // chunk))
  return out.reshape(-1)[:n]


def spectral_radius(graph: IGraph, x_nd: jax.Array, iters: int = 100, chunk: int = 1024) -> jax.Array:
  """Largest eigenvalue of the (symmetric, nonnegative) W by power iteration on implicit mat-vecs."""
  v = jnp.ones((x_nd.shape[0],), jnp.float32) / jnp.sqrt(x_nd.shape[0])

  def body(_, v):
    w = matvec(graph, x_nd, v, chunk)
    return w / jnp.linalg.norm(w)

  v = jax.lax.fori_loop(0, iters, body, v)
  return jnp.dot(v, matvec(graph, x_nd, v, chunk))


def normalise(graph: IGraph, x_nd: jax.Array, rho: float, iters: int = 100) -> IGraph:
  """The same graph with `scale` set so that the spectral radius of W equals `rho`."""
  lam = float(spectral_radius(graph.with_scale(1.0), x_nd, iters))
  return graph.with_scale(rho / lam)
