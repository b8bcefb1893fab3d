"""The experiment's pure pieces: per-stage data, sampling with a score model, and the stage's metrics.

A stage is one (score, setting (D, k, M), n). Its randomness derives from the seed, the setting index and the
n index only (not the score), so the KDE and the DSM score see the same bases, training set, fresh test set,
start noise and sampler noise:

    bases  = random_subspaces(rng(seed, i, 0))                (M, D, k)      i = setting index, j = n index
    train  = sample_union(rng(seed, i, 10 j + 1), n)          the n training points
    fresh  = sample_union(rng(seed, i, 10 j + 2), n)          n fresh points from p_data (W1 reference)
    x_T    = N(0, I) from rng(seed, i, 10 j + 3)              (n, D) start of the reverse process
    keys   = jax.random.key(rng(seed, i, 10 j + 4 / 5 / 6))   sampler noise, DSM training, sliced-W1 directions

Metrics: W1(generated, fresh) and the baseline W1(train, fresh) (exact, POT; entropic ott-jax above
`eval.exact_max` points), sliced W1 of both, mean distance of the generated points to the nearest subspace and
the largest deviation of the subspace-assignment frequencies from 1/M.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import mesh as mesh_lib
from jaxlab.diffusion import data as data_lib
from jaxlab.diffusion import dsm, metrics, ou, samplers
from jaxlab.diffusion.score import EmpiricalScore, score_from_denoiser


def stage_data(config, setting_idx: int, n_idx: int) -> dict:
  """Bases, training set, fresh set, start noise and keys of one stage (see module docstring)."""
  d, k, m = (int(v) for v in config.data.settings[setting_idx])
  n = int(config.data.ns[n_idx])
  rng = lambda i: np.random.default_rng([int(config.seed), setting_idx, i])  # noqa: E731
  base = 10 * n_idx
  bases = data_lib.random_subspaces(rng(0), d, k, m)
  train, _ = data_lib.sample_union(rng(base + 1), bases, n, config.data.coords)
  fresh, _ = data_lib.sample_union(rng(base + 2), bases, n, config.data.coords)
  x_t = rng(base + 3).standard_normal((n, d)).astype(np.float32)
  key = lambda i: jax.random.key(int(rng(base + i).integers(2 ** 31)))  # noqa: E731
  return dict(d=d, k=k, m=m, n=n, bases=jnp.asarray(bases), train=jnp.asarray(train), fresh=jnp.asarray(fresh),
              x_T=jnp.asarray(x_t), sampler_key=key(4), dsm_key=key(5), sliced_key=key(6))


@functools.partial(jax.jit, static_argnames=("build", "sampler", "steps", "t_max", "t_min", "final_denoise"))
def _sample(params, x_bd, key, *, build, sampler, steps, t_max, t_min, final_denoise):
  model = build(params)
  grid = ou.geometric_grid(t_max, t_min, steps)
  if sampler == "exponential":
    return samplers.exponential_integrator(model.denoise, x_bd, grid, key, final_denoise=final_denoise)
  return samplers.euler_maruyama(score_from_denoiser(model.denoise), x_bd, grid, key,
                                 denoise=model.denoise if final_denoise else None)


@functools.lru_cache(maxsize=None)
def _kde_builder(chunk: int, batch_chunk: int):
  return lambda train: EmpiricalScore(train, chunk=chunk, batch_chunk=batch_chunk)


def generate(config, params, build, x_bd, key) -> np.ndarray:
  """Runs the configured reverse sampler from x_bd with the score model build(params).

  The generated batch is split over the data axes of the mesh in context (`jaxlab.mesh.current_mesh()`, logical
  axis "batch") when their size divides n (rows are independent); the score's parameters are replicated.

  Returns:
    (n, D) float32 numpy samples.
  """
  mesh = mesh_lib.current_mesh()
  if mesh is not None and x_bd.shape[0] % mesh_lib.data_split(mesh) == 0:
    x_bd = jax.device_put(x_bd, mesh_lib.batch_sharding(mesh))
    params = jax.device_put(params, mesh_lib.replicated(mesh))
  mc = config.method
  out = _sample(params, x_bd, key, build=build, sampler=mc.sampler, steps=int(mc.steps), t_max=float(mc.t_max),
                t_min=float(mc.t_min), final_denoise=bool(mc.final_denoise))
  return np.asarray(jax.device_get(out))


def generate_kde(config, st: dict) -> np.ndarray:
  """Samples n points with the closed-form empirical (KDE) score of the stage's training set."""
  build = _kde_builder(int(config.method.chunk), int(config.method.batch_chunk))
  return generate(config, st["train"], build, st["x_T"], st["sampler_key"])


def generate_dsm(config, st: dict) -> tuple[np.ndarray, float]:
  """Trains the DSM score network on the stage's training set and samples n points with it.

  Returns:
    (samples (n, D), final training loss (mean of the last 100 steps)).
  """
  lc = config.learned
  model, losses = dsm.train_dsm(st["dsm_key"], st["train"], width=int(lc.width), depth=int(lc.depth),
                                steps=int(lc.steps), batch=int(lc.batch), learning_rate=float(lc.learning_rate),
                                t_min=float(config.method.t_min), t_max=float(config.method.t_max))
  build = _dsm_builder(model.graphdef)
  return generate(config, model.state, build, st["x_T"], st["sampler_key"]), float(np.mean(losses[-100:]))


@functools.lru_cache(maxsize=16)
def _dsm_builder(graphdef):
  return lambda state: dsm.LearnedScore(graphdef, state)


def w1(config, a, b) -> float:
  """Exact W1 (POT) up to eval.exact_max points per set, entropic (ott-jax Sinkhorn) beyond."""
  if max(len(a), len(b)) <= config.eval.exact_max:
    return metrics.w1_exact(a, b)
  return metrics.w1_sinkhorn(a, b, epsilon=float(config.eval.sinkhorn_epsilon))


@functools.partial(jax.jit, static_argnames=("projections",))
def _jax_metrics(gen, train, fresh, bases, key, *, projections):
  dist, idx = metrics.nearest_subspace(gen, bases)
  return (metrics.sliced_w1(key, gen, fresh, projections), metrics.sliced_w1(key, train, fresh, projections),
          jnp.mean(dist), idx)


def stage_metrics(config, st: dict, gen: np.ndarray) -> dict:
  """W1 / sliced W1 of generated and training sets against the fresh set, and closeness to the union."""
  fresh, train = np.asarray(st["fresh"]), np.asarray(st["train"])
  out = {"w1_gen": w1(config, gen, fresh), "w1_train": w1(config, train, fresh)}
  sw_gen, sw_train, dist, idx = _jax_metrics(jnp.asarray(gen), st["train"], st["fresh"], st["bases"],
                                             st["sliced_key"], projections=int(config.eval.projections))
  freq = metrics.assignment_frequencies(idx, st["m"])
  out.update(sw1_gen=float(sw_gen), sw1_train=float(sw_train), union_dist=float(dist),
             freq_dev=float(np.max(np.abs(freq - 1.0 / st["m"]))))
  out["w1_ratio"] = out["w1_gen"] / out["w1_train"]
  return out
