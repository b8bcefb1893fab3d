"""SWING: Space Walks for Implicit Network Graphs (Manenti, Dubey, Sehanobish, Alippi, Choromanski;
ICML 2026, arXiv 2602.12703). GRFs on an i-graph without materialising it.

RECONSTRUCTED (the paper's body was not accessible; see experiments/swing/README.md): the walk proposes
the next node from a random-feature linearisation of the edge weight, W(x, y) ~ phi(x).phi(y) with m
positive random features of a Gaussian kernel (importance-sampled frequencies with temperature sigma2),
so that q(u | v) = phi(x_v).phi(x_u) / phi(x_v).S, S = sum_u phi(x_u), costs O(m) per step after an
O(N m) precomputation: the step draws a feature by Gumbel-max over log phi_r(x_v) + log S_r, then a node
from that feature's distribution phi_r(x_u) / S_r (inverse CDF), mixed with a uniform node (defensive
mixing, weight 1 - lam) so that importance weights stay bounded. The load is updated with the TRUE
implicit weight W(x_v, x_u) (O(d)), so the GRF estimator stays unbiased whatever the quality of the
features; the features only set the variance. For step-function graphs (eps, smooth_step) the proposal
linearises a Gaussian surrogate of bandwidth `proposal_bandwidth` (the proposal need not equal W).

The fused step is `jaxlab.kernels.gumbel_rf.walk_step` (Pallas kernel on GPU). `relaxed_step` is the
Gumbel-softmax "space walk": a differentiable move of a continuous point to a convex combination of the
features' node centroids.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxlab import mesh as mesh_lib
from jaxlab.features import gaussian_omegas, log_positive_features
from jaxlab.graphs import grf
from jaxlab.graphs.igraph import IGraph
from jaxlab.kernels import gumbel_rf


@dataclasses.dataclass
class SwingTables:
  """Precomputed O(N m) components of the RF proposal.

  Attributes:
    log_phi: (N, m) log random features of the nodes.
    log_s: (m,) log sum_u phi(x_u).
    cdf: (m, N) per-feature CDF over nodes.
    centroids: (m, d) per-feature node centroids sum_u p_r(u) x_u (for the relaxed walk).
    omega: (m, d) frequencies; log_w: (m,) their log importance weights; bandwidth: proposal bandwidth;
      center: (d,) the point the features are centred at.
  """
  log_phi: jax.Array
  log_s: jax.Array
  cdf: jax.Array
  centroids: jax.Array
  omega: jax.Array
  log_w: jax.Array
  bandwidth: float
  center: jax.Array


def precompute(key: jax.Array, x_nd: jax.Array, bandwidth: float, m: int, sigma2: float = 1.0,
               orthogonal: bool = True) -> SwingTables:
  """Random features of all nodes and the per-feature node distributions (O(N m) time and memory).

  Args:
    key: PRNG key of the frequencies.
    x_nd: (N, d) node features.
    bandwidth: length scale of the Gaussian kernel the proposal linearises.
    m: number of random features.
    sigma2: importance-sampling temperature of the frequencies.
    orthogonal: block-orthogonal frequencies.
  """
  omega, log_w = gaussian_omegas(key, m, x_nd.shape[1], sigma2, orthogonal)
  # The Gaussian kernel depends on differences only, so the features are computed on centred points:
  # positive features' variance grows like exp(||x||^2), and centring makes the norms as small as possible.
  center = jnp.mean(x_nd, axis=0)
  log_phi = log_positive_features((x_nd - center) / bandwidth, omega, log_w)
  log_s = jax.nn.logsumexp(log_phi, axis=0)
  p = jnp.exp(log_phi - log_s[None, :]).T                                       # (m, N)
  cdf = jnp.cumsum(p, axis=1)
  cdf = cdf / cdf[:, -1:]
  return SwingTables(log_phi=log_phi, log_s=log_s, cdf=cdf, centroids=p @ x_nd, omega=omega, log_w=log_w,
                     bandwidth=float(bandwidth), center=center)


def swing_step(graph: IGraph, tables: SwingTables, x_nd: jax.Array, seed: int, *, lam: float, p_halt: float,
               impl: str = "auto") -> grf.StepFn:
  """The GRF step function that proposes with the RF-linearised kernel (fused kernel `gumbel_rf`).

  The walk engine passes `(key, cur, load)`; the step number is folded into `key`, so here the hash counter
  `step` is derived from it (the kernel's bits depend only on (seed, step, walker id)).
  """
  kw = dict(kind=graph.kind, bandwidth=graph.bandwidth, eps=graph.eps, sharpness=graph.sharpness,
            scale=graph.scale, lam=lam, p_halt=p_halt)

  def step(key, cur, load, walker_ids):
    ctr = jax.random.bits(key, (), jnp.uint32)
    nxt, new_load, _, _ = gumbel_rf.walk_step(cur, load, walker_ids, jnp.uint32(seed), ctr, tables.log_phi,
                                              tables.log_s, tables.cdf, x_nd, impl=impl, **kw)
    return nxt, new_load
  return step


def swing_features(key: jax.Array, x_nd: jax.Array, graph: IGraph, f_mod, *, n_walks: int, t_max: int,
                   p_halt: float, m: int, sigma2: float = 1.0, lam: float = 0.8,
                   proposal_bandwidth: float | None = None, impl: str = "auto",
                   orthogonal: bool = True, node_chunk: int = 0) -> grf.WalkFeatures:
  """SWING GRFs of every node: (N, n_walks, t_max + 1) sparse features, no N x N array anywhere (jitted;
  one compilation per distinct static setting).

  With a multi-device mesh in context (`jaxlab.mesh.use`), the walkers are split over the mesh axes of
  logical "batch" with `jax.shard_map` when N divides by their size (otherwise they run unsharded); the
  result is identical to the unsharded run, since all randomness is a function of the walker id.

  Args:
    key: PRNG key (features and walks); two independent ensembles need two keys.
    x_nd: (N, d) node features.
    graph: the i-graph (true weights in the load).
    f_mod: modulation function f(0..t_max) (`grf.modulation_from_alpha`).
    n_walks, t_max, p_halt: walk ensemble.
    m, sigma2, orthogonal: random features of the proposal.
    lam: defensive mixing weight of the RF proposal (1 - lam uniform).
    proposal_bandwidth: bandwidth of the Gaussian the proposal linearises (default: the RBF bandwidth,
      or eps / 2 for step graphs).
    impl: kernel impl ("auto", "xla", "pallas", "interpret").
    node_chunk: walk the nodes' walkers `node_chunk` nodes at a time (`lax.map` over chunks; per device when
      sharded), so that the walk's temporaries (proposal weights over m, per walker and step) are those of one
      chunk; 0: all at once. The features are bit-identical for every chunk size, since all randomness is a
      function of the walker id.
  """
  return _swing_features(key, x_nd, graph, f_mod, n_walks=n_walks, t_max=t_max, p_halt=p_halt, m=m,
                         sigma2=sigma2, lam=lam, proposal_bandwidth=proposal_bandwidth, impl=impl,
                         orthogonal=orthogonal, walker_axes=_walker_axes(x_nd.shape[0]), node_chunk=int(node_chunk))


def _walker_axes(n: int) -> str | tuple[str, ...] | None:
  """Mesh axes (of the context) to split N nodes' walkers over: those of logical "batch" when N divides."""
  return mesh_lib.dividing_axes("batch", n)


@functools.partial(jax.jit, static_argnames=("graph", "n_walks", "t_max", "p_halt", "m", "sigma2", "lam",
                                             "proposal_bandwidth", "impl", "orthogonal", "walker_axes", "node_chunk"))
def _swing_features(key, x_nd, graph, f_mod, *, n_walks, t_max, p_halt, m, sigma2, lam, proposal_bandwidth,
                    impl, orthogonal, walker_axes, node_chunk=0):
  n = x_nd.shape[0]
  walks_of, operands = _ensemble(key, x_nd, graph, f_mod, n_walks=n_walks, t_max=t_max, p_halt=p_halt, m=m,
                                 sigma2=sigma2, lam=lam, proposal_bandwidth=proposal_bandwidth, impl=impl,
                                 orthogonal=orthogonal)

  def walks(walker_ids, *operands):
    nodes = walker_ids.shape[0] // n_walks
    if not node_chunk or node_chunk >= nodes:
      return walks_of(walker_ids, *operands)
    chunks = -(-nodes // node_chunk)
    pad = chunks * node_chunk * n_walks - walker_ids.shape[0]    # padded with copies of real walkers, dropped after
    ids = jnp.concatenate([walker_ids, walker_ids[:pad]]) if pad else walker_ids
    out = jax.lax.map(lambda i: dataclasses.astuple(walks_of(i, *operands)), ids.reshape(chunks, -1))
    return grf.WalkFeatures(*(a.reshape((-1,) + a.shape[2:])[:nodes] for a in out))

  ids = jnp.arange(n * n_walks, dtype=jnp.int32)
  if walker_axes is None:
    return walks(ids, *operands)
  spec = P(walker_axes)
  out = jax.shard_map(lambda i, *o: dataclasses.astuple(walks(i, *o)), mesh=mesh_lib.current_mesh(),
                      in_specs=(spec,) + (P(),) * len(operands), out_specs=(spec, spec), check_vma=False)(ids, *operands)
  return grf.WalkFeatures(*out)


def _ensemble(key, x_nd, graph, f_mod, *, n_walks, t_max, p_halt, m, sigma2, lam, proposal_bandwidth, impl,
              orthogonal):
  """(walks_of, operands) of one ensemble: `walks_of(walker_ids, *operands)` -> the WalkFeatures of those walkers
  (their randomness a function of the ids alone). Everything the walks read is an explicit operand: a shard_map
  body must not close over arrays of the auto-sharded outer program."""
  n = x_nd.shape[0]
  k_feat, k_walk, k_seed = jax.random.split(key, 3)
  bw = proposal_bandwidth or (graph.bandwidth if graph.kind == "rbf" else graph.eps / 2.0)
  tables = precompute(k_feat, x_nd, bw, m, sigma2, orthogonal)
  seed = jax.random.bits(k_seed, (), jnp.uint32)

  def walks_of(walker_ids, log_phi, log_s, cdf, x_nd, k_walk, seed, f_mod):
    t = dataclasses.replace(tables, log_phi=log_phi, log_s=log_s, cdf=cdf)
    step = swing_step(graph, t, x_nd, seed, lam=lam, p_halt=p_halt, impl=impl)
    return grf.run_walks(k_walk, n, n_walks, t_max, p_halt, f_mod,
                         lambda k, c, l: step(k, c, l, walker_ids), walker_ids=walker_ids)

  operands = (tables.log_phi, tables.log_s, tables.cdf, x_nd, k_walk, seed, jnp.asarray(f_mod, jnp.float32))
  return walks_of, operands


def swing_kernel_matvec(key: jax.Array, x_nd: jax.Array, graph: IGraph, f_mod, v: jax.Array, *, n_walks: int,
                        t_max: int, p_halt: float, m: int, sigma2: float = 1.0, lam: float = 0.8,
                        proposal_bandwidth: float | None = None, impl: str = "auto", orthogonal: bool = True,
                        node_chunk: int = 1024, symmetric: bool = True) -> jax.Array:
  """K_hat v for v of shape (N,) without keeping the features: O(N + node_chunk x n_walks x t_max) memory.

  Equals `grf.kernel_matvec(swing_features(k1, ...), swing_features(k2, ...), v, symmetric)` with
  `k1, k2 = jax.random.split(key)` (the same walks; sums in another order, so up to float rounding). Each
  ensemble is walked twice, chunk by chunk: once to scatter Phi^T v, once to gather Phi (Phi'^T v), so it takes
  about twice the time of building the features. Runs unsharded (a mesh in context is not used).
  """
  return _swing_kernel_matvec(key, x_nd, graph, jnp.asarray(f_mod, jnp.float32), v, n_walks=n_walks, t_max=t_max,
                              p_halt=p_halt, m=m, sigma2=sigma2, lam=lam, proposal_bandwidth=proposal_bandwidth,
                              impl=impl, orthogonal=orthogonal, node_chunk=int(node_chunk), symmetric=symmetric)


@functools.partial(jax.jit, static_argnames=("graph", "n_walks", "t_max", "p_halt", "m", "sigma2", "lam",
                                             "proposal_bandwidth", "impl", "orthogonal", "node_chunk", "symmetric"))
def _swing_kernel_matvec(key, x_nd, graph, f_mod, v, *, n_walks, t_max, p_halt, m, sigma2, lam, proposal_bandwidth,
                         impl, orthogonal, node_chunk, symmetric):
  n = x_nd.shape[0]
  chunk = max(1, min(node_chunk, n))
  chunks = -(-n // chunk)
  starts = jnp.arange(chunks * chunk, dtype=jnp.int32).reshape(chunks, chunk)      # start nodes (padded)
  real = starts < n
  starts = jnp.where(real, starts, 0)
  ids = (starts[:, :, None] * n_walks + jnp.arange(n_walks, dtype=jnp.int32)).reshape(chunks, -1)
  kw = dict(n_walks=n_walks, t_max=t_max, p_halt=p_halt, m=m, sigma2=sigma2, lam=lam,
            proposal_bandwidth=proposal_bandwidth, impl=impl, orthogonal=orthogonal)
  ens = [_ensemble(k, x_nd, graph, f_mod, **kw) for k in jax.random.split(key)]

  def rmatvec(walks_of, operands, w):
    def body(acc, chunk_in):
      i, s, ok = chunk_in
      f = walks_of(i, *operands)
      contrib = f.values * jnp.where(ok, w[s], 0.0)[:, None, None]
      return acc + jax.ops.segment_sum(contrib.reshape(-1), f.nodes.reshape(-1), num_segments=n), None
    return jax.lax.scan(body, jnp.zeros((n,), jnp.float32), (ids, starts, real))[0]

  def matvec(walks_of, operands, y):
    def body(_, i):
      f = walks_of(i, *operands)
      return None, jnp.sum(f.values * y[f.nodes], axis=(1, 2))
    return jax.lax.scan(body, None, ids)[1].reshape(-1)[:n]

  (wa, oa), (wb, ob) = ens
  out = matvec(wa, oa, rmatvec(wb, ob, v))
  return 0.5 * (out + matvec(wb, ob, rmatvec(wa, oa, v))) if symmetric else out


def relaxed_step(key: jax.Array, point_bd: jax.Array, tables: SwingTables, tau: float = 0.5) -> jax.Array:
  """Gumbel-softmax space walk: move continuous points to convex combinations of feature centroids.

  The feature logits at a point p are log phi_r(p) + log S_r (the same as the hard step's); a
  Gumbel-softmax sample y (temperature tau) over features moves the point to sum_r y_r c_r, where
  c_r = sum_u p_r(u) x_u. As tau -> 0 the expected move equals the hard proposal's expected next point
  (without the defensive mixture). Differentiable in the point and the tables. (Reconstructed from the
  paper's abstract: "walks in continuous spaces" with "Gumbel-softmax sampling".)

  Args:
    key: PRNG key.
    point_bd: (B, d) current points.
    tables: SWING tables from `precompute`.
    tau: Gumbel-softmax temperature.

  Returns:
    (B, d) next points.
  """
  logits = (log_positive_features((point_bd - tables.center) / tables.bandwidth, tables.omega, tables.log_w)
            + tables.log_s[None, :])
  g = jax.random.gumbel(key, logits.shape)
  y = jax.nn.softmax((logits + g) / tau, axis=-1)
  return y @ tables.centroids
