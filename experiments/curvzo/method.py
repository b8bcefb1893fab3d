"""CurvZO experiment glue: the quadratic test problems, the estimator studies and the optimizer race.

The estimators and optimizers themselves live in the library (`jaxlab.zo`: SPSA, Horvitz-Thompson sparse
estimates, MeZO / sparse ZO / CurvZO; the z generator is the `jaxlab.kernels.zo_perturb` kernel). Here:

* `exactness`: on f(theta) = 1/2 (theta - theta*)' diag(h) (theta - theta*) the central difference is exact, so
  MeZO's projected gradient (L(theta + eps z) - L(theta - eps z)) / (2 eps) must equal z . grad f; and the
  in-place +eps / -2 eps / +eps round trip must give theta back.
* `ht_unbiasedness`: mean of g~ = Delta m z / pi over many keys vs grad f (HT) and vs pi * grad f (ht=False).
* `variance_study`: total variance of the HT block estimator for pi ~ sqrt(F), uniform pi and pi ~ F at equal
  budget, in Prop. 3.3's setting (each block's feedback independent of the other blocks' masks, so the second
  moment F is fixed), against the closed form; plus, report-only, the same for CurvZO's shared-Delta estimator.
* `race`: MeZO vs random-mask sparse ZO vs CurvZO (ht=False and HT) on a block-sparse quadratic at equal forward
  passes; each method's lr is chosen from a grid on a validation instance, then used on the test instance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import zo
from jaxlab.kernels import zo_perturb


# ------------------------------------------------------------------------------------------------ helpers

def _split_over_data(mesh, n: int):
  """NamedSharding putting a leading axis of size n on the mesh's "data" axis (replicated if it does not divide)."""
  if mesh is None:
    return None
  size = dict(mesh.shape).get("data", 1)
  return NamedSharding(mesh, P("data") if n % size == 0 else P())


def _put(x, sharding):
  return x if sharding is None else jax.device_put(x, sharding)


def quadratic(rng: np.random.Generator, d: int, sigma_h: float, dtype=np.float32):
  """A random quadratic: theta0, theta* ~ N(0, 1), log-normal curvatures h (sigma_h)."""
  h = np.exp(sigma_h * rng.standard_normal(d)).astype(dtype)
  theta0 = rng.standard_normal(d).astype(dtype)
  star = rng.standard_normal(d).astype(dtype)
  return theta0, h, star


def quad_loss(h, star):
  """loss(params, batch) = 1/2 sum h (w - w*)^2 on params {"w": (d,)}."""
  def loss(params, batch):
    del batch
    r = params["w"] - star
    return 0.5 * jnp.sum(h * r * r)
  return loss


# ------------------------------------------------------------------------------------------------ claim 1

def exactness(seed: int, d: int = 4096, n_keys: int = 128, eps: float = 1e-3) -> dict:
  """Relative error of MeZO's projected gradient vs z . grad f on a quadratic, float64 and float32.

  (Replicated, not split over devices: the float32 rounding noise it reports depends on the vectorisation.)

  Returns:
    {"exact/max_rel_err_f64", "exact/max_rel_err_f32", "exact/round_trip_err_xla", "exact/round_trip_err_interpret"}.
  """
  rng = np.random.default_rng(seed)
  theta0, h, star = quadratic(rng, d, 0.5, np.float64)
  seeds = rng.integers(0, 2 ** 32, n_keys, dtype=np.uint64).astype(np.uint32)
  out = {}
  for name, dtype, x64 in (("f64", np.float64, True), ("f32", np.float32, False)):
    with jax.enable_x64(x64):
      params = {"w": jnp.asarray(theta0, dtype)}
      hh, ss = jnp.asarray(h, dtype), jnp.asarray(star, dtype)
      loss = quad_loss(hh, ss)
      grads = {"w": hh * (params["w"] - ss)}

      def one(s):
        g_proj = zo.spsa(loss, params, None, s, eps, impl="xla")[0]
        return g_proj, zo.directional_derivative(grads, s, impl="xla")

      s_arr = jnp.asarray(seeds)
      g_proj, dd = jax.jit(jax.vmap(one))(s_arr)
      rel = np.abs(np.asarray(g_proj, np.float64) - np.asarray(dd, np.float64)) / np.abs(np.asarray(dd, np.float64))
      out[f"exact/max_rel_err_{name}"] = float(rel.max())
  out.update(round_trip(seed, d))
  return out


def round_trip(seed: int, d: int = 4096, eps: float = 1e-3) -> dict:
  """Max |theta - theta0| after in-place +eps, -2 eps, +eps perturbations (float32, donated buffers)."""
  theta0 = jnp.asarray(np.random.default_rng(seed + 7).standard_normal(d), jnp.float32)
  out = {}
  for impl in ("xla", "interpret"):
    f = jax.jit(lambda p, s, c, impl=impl: zo.perturb_params(p, s, c, impl=impl), donate_argnums=0)
    p = {"w": jnp.array(theta0)}
    s = jnp.uint32(seed + 1)
    for c in (eps, -2 * eps, eps):
      p = f(p, s, c)
    out[f"exact/round_trip_err_{impl}"] = float(jnp.max(jnp.abs(p["w"] - theta0)))
  return out


# ------------------------------------------------------------------------------------------------ claim 2

def ht_unbiasedness(seed: int, d: int = 8, n_blocks: int = 4, n_keys: int = 20480, density: float = 0.5,
                    pmin: float = 0.2, eps: float = 1e-3, mesh=None) -> dict:
  """Mean of CurvZO's sparse estimate over `n_keys` keys on a quadratic, with non-uniform pi ~ sqrt(F_b).

  Returns:
    {"ht/rel_err" (HT mean vs grad f), "ht/noht_rel_err_vs_pi_grad" (ht=False mean vs pi * grad f),
     "ht/noht_bias" (|pi * grad f - grad f| / |grad f|, what ht=False gets wrong), "ht/pi_min", "ht/pi_max"}.
  """
  rng = np.random.default_rng(seed + 1000)
  theta0, h, star = quadratic(rng, d, 1.0)
  params = {"w": jnp.asarray(theta0)}
  loss = quad_loss(jnp.asarray(h), jnp.asarray(star))
  grad = h * (theta0 - star)
  layout = zo.make_layout(params, d // n_blocks)
  fb = (grad.reshape(n_blocks, -1) ** 2).mean(1)
  pi = zo.optimal_inclusion_probs(jnp.asarray(fb), jnp.asarray(layout.sizes), density * d, pmin)

  def one(k):
    s = jax.random.bits(jax.random.fold_in(k, 1), (), jnp.uint32)
    m = zo.bernoulli_blocks(jax.random.fold_in(k, 0), pi)
    delta = zo.spsa(loss, params, None, s, eps, layout, m, impl="xla")[0]
    ht = zo.sparse_estimate(params, s, delta, layout, m, pi, ht=True, impl="xla")["w"]
    plain = zo.sparse_estimate(params, s, delta, layout, m, pi, ht=False, impl="xla")["w"]
    return ht, plain

  keys = _put(jax.random.split(jax.random.key(seed + 2000), n_keys), _split_over_data(mesh, n_keys))
  ht, plain = jax.jit(lambda k: jax.tree.map(lambda a: jnp.mean(a, 0), jax.vmap(one)(k)))(keys)
  pig = np.repeat(np.asarray(pi), d // n_blocks) * grad
  nrm = np.linalg.norm
  return {"ht/rel_err": float(nrm(np.asarray(ht) - grad) / nrm(grad)),
          "ht/noht_rel_err_vs_pi_grad": float(nrm(np.asarray(plain) - pig) / nrm(pig)),
          "ht/noht_bias": float(nrm(pig - grad) / nrm(grad)),
          "ht/pi_min": float(jnp.min(pi)), "ht/pi_max": float(jnp.max(pi))}


# ------------------------------------------------------------------------------------------------ claim 3

ALLOCATIONS = ("sqrt", "uniform", "linear")


def allocations(fb: np.ndarray, sizes: np.ndarray, density: float) -> dict[str, jax.Array]:
  """pi ~ sqrt(F) (water-filling), uniform, pi ~ F (water-filling on F^2), all with sum n_b pi_b = density d."""
  k = density * sizes.sum()
  fb, sz = jnp.asarray(fb, jnp.float32), jnp.asarray(sizes, jnp.float32)
  return {"sqrt": zo.optimal_inclusion_probs(fb, sz, k), "uniform": jnp.full(fb.shape, density, jnp.float32),
          "linear": zo.optimal_inclusion_probs(fb * fb, sz, k)}


def variance_study(seed: int, d: int = 4096, n_blocks: int = 64, n_keys: int = 8192, density: float = 0.1,
                   sigma: float = 1.5, chunk: int = 256, mesh=None) -> dict:
  """Empirical vs closed-form total variance of block HT estimators for three inclusion-probability rules.

  g = grad f at theta0 has signed log-normal entries (sigma). Fixed-F estimator (Prop. 3.3's setting): block b
  gets its own exact SPSA feedback Delta_b = z_b . g_b, so Y_i = Delta_b z_i has E[Y_i^2] = |g_b|^2 + 2 g_i^2
  whatever the masks; g~_i = m_b Y_i / pi_b. Closed form: sum_b (n_b + 2) |g_b|^2 / pi_b - |g|^2.
  The block second moment F_b = mean_{i in b} E[Y_i^2] = (1 + 2 / n_b) |g_b|^2 sets pi.
  Shared estimator (CurvZO's Def. 3.1, report only): Delta = sum_b m_b Delta_b, g~_i = Delta m_b z_i / pi_b.

  Returns:
    var/<rule>_emp, var/<rule>_closed, var/<rule>_shared_emp for rule in ALLOCATIONS, and the ratios
    var/sqrt_vs_uniform, var/sqrt_vs_linear, var/max_closed_form_err, var/shared_sqrt_vs_uniform.
  """
  rng = np.random.default_rng(seed + 3000)
  bsz = d // n_blocks
  g = (rng.choice([-1.0, 1.0], d) * np.exp(sigma * rng.standard_normal(d))).astype(np.float32)
  gb2 = (g.reshape(n_blocks, bsz) ** 2).sum(1)
  fb = (1.0 + 2.0 / bsz) * gb2 / bsz
  sizes = np.full(n_blocks, bsz, np.float32)
  gj = jnp.asarray(g).reshape(n_blocks, bsz)
  keys = jax.random.split(jax.random.key(seed + 4000), n_keys).reshape(n_keys // chunk, chunk)
  sh = _split_over_data(mesh, chunk)
  if sh is not None:
    keys = jax.device_put(keys, NamedSharding(mesh, P(None, *sh.spec)))
  out = {}

  @jax.jit
  def moments(keys, pi):
    def one(k):
      s = jax.random.bits(jax.random.fold_in(k, 1), (), jnp.uint32)
      m = zo.bernoulli_blocks(jax.random.fold_in(k, 0), pi)
      z = zo_perturb.normal((n_blocks, bsz), s)
      delta_b = jnp.sum(z * gj, axis=1)
      w = (m / pi)[:, None] * z
      return delta_b[:, None] * w, jnp.sum(m * delta_b) * w

    def body(acc, kc):
      fixed, shared = jax.vmap(one)(kc)
      return jax.tree.map(jnp.add, acc, (fixed.sum(0), (fixed * fixed).sum(0), shared.sum(0),
                                         (shared * shared).sum(0))), None
    zeros = jnp.zeros((n_blocks, bsz), jnp.float32)
    acc, _ = jax.lax.scan(body, (zeros, zeros, zeros, zeros), keys)
    return acc

  for name, pi in allocations(fb, sizes, density).items():
    s1, s2, t1, t2 = (np.asarray(a, np.float64) for a in moments(keys, pi))
    var = lambda a, b: float(np.sum(b / n_keys - (a / n_keys) ** 2) * n_keys / (n_keys - 1))  # noqa: E731
    p = np.asarray(pi, np.float64)
    out[f"var/{name}_emp"] = var(s1, s2)
    out[f"var/{name}_closed"] = float(np.sum((bsz + 2) * gb2 / p) - np.sum(gb2))
    out[f"var/{name}_shared_emp"] = var(t1, t2)
  out["var/sqrt_vs_uniform"] = out["var/sqrt_emp"] / out["var/uniform_emp"]
  out["var/sqrt_vs_linear"] = out["var/sqrt_emp"] / out["var/linear_emp"]
  out["var/sqrt_vs_best_other"] = max(out["var/sqrt_vs_uniform"], out["var/sqrt_vs_linear"])
  out["var/max_closed_form_err"] = max(abs(out[f"var/{a}_emp"] / out[f"var/{a}_closed"] - 1) for a in ALLOCATIONS)
  out["var/shared_sqrt_vs_uniform"] = out["var/sqrt_shared_emp"] / out["var/uniform_shared_emp"]
  return out


# ------------------------------------------------------------------------------------------------ claim 4

def block_sparse_instance(seed: int, d: int, n_blocks: int, n_relevant: int):
  """f(theta) = 1/2 |theta - theta*|^2 from theta0 = 0, theta* ~ N(0, 1) on `n_relevant` random blocks, else 0."""
  rng = np.random.default_rng(seed)
  bsz = d // n_blocks
  star = np.zeros(d, np.float32)
  for b in rng.choice(n_blocks, n_relevant, replace=False):
    star[b * bsz:(b + 1) * bsz] = rng.standard_normal(bsz)
  return star


METHODS = ("mezo", "sparse", "curvzo", "curvzo_ht")


def make_optimizer(method: str, params, lr, m) -> zo.ZOOptimizer:
  """An optimizer from config.method (`m`); `lr` may be traced or a schedule `step -> lr`."""
  sched = lr if callable(lr) else (lambda step: lr)
  common = dict(eps=m.eps, impl=m.impl)
  bs = "row" if m.row_blocks else m.block_size
  if method == "mezo":
    return zo.mezo(params, lr=sched, **common)
  if method == "sparse":
    return zo.sparse_zo(params, lr=sched, density=m.density, block_size=bs, **common)
  budget = zo.make_budget(m.budget, density=m.density, rho=m.rho, min_density=m.min_density,
                          max_density=m.max_density)
  return zo.curvzo(params, lr=sched, block_size=bs, budget_fn=budget, pmin=m.pmin, beta=m.beta,
                   warmup_steps=m.warmup_steps, ht=method == "curvzo_ht", exact_stats=m.exact_stats, **common)


def race(method: str, m, seed: int, instances: tuple[np.ndarray, np.ndarray], lrs, steps: int, log_every: int,
         repeats: int = 4, val_repeats: int = 2, mesh=None) -> dict:
  """Tunes `method`'s lr on a validation instance, then runs it on the test instance.

  Phase 1: every lr of the grid, `val_repeats` optimizer seeds each, on the validation instance; the lr with
  the lowest mean final f / f0 wins. Phase 2: that lr, `repeats` optimizer seeds, on the test instance; the
  reported final loss is their mean (each run is one noisy trajectory; averaging estimates its expectation).

  Args:
    method: one of METHODS.
    m: config.method.
    seed: run seed (optimizer seeds derive from it).
    instances: (validation theta*, test theta*).
    lrs: the learning-rate grid.
    steps: ZO steps (2 forward passes each).
    log_every: curve resolution.
    repeats, val_repeats: optimizer seeds per test / validation run.
    mesh: runs are spread over the "data" axis when their number divides it.

  Returns:
    {"lr", "val_final", "test_final", "test_std", "curve" (test, mean over repeats, f / f0 every log_every steps)}.
  """
  d = instances[0].shape[0]
  params = {"w": jnp.zeros((d,), jnp.float32)}

  def run(star, lr, opt_seed):
    loss = lambda p, b: 0.5 * jnp.sum(jnp.square(p["w"] - star))  # noqa: E731
    opt = make_optimizer(method, params, lr, m)
    f0 = loss(params, None)

    def chunk(carry, _):
      def body(c, _):
        p, st = c
        p, st, _ = opt.step(loss, p, st, None)
        return (p, st), None
      carry, _ = jax.lax.scan(body, carry, None, length=log_every)
      return carry, loss(carry[0], None) / f0
    _, curve = jax.lax.scan(chunk, (params, opt.init(opt_seed)), None, length=steps // log_every)
    return curve

  batched = jax.jit(jax.vmap(run))

  def many(star, lr_list, seeds):
    n = len(lr_list)
    sh = _split_over_data(mesh, n)
    args = (_put(jnp.asarray(np.broadcast_to(star, (n, d))), sh), _put(jnp.asarray(np.array(lr_list, np.float32)), sh),
            _put(jnp.asarray(np.array(seeds, np.uint32)), sh))
    out = np.asarray(batched(*args), np.float64)
    return np.where(np.isfinite(out), out, np.inf)

  grid = list(lrs)
  val = many(instances[0], [lr for lr in grid for _ in range(val_repeats)],
             [1000 * seed + 17 + r for _ in grid for r in range(val_repeats)])
  val_final = val[:, -1].reshape(len(grid), val_repeats).mean(1)
  best = int(np.argmin(val_final))
  test = many(instances[1], [grid[best]] * repeats, [1000 * seed + 900 + r for r in range(repeats)])
  return {"lr": float(grid[best]), "val_final": float(val_final[best]), "test_final": float(test[:, -1].mean()),
          "test_std": float(test[:, -1].std()), "curve": [float(x) for x in test.mean(0)]}
