"""Graph random features (GRFs): halting random walks whose loads estimate K_alpha(W) = sum_k alpha_k W^k.

Choromanski 2023 ("Taming graph kernels with graph random features") and Reid et al. 2023/24 (general /
universal GRFs). For each start node i, `n_walks` walks run in parallel. At every step a walk halts with
probability p_halt; otherwise it moves v -> u with proposal probability q(u | v) and its load is multiplied
by W(v, u) / ((1 - p_halt) q(u | v)) (importance weighting keeps the estimate unbiased for ANY proposal
whose support covers the edges). A walk deposits load * f(k) at the node it reaches after k steps (the start
node with k = 0, load 1), and phi(i) is the deposit sum divided by n_walks. Then for independent walk
ensembles E[phi(i) . phi'(j)] = sum_k (sum_{p+q=k} f(p) f(q)) (W^k)_ij = K_alpha(W)_ij whenever f * f = alpha
(discrete self-convolution: `modulation_from_alpha` deconvolves). Walks are truncated at `t_max` steps
(a bias of order p_halt^t_max * rho(W)^t_max, negligible for the settings used here).

Features are stored sparsely as (N, n_walks, t_max + 1) arrays of visited nodes and deposits, so
`K_hat @ v = Phi (Phi'^T v)` costs O(N n_walks t_max) and never forms an N x N matrix.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

StepFn = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def modulation_from_alpha(alpha) -> np.ndarray:
  """f with sum_{p=0}^{k} f(p) f(k - p) = alpha_k (f(0) = sqrt(alpha_0) > 0).

  Args:
    alpha: coefficients alpha_0..alpha_K of K_alpha(W) = sum_k alpha_k W^k (alpha_0 > 0).

  Returns:
    f_0..f_K as float64.
  """
  alpha = np.asarray(alpha, np.float64)
  if alpha[0] <= 0:
    raise ValueError(f"modulation_from_alpha: alpha_0 must be > 0, got {alpha[0]}")
  f = np.zeros_like(alpha)
  f[0] = np.sqrt(alpha[0])
  for k in range(1, len(alpha)):
    f[k] = (alpha[k] - np.dot(f[1:k], f[k - 1:0:-1])) / (2.0 * f[0])
  return f


def alpha_coefficients(kernel: str, order: int, beta: float = 1.0) -> np.ndarray:
  """alpha_0..alpha_order for a named kernel.

  "inverse_squared": K = (I - W)^-2, alpha_k = k + 1 (f = 1);  "inverse": K = (I - W)^-1, alpha_k = 1;
  "diffusion": K = exp(beta W), alpha_k = beta^k / k!.
  """
  k = np.arange(order + 1, dtype=np.float64)
  if kernel == "inverse_squared":
    return k + 1.0
  if kernel == "inverse":
    return np.ones_like(k)
  if kernel == "diffusion":
    from scipy.special import gammaln  # pylint: disable=g-import-not-at-top
    return np.exp(k * np.log(beta) - gammaln(k + 1.0))
  raise ValueError(f"unknown graph kernel {kernel!r}; use inverse_squared, inverse or diffusion")


def exact_kernel(w_nn: np.ndarray, kernel: str, beta: float = 1.0) -> np.ndarray:
  """Dense K_alpha(W) in float64 (evaluation on small graphs)."""
  w = np.asarray(w_nn, np.float64)
  eye = np.eye(len(w))
  if kernel == "inverse_squared":
    inv = np.linalg.inv(eye - w)
    return inv @ inv
  if kernel == "inverse":
    return np.linalg.inv(eye - w)
  if kernel == "diffusion":
    from scipy.linalg import expm  # pylint: disable=g-import-not-at-top
    return expm(beta * w)
  raise ValueError(f"unknown graph kernel {kernel!r}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class WalkFeatures:
  """Sparse GRFs: phi(i) = sum over walks w and steps k of values[i, w, k] * e_{nodes[i, w, k]}.

  Attributes:
    nodes: (N, n_walks, t_max + 1) int32 visited nodes (the start node at k = 0).
    values: (N, n_walks, t_max + 1) float32 deposits load * f(k) / n_walks (0 after a walk halted).
  """
  nodes: jax.Array
  values: jax.Array

  @property
  def n(self) -> int:
    return self.nodes.shape[0]

  def rmatvec(self, v_n: jax.Array) -> jax.Array:
    """Phi^T v (N,): scatter-add of v[i] * value into the visited nodes."""
    contrib = self.values * v_n[:, None, None]
    return jax.ops.segment_sum(contrib.reshape(-1), self.nodes.reshape(-1), num_segments=self.n)

  def matvec(self, w_n: jax.Array) -> jax.Array:
    """Phi w (N,): sum of value * w[node] per start node."""
    return jnp.sum(self.values * w_n[self.nodes], axis=(1, 2))

  def dense(self) -> jax.Array:
    """Phi as an (N, N) matrix (small graphs only: evaluation and tests)."""
    rows = jnp.broadcast_to(jnp.arange(self.n)[:, None, None], self.nodes.shape)
    return jnp.zeros((self.n, self.n), jnp.float32).at[rows, self.nodes].add(self.values)


def kernel_matvec(phi: WalkFeatures, phi2: WalkFeatures, v: jax.Array, symmetric: bool = True) -> jax.Array:
  """K_hat @ v in O(N n_walks t_max) time and O(N) extra memory, for v of shape (N,) or (N, c).

  K_hat = Phi Phi'^T from two independent ensembles, or its symmetrisation (Phi Phi'^T + Phi' Phi^T) / 2
  (also unbiased, lower variance; the default).
  """
  if v.ndim == 2:
    return jax.vmap(lambda col: kernel_matvec(phi, phi2, col, symmetric), in_axes=1, out_axes=1)(v)
  out = phi.matvec(phi2.rmatvec(v))
  return 0.5 * (out + phi2.matvec(phi.rmatvec(v))) if symmetric else out


def dense_estimate(phi: WalkFeatures, phi2: WalkFeatures, symmetric: bool = True) -> jax.Array:
  """K_hat as an (N, N) matrix (evaluation on small graphs only)."""
  a, b = phi.dense(), phi2.dense()
  k = a @ b.T
  return 0.5 * (k + k.T) if symmetric else k


def walker_uniforms(key: jax.Array, step: int | jax.Array, walker_ids: jax.Array, k: int) -> jax.Array:
  """(walkers, k) uniforms that depend only on (key, step, walker id): identical under any sharding."""
  base = jax.random.fold_in(key, step)
  return jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(base, i), (k,)))(walker_ids)


def run_walks(key: jax.Array, n_nodes: int, n_walks: int, t_max: int, p_halt: float, f_mod, step_fn: StepFn,
              walker_ids: jax.Array | None = None) -> WalkFeatures:
  """Runs halting walks from every node and returns their GRFs.

  Args:
    key: PRNG key of the ensemble (two ensembles need different keys).
    n_nodes: N (walks start at every node).
    n_walks: walks per node.
    t_max: maximum number of steps.
    p_halt: halting probability per step.
    f_mod: modulation f(0..t_max) (array-like, len >= t_max + 1).
    step_fn: `(key, cur (W,), load (W,)) -> (next (W,), load * W(cur, next) / ((1 - p_halt) q(next | cur)))`
      over the flattened walkers; its randomness must derive from `key` and the walker ids (see
      `walker_uniforms`) so that results do not depend on how walkers are split over devices.
    walker_ids: global ids of the walkers (default: 0..N*n_walks-1, start node = id // n_walks).

  Returns:
    WalkFeatures with arrays (N, n_walks, t_max + 1).
  """
  f = jnp.asarray(f_mod, jnp.float32)[: t_max + 1]
  if walker_ids is None:
    walker_ids = jnp.arange(n_nodes * n_walks, dtype=jnp.int32)
  start = (walker_ids // n_walks).astype(jnp.int32)
  load0 = jnp.ones(walker_ids.shape, jnp.float32)

  def step(carry, t):
    cur, load, alive = carry
    k_halt, k_move = jax.random.split(jax.random.fold_in(key, t))
    alive = alive & (walker_uniforms(k_halt, t, walker_ids, 1)[:, 0] >= p_halt)
    nxt, new_load = step_fn(jax.random.fold_in(k_move, t), cur, load)
    cur = jnp.where(alive, nxt, cur)
    load = jnp.where(alive, new_load, 0.0)
    return (cur, load, alive), (cur, load * f[t])

  _, (nodes, vals) = jax.lax.scan(step, (start, load0, jnp.ones(walker_ids.shape, bool)), jnp.arange(1, t_max + 1))
  nodes = jnp.concatenate([start[None], nodes], 0)           # (t_max + 1, W)
  vals = jnp.concatenate([load0[None] * f[0], vals], 0) / n_walks
  shape = (-1, n_walks, t_max + 1)
  return WalkFeatures(nodes=nodes.T.reshape(shape), values=vals.T.reshape(shape))


# ------------------------------------------------------------------- proposals on a materialised graph
# (baselines: they read rows of the dense W, O(N) per walker and step, and are not sharding-invariant)


def uniform_step(w_nn: jax.Array, p_halt: float) -> StepFn:
  """Classical GRF step on a materialised graph: a uniform neighbour (W > 0), q = 1 / deg(v)."""
  adj = w_nn > 0
  deg = jnp.maximum(jnp.sum(adj, axis=1), 1)
  logits = jnp.where(adj, 0.0, -jnp.inf)

  def step(key, cur, load):
    nxt = jax.random.categorical(key, logits[cur], axis=-1)
    return nxt, load * w_nn[cur, nxt] * deg[cur] / (1.0 - p_halt)
  return step


def oracle_step(w_nn: jax.Array, p_halt: float) -> StepFn:
  """Ideal importance sampling on a materialised graph: q(u | v) = W(v, u) / sum_u W(v, u)."""
  rowsum = jnp.sum(w_nn, axis=1)
  logw = jnp.log(jnp.maximum(w_nn, 1e-30)) + jnp.where(w_nn > 0, 0.0, -jnp.inf)

  def step(key, cur, load):
    nxt = jax.random.categorical(key, logw[cur], axis=-1)
    return nxt, load * rowsum[cur] / (1.0 - p_halt)
  return step


@functools.partial(jax.jit, static_argnames=("proposal", "n_walks", "t_max", "p_halt"))
def materialised_features(key: jax.Array, w_nn: jax.Array, f_mod: jax.Array, *, proposal: str, n_walks: int,
                          t_max: int, p_halt: float) -> WalkFeatures:
  """GRFs on a materialised graph with the "uniform" (classical) or "oracle" (q ~ W) proposal (jitted)."""
  if proposal not in ("uniform", "oracle"):
    raise ValueError(f"proposal={proposal!r}: use uniform or oracle")
  step = (uniform_step if proposal == "uniform" else oracle_step)(w_nn, p_halt)
  return run_walks(key, w_nn.shape[0], n_walks, t_max, p_halt, f_mod, step)
