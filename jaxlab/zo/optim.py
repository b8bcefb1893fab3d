"""Zeroth-order optimizers with one interface: MeZO, random-mask sparse ZO and CurvZO.

    opt = curvzo(params, lr=1e-2, eps=1e-3, block_size=20, budget_fn=fixed_budget(0.1), ht=False)
    state = opt.init(seed)                              # ZOState: step, key, O(#blocks) statistics
    step = make_step(opt, loss_fn)                      # jitted, params and state donated
    params, state, metrics = step(params, state, batch)

`loss_fn(params, batch) -> scalar`. Every step makes exactly two forward passes, like MeZO's `zo_step`:

    seed = bits(fold_in(key, step));  m ~ Bernoulli(pi) per block (dense: m = 1)
    theta <- theta + eps m z            L+ = L(theta)           (in place: theta is donated)
    theta <- theta - 2 eps m z          L- = L(theta)
    Delta = (L+ - L-) / (2 eps)
    theta <- (1 - lr wd) [theta + (eps m - lr Delta w / (1 - lr wd)) z]      restore and update in one pass
        w = m / pi (HT) or m (ht=False, and MeZO / sparse by default);  wd only on `decay_mask` leaves

so the update equals MeZO's restore-then-`zo_update` (theta - lr (Delta z + wd theta)) in exact arithmetic
while touching the parameters three times instead of four. z is regenerated from the seed each time (the
"seed trick"). The three passes are the iterations of one `fori_loop` whose carry is the parameters, so XLA
updates them in place, orders each forward before the next pass and regenerates z in each pass instead of
storing it. Nothing parameter-sized is stored: the state is O(#blocks).

CurvZO (arXiv 2603.21725; see experiments/curvzo/README.md for what is confirmed vs reconstructed):

    S_b <- beta S_b + (1 - beta) Delta^2 mean_{i in b} z_i^2      for the selected blocks (online curvature)
    S^_b = S_b / (1 - beta^{n_b})  (bias-corrected EMA; unseen blocks get the mean of the seen ones)
    k = budget_fn(S^, sizes);   pi = clip(c sqrt(S^), pi_min, 1) with sum_b n_b pi_b = k   (water-filling)

with `warmup_steps` dense MeZO steps first (pi = 1; they initialise S). `sparse_zo` is the same step with a
uniform pi = density (random-mask sparse ZO); `mezo` is the dense step.

Sharded parameters: an optimizer records the NamedSharding of each leaf of the `params` it is built from
(concrete arrays already placed on the mesh, or ShapeDtypeStructs carrying a sharding), so that inside the
jitted step every pass perturbs each leaf shard by shard (`jaxlab.kernels.zo_perturb`, bit-identical to the
unsharded step) and `make_step` keeps the parameters' shardings. Build it from the placed parameters; no
sharding argument is needed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from jaxlab.errors import ConfigError
from jaxlab.zo import blocks as blocks_lib
from jaxlab.zo.estimators import LossFn, perturb_params

Schedule = Callable[[jax.Array], jax.Array]
METHODS = ("mezo", "sparse", "curvzo")


@flax.struct.dataclass
class ZOState:
  """Optimizer state (a pytree of small arrays).

  Attributes:
    step: int32, completed steps.
    key: uint32 raw key data of the run's base key (step keys are fold_in(key, step)).
    signal: (num_blocks,) float32 curvature EMA S (CurvZO; empty for the others).
    count: (num_blocks,) float32 number of EMA updates of each block.
  """
  step: jax.Array
  key: jax.Array
  signal: jax.Array
  count: jax.Array


@dataclasses.dataclass(frozen=True)
class ZOOptimizer:
  """A zeroth-order optimizer.

  Attributes:
    name: "mezo" | "sparse" | "curvzo".
    init: `seed or key -> ZOState`.
    step: `(loss_fn, params, state, batch) -> (params, state, metrics)`, pure and jittable; two forward passes.
    layout: the block layout (None for MeZO).
    shardings: NamedShardings of the parameter leaves it was built from (a pytree like the params), or None
      when they were not placed on a mesh.
    prepare, perturb_pass, finish: the pieces of `step` (`make_step(..., fused=False)` jits them separately).
  """
  name: str
  init: Callable[[Any], ZOState]
  step: Callable[[LossFn, Any, ZOState, Any], tuple[Any, ZOState, dict]]
  layout: blocks_lib.BlockLayout | None
  shardings: Any = None
  prepare: Callable[[ZOState], dict] | None = None
  perturb_pass: Callable[[Any, dict, float], Any] | None = None
  finish: Callable[..., tuple[Any, ZOState, dict]] | None = None


def default_decay_mask(params: Any) -> list[bool]:
  """Weight decay on matrices only: MeZO skips biases and LayerNorm weights (here: leaves with ndim < 2)."""
  return [jnp.ndim(x) >= 2 for x in jax.tree_util.tree_leaves(params)]


def param_shardings(params: Any) -> Any:
  """The NamedShardings of the leaves of `params` (a pytree like it) when every leaf has one, else None.

  Concrete arrays placed on a mesh and ShapeDtypeStructs built with `sharding=` have one; host arrays,
  single-device arrays and plain ShapeDtypeStructs do not.
  """
  leaves, treedef = jax.tree_util.tree_flatten(params)
  shs = [getattr(x, "sharding", None) for x in leaves]
  if not leaves or not all(isinstance(sh, NamedSharding) for sh in shs):
    return None
  return jax.tree_util.tree_unflatten(treedef, shs)


def _as_schedule(lr) -> Schedule:
  if callable(lr):
    return lr
  if not (isinstance(lr, (int, float)) and lr > 0):
    raise ConfigError(f"ZO learning rate must be positive, got {lr!r}")
  return lambda step: jnp.asarray(lr, jnp.float32)


def _build(name: str, params: Any, *, lr, eps: float, weight_decay: float, decay_mask, block_size, probs_fn,
           ht: bool, curvature: bool, beta: float, warmup_steps: int, exact_stats: bool, impl: str,
           warmup_lr_scale: Any = 1.0) -> ZOOptimizer:
  if not eps > 0:
    raise ConfigError(f"ZO eps must be positive, got {eps!r}")
  if weight_decay < 0:
    raise ConfigError(f"ZO weight_decay must be >= 0, got {weight_decay!r}")
  schedule = _as_schedule(lr)
  shardings = param_shardings(params)
  decay = list(decay_mask) if decay_mask is not None else default_decay_mask(params)
  n_leaves = len(jax.tree_util.tree_leaves(params))
  if len(decay) != n_leaves:
    raise ConfigError(f"decay_mask has {len(decay)} entries for {n_leaves} parameter leaves")
  layout = None if probs_fn is None else blocks_lib.make_layout(params, block_size)
  nb = 0 if layout is None else layout.num_blocks
  offsets = None
  sizes = None if layout is None else jnp.asarray(layout.sizes)
  if layout is not None:
    from jaxlab.kernels.zo_perturb import leaf_offsets  # pylint: disable=g-import-not-at-top
    offsets = leaf_offsets(params)
  stat_blocks = nb if curvature else 0

  def init(seed_or_key) -> ZOState:
    key = seed_or_key if isinstance(seed_or_key, jax.Array) and jnp.issubdtype(seed_or_key.dtype, jax.dtypes.prng_key) \
        else jax.random.key(seed_or_key)
    return ZOState(step=jnp.zeros((), jnp.int32), key=jax.random.key_data(key),
                   signal=jnp.zeros((stat_blocks,), jnp.float32), count=jnp.zeros((stat_blocks,), jnp.float32))

  def prepare(state: ZOState) -> dict:
    """Per-step randomness and scalars: seed, lr, block probabilities pi, mask m, update weights w."""
    key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.step)
    ctx = {"seed": jax.random.bits(jax.random.fold_in(key, 1), (), jnp.uint32),
           "lr": jnp.asarray(schedule(state.step), jnp.float32)}
    if layout is not None:
      pi = probs_fn(state)
      if warmup_steps:
        pi = jnp.where(state.step < warmup_steps, jnp.ones_like(pi), pi)
      mask = blocks_lib.bernoulli_blocks(jax.random.fold_in(key, 0), pi)
      if warmup_steps:  # dense warm-up steps take the step size of a dense method: lr * (expected density)
        scale = warmup_lr_scale() if callable(warmup_lr_scale) else warmup_lr_scale
        ctx["lr"] = jnp.where(state.step < warmup_steps, ctx["lr"] * scale, ctx["lr"])
      ctx.update(pi=pi, mask=mask, w=mask / pi if ht else mask)
    return ctx

  def perturb_pass(p, ctx, sign):
    """theta + sign * eps * (m *) z (sign +1 for the first probe, -2 for the second)."""
    if layout is None:
      return perturb_params(p, ctx["seed"], sign * eps, shardings=shardings, impl=impl)
    return perturb_params(p, ctx["seed"], sign * eps, layout, ctx["mask"], shardings=shardings, impl=impl)

  def finish(p, state: ZOState, ctx, l_plus, l_minus):
    """Restore + update in one pass, weight decay, curvature statistics, metrics."""
    seed, lr_t = ctx["seed"], ctx["lr"]
    g = (l_plus - l_minus) / (2.0 * eps)
    keep = [1.0 - lr_t * weight_decay if d and weight_decay else None for d in decay]
    if layout is None:
      scales = [eps - lr_t * g / (1.0 if k is None else k) for k in keep]
      p = perturb_params(p, seed, None, leaf_scales=scales, shardings=shardings, impl=impl)
    else:
      w = ctx["w"]
      if any(k is not None for k in keep):
        w = w / jnp.stack([jnp.asarray(1.0 if k is None else k, jnp.float32) for k in keep])[layout.block_of_leaf()]
      p = perturb_params(p, seed, 1.0, layout, eps * ctx["mask"] - lr_t * g * w, shardings=shardings, impl=impl)
    if any(k is not None for k in keep):
      leaves, treedef = jax.tree_util.tree_flatten(p)
      leaves = [x if k is None else (x * k).astype(x.dtype) for x, k in zip(leaves, keep)]
      p = jax.tree_util.tree_unflatten(treedef, leaves)
    signal, count = state.signal, state.count
    metrics = {"loss": 0.5 * (l_plus + l_minus), "projected_grad": g, "lr": lr_t}
    if layout is not None:
      mask, pi = ctx["mask"], ctx["pi"]
      metrics["density"] = jnp.sum(sizes * mask) / layout.dim
      metrics["expected_density"] = jnp.sum(sizes * pi) / layout.dim
      if curvature:
        if exact_stats:
          s = g * g * blocks_lib.block_sumsq_z(layout, seed, offsets) / sizes
        else:
          s = jnp.broadcast_to(g * g, signal.shape)
        signal = jnp.where(mask > 0, beta * signal + (1.0 - beta) * s, signal)
        count = count + mask
    return p, state.replace(step=state.step + 1, signal=signal, count=count), metrics

  def step(loss_fn: LossFn, params, state: ZOState, batch):
    ctx = prepare(state)
    # Each later pass must (i) run after the forward before it (in-place update) and (ii) regenerate z instead
    # of XLA merging the three identical z computations into one stored, parameter-sized z (CSE). Both are
    # forced by making the seed data-dependent on the loss just computed: `seed + isnan(L)` equals seed for
    # any finite loss, and XLA cannot fold `L != L` for floats. (A NaN loss would change z, but then the
    # update is NaN anyway and the training loop stops on it.)
    p = perturb_pass(params, ctx, 1.0)
    l_plus = loss_fn(p, batch).astype(jnp.float32)
    p, l_plus = jax.lax.optimization_barrier((p, l_plus))
    ctx = {**ctx, "seed": ctx["seed"] + (l_plus != l_plus).astype(jnp.uint32)}
    p = perturb_pass(p, ctx, -2.0)
    l_minus = loss_fn(p, batch).astype(jnp.float32)
    p, l_minus = jax.lax.optimization_barrier((p, l_minus))
    ctx = {**ctx, "seed": ctx["seed"] + (l_minus != l_minus).astype(jnp.uint32)}
    return finish(p, state, ctx, l_plus, l_minus)

  return ZOOptimizer(name=name, init=init, step=step, layout=layout, shardings=shardings, prepare=prepare,
                     perturb_pass=perturb_pass, finish=finish)


def mezo(params: Any, *, lr, eps: float = 1e-3, weight_decay: float = 0.0, decay_mask=None,
         impl: str = "auto") -> ZOOptimizer:
  """MeZO / ZO-SGD (Malladi et al. 2023): dense SPSA, seed trick, MeZO's weight-decay rule.

  Args:
    params: the parameter pytree (or its ShapeDtypeStructs): fixes the leaf order, offsets and the leaf
      shardings (see the module docstring).
    lr: learning rate (float) or schedule `step -> lr`.
    eps: perturbation scale.
    weight_decay: decoupled decay, applied as theta - lr (Delta z + wd theta) to `decay_mask` leaves.
    decay_mask: per-leaf bools (flatten order); default: leaves with ndim >= 2.
    impl: zo_perturb impl.
  """
  return _build("mezo", params, lr=lr, eps=eps, weight_decay=weight_decay, decay_mask=decay_mask, block_size=None,
                probs_fn=None, ht=False, curvature=False, beta=0.0, warmup_steps=0, exact_stats=False, impl=impl)


def sparse_zo(params: Any, *, lr, density: float, block_size=1024, eps: float = 1e-3, ht: bool = False,
              weight_decay: float = 0.0, decay_mask=None, impl: str = "auto") -> ZOOptimizer:
  """Random-mask sparse ZO: every block is perturbed with probability `density` (uniform, resampled each step).

  With `ht=True` the update is divided by the density (unbiased); the default follows sparse-ZO practice
  (no rescaling). Other arguments as in `mezo` / `curvzo`.
  """
  if not 0.0 < density <= 1.0:
    raise ConfigError(f"sparse_zo density must be in (0, 1], got {density!r}")
  layout = blocks_lib.make_layout(params, block_size)
  const = jnp.full((layout.num_blocks,), density, jnp.float32)
  return _build("sparse", params, lr=lr, eps=eps, weight_decay=weight_decay, decay_mask=decay_mask,
                block_size=block_size, probs_fn=lambda state: const, ht=ht, curvature=False, beta=0.0,
                warmup_steps=0, exact_stats=False, impl=impl)


def curvzo(params: Any, *, lr, block_size=1024, budget_fn: blocks_lib.BudgetFn | None = None, pmin: float = 0.05,
           beta: float = 0.9, warmup_steps: int = 10, ht: bool = True, eps: float = 1e-3, exact_stats: bool = True,
           weight_decay: float = 0.0, decay_mask=None, impl: str = "auto",
           warmup_lr_scale: float | None = None) -> ZOOptimizer:
  """CurvZO: curvature-guided Bernoulli block masks (see the module docstring).

  Args:
    params: parameter pytree (fixes leaf order, offsets, the block layout and the leaf shardings).
    lr: learning rate or schedule.
    block_size: "row" or elements per block.
    budget_fn: `(S, sizes) -> k` expected perturbed coordinates (default `fixed_budget(0.1)`).
    pmin: inclusion-probability floor.
    beta: EMA factor of the curvature signal.
    warmup_steps: dense MeZO steps first (they initialise S).
    warmup_lr_scale: lr multiplier of the warm-up steps (default: the budget's initial density k / d, so a
      dense step is as large as a dense method's would be at this lr * density).
    ht: Horvitz-Thompson weights 1 / pi in the update (unbiased) or not (pi-preconditioned).
    eps: perturbation scale.
    exact_stats: use mean_{i in b} z_i^2 of the drawn z in the block statistic (regenerated, fused); False uses
      its expectation 1 (cheaper on very large models).
    weight_decay, decay_mask, impl: as in `mezo`.
  """
  if not 0.0 <= pmin <= 1.0:
    raise ConfigError(f"curvzo pmin must be in [0, 1], got {pmin!r}")
  if not 0.0 <= beta < 1.0:
    raise ConfigError(f"curvzo beta must be in [0, 1), got {beta!r}")
  if warmup_steps < 0:
    raise ConfigError(f"curvzo warmup_steps must be >= 0, got {warmup_steps!r}")
  budget_fn = budget_fn or blocks_lib.fixed_budget(0.1)
  layout = blocks_lib.make_layout(params, block_size)
  sizes = jnp.asarray(layout.sizes)

  def probs(state: ZOState):
    seen = state.count > 0
    debiased = state.signal / jnp.where(seen, 1.0 - beta ** state.count, 1.0)
    n_seen = jnp.sum(seen)
    fill = jnp.where(n_seen > 0, jnp.sum(jnp.where(seen, debiased, 0.0)) / jnp.maximum(n_seen, 1), 1.0)
    s_hat = jnp.where(seen, debiased, fill)
    return blocks_lib.optimal_inclusion_probs(s_hat, sizes, budget_fn(s_hat, sizes), pmin)

  if warmup_lr_scale is None:
    warmup_lr_scale = lambda: budget_fn(jnp.ones_like(sizes), sizes) / layout.dim  # noqa: E731
  return _build("curvzo", params, lr=lr, eps=eps, weight_decay=weight_decay, decay_mask=decay_mask,
                block_size=block_size, probs_fn=probs, ht=ht, curvature=True, beta=beta,
                warmup_steps=warmup_steps, exact_stats=exact_stats, impl=impl, warmup_lr_scale=warmup_lr_scale)


def make_step(opt: ZOOptimizer, loss_fn: LossFn, *, donate: bool = True, fused: bool = True):
  """The optimizer step `(params, state, batch) -> (params, state, metrics)` with params and state donated.

  Args:
    opt: the optimizer.
    loss_fn: `(params, batch) -> scalar loss`.
    donate: donate params and state (in-place update).
    fused: one `jax.jit` program for the whole step (default), or MeZO's structure: the passes over the
      parameters and the two forwards as separate jitted programs (`prepare`, `perturb` +eps, `loss`,
      `perturb` -2 eps, `loss`, `finish`). The math is the same. XLA lets a donated parameter buffer hold only
      the step's final value, so inside one program it keeps the perturbed copies of some parameters in
      temporary buffers (about +15% of the parameters on the CPU memory test); the split step updates every
      buffer in place and peaks at a forward pass's memory.

  The parameters keep the shardings the optimizer recorded (`opt.shardings`) on output.

  Returns:
    The step function; `step.programs` lists the jitted programs (for memory analysis).
  """
  psh = opt.shardings
  out_sh = {} if psh is None else {"out_shardings": (psh, None, None)}
  if fused:
    fn = jax.jit(lambda params, state, batch: opt.step(loss_fn, params, state, batch),
                 donate_argnums=(0, 1) if donate else (), **out_sh)
    fn.programs = {"step": fn}
    return fn
  prep = jax.jit(opt.prepare)
  p_kw = {} if psh is None else {"out_shardings": psh}
  plus = jax.jit(lambda p, ctx: opt.perturb_pass(p, ctx, 1.0), donate_argnums=(0,) if donate else (), **p_kw)
  minus = jax.jit(lambda p, ctx: opt.perturb_pass(p, ctx, -2.0), donate_argnums=(0,) if donate else (), **p_kw)
  loss = jax.jit(lambda p, batch: loss_fn(p, batch).astype(jnp.float32))
  finish = jax.jit(opt.finish, donate_argnums=(0, 1) if donate else (), **out_sh)

  def step(params, state, batch):
    ctx = prep(state)
    params = plus(params, ctx)
    l_plus = loss(params, batch)
    params = minus(params, ctx)
    l_minus = loss(params, batch)
    return finish(params, state, ctx, l_plus, l_minus)

  step.programs = {"prepare": prep, "plus": plus, "minus": minus, "loss": loss, "finish": finish}
  return step


def state_size(state: ZOState) -> int:
  """Number of floats in the optimizer state (O(#blocks))."""
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state)))
