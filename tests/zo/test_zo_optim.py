"""ZO optimizers: MeZO against a numpy reference, two forwards per step, sparse masks, HT unbiasedness against
the closed-form variance, sharded == unsharded, in-place memory, config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import zo
from jaxlab.errors import ConfigError
from jaxlab.kernels import zo_perturb


def _problem(d_w=(12, 8), seed=0):
  rng = np.random.default_rng(seed)
  params = {"b": jnp.asarray(rng.standard_normal(d_w[1]), jnp.float32),
            "w": jnp.asarray(rng.standard_normal(d_w), jnp.float32)}
  x = jnp.asarray(rng.standard_normal((16, d_w[0])), jnp.float32)
  y = jnp.asarray(rng.standard_normal((16, d_w[1])), jnp.float32)

  def loss(p, batch):
    xb, yb = batch
    return jnp.mean(jnp.square(jnp.tanh(xb @ p["w"] + p["b"]) - yb))
  return params, (x, y), loss


def _np_loss(p, batch):
  xb, yb = (np.asarray(a, np.float64) for a in batch)
  return np.mean((np.tanh(xb @ p["w"] + p["b"]) - yb) ** 2)


def test_mezo_step_matches_a_numpy_reference_of_mezo():
  params, batch, loss = _problem()
  lr, eps, wd = 0.05, 1e-3, 0.1
  opt = zo.mezo(params, lr=lr, eps=eps, weight_decay=wd, impl="xla")
  state = opt.init(3)
  seed = int(jax.jit(opt.prepare)(state)["seed"])
  p64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
  offs = zo_perturb.leaf_offsets(params)          # leaves in flatten order: b, w
  z = {"b": np.asarray(zo_perturb.normal((8,), seed, offs[0]), np.float64),
       "w": np.asarray(zo_perturb.normal((12, 8), seed, offs[1]), np.float64)}
  lp = _np_loss({k: p64[k] + eps * z[k] for k in p64}, batch)
  lm = _np_loss({k: p64[k] - eps * z[k] for k in p64}, batch)
  g = (lp - lm) / (2 * eps)
  want = {"b": p64["b"] - lr * g * z["b"],                         # no decay on 1-D leaves (MeZO: biases, norms)
          "w": p64["w"] - lr * (g * z["w"] + wd * p64["w"])}
  for fused in (True, False):
    step = zo.make_step(opt, loss, fused=fused, donate=False)
    new, st, m = step(params, state, batch)
    assert float(m["projected_grad"]) == pytest.approx(g, rel=2e-3, abs=2e-3)
    for k in want:
      np.testing.assert_allclose(np.asarray(new[k]), want[k], rtol=2e-4, atol=2e-5)
    assert int(st.step) == 1


def test_every_step_makes_exactly_two_forward_passes():
  params, batch, loss = _problem()
  calls = []

  def counting_loss(p, b):
    calls.append(1)
    return loss(p, b)
  for opt in (zo.mezo(params, lr=0.1, impl="xla"), zo.sparse_zo(params, lr=0.1, density=0.5, block_size=8, impl="xla"),
              zo.curvzo(params, lr=0.1, block_size=8, impl="xla")):
    calls.clear()
    jax.jit(lambda p, s, b, opt=opt: opt.step(counting_loss, p, s, b)).trace(params, opt.init(0), batch)
    assert len(calls) == 2, opt.name


def test_sparse_steps_touch_only_selected_blocks_and_curvzo_learns():
  params, batch, loss = _problem()
  opt = zo.curvzo(params, lr=0.05, block_size=8, warmup_steps=0, budget_fn=zo.fixed_budget(0.3), pmin=0.05,
                  impl="xla")
  state = opt.init(1)
  ctx = jax.jit(opt.prepare)(state)
  new, state2, m = zo.make_step(opt, loss, donate=False)(params, state, batch)
  flat_old = np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(params)])
  flat_new = np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(new)])
  lay = opt.layout
  sel = np.repeat(np.asarray(ctx["mask"]) > 0, lay.sizes.astype(int))
  assert sel.any() and (~sel).any()
  np.testing.assert_array_equal(flat_new[~sel], flat_old[~sel])
  assert np.all(flat_new[sel] != flat_old[sel])
  assert np.all(np.asarray(state2.count) == np.asarray(ctx["mask"]))
  assert zo.state_size(state2) == 2 + 2 * lay.num_blocks + 1   # step, key (2), signal, count
  step = zo.make_step(opt, loss)
  p, s = jax.tree.map(jnp.array, params), opt.init(0)
  first = None
  for _ in range(300):
    p, s, m = step(p, s, batch)
    first = float(m["loss"]) if first is None else first
  assert float(m["loss"]) < 0.8 * first


def test_ht_estimator_is_unbiased_with_the_closed_form_variance():
  """mean of g~ over N keys: sum_i (mean_i - g_i)^2 / (Var_i / N) ~ d (chi-square scale) with the hand-derived
  Var_i = (A - pi_b |g_b|^2 + |g_b|^2 + 2 g_i^2) / pi_b - g_i^2, A = sum_c pi_c |g_c|^2 (Gaussian z, Bernoulli m)."""
  d, nb, n = 64, 8, 8192
  rng = np.random.default_rng(0)
  g = rng.standard_normal(d).astype(np.float32) * np.repeat(np.exp(rng.standard_normal(nb)), d // nb).astype(np.float32)
  params = {"w": jnp.zeros((d,), jnp.float32)}
  loss = lambda p, b: jnp.vdot(p["w"], jnp.asarray(g))  # noqa: E731  (linear: SPSA is exact)
  lay = zo.make_layout(params, d // nb)
  pi = jnp.asarray(np.linspace(0.2, 0.9, nb), jnp.float32)

  def one(k, ht):
    s = jax.random.bits(jax.random.fold_in(k, 1), (), jnp.uint32)
    m = zo.bernoulli_blocks(jax.random.fold_in(k, 0), pi)
    delta = zo.spsa(loss, params, None, s, 1e-2, lay, m, impl="xla")[0]
    return zo.sparse_estimate(params, s, delta, lay, m, pi, ht=ht, impl="xla")["w"]
  keys = jax.random.split(jax.random.key(1), n)
  est = {ht: np.asarray(jax.jit(jax.vmap(lambda k, ht=ht: one(k, ht)))(keys), np.float64) for ht in (True, False)}
  gb2 = (g.reshape(nb, -1).astype(np.float64) ** 2).sum(1)
  p = np.asarray(pi, np.float64)
  A = (p * gb2).sum()
  var = ((A - p * gb2 + gb2)[:, None] + 2 * g.reshape(nb, -1) ** 2) / p[:, None] - g.reshape(nb, -1) ** 2
  t = np.sum((est[True].mean(0) - g) ** 2 / (var.ravel() / n))
  assert 0.5 * d < t < 1.7 * d                                    # unbiased, and the variance formula holds
  np.testing.assert_allclose(est[True].var(0).sum() / var.sum(), 1.0, atol=0.08)
  t_plain = np.sum((est[False].mean(0) - g) ** 2 / (var.ravel() / n))
  assert t_plain > 8 * d                                          # ht=False is biased towards pi * g


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_sharded_parameters_give_the_same_step():
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  params, batch, loss = _problem((16, 8))
  sh = {"b": NamedSharding(mesh, P("model")), "w": NamedSharding(mesh, P("data", "model"))}
  # eps = 0.1: the projected gradient divides loss differences by 2 eps, which would amplify the (legitimately
  # different) summation order of the sharded loss at MeZO's eps = 1e-3.
  placed = jax.device_put(params, sh)
  for make in (lambda p: zo.mezo(p, lr=0.05, eps=0.1, impl="xla"),
               lambda p: zo.curvzo(p, lr=0.05, eps=0.1, block_size=8, warmup_steps=1, impl="xla")):
    a = make(params)
    b = make(placed)          # records the leaves' shardings
    assert a.shardings is None and b.shardings == sh
    pa, sa, pb, sb = params, a.init(0), placed, b.init(0)
    step_a = jax.jit(lambda p, s, a=a: a.step(loss, p, s, batch))
    step_b = jax.jit(lambda p, s, b=b: b.step(loss, p, s, batch))
    for _ in range(3):
      pa, sa, _ = step_a(pa, sa)
      pb, sb, _ = step_b(pb, sb)
    for k in params:
      np.testing.assert_allclose(np.asarray(pb[k]), np.asarray(pa[k]), rtol=1e-5, atol=1e-6)
      assert pb[k].sharding.spec == sh[k].spec


def _peak(compiled):
  m = compiled.memory_analysis()
  return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes


def test_steps_update_in_place_without_a_z_buffer():
  d = 1 << 20
  params = {"a": jax.ShapeDtypeStruct((d,), jnp.float32), "b": jax.ShapeDtypeStruct((512, 256), jnp.float32)}
  batch = jax.ShapeDtypeStruct((8, 512), jnp.float32)
  loss = lambda p, x: jnp.sum(jnp.cos(p["a"])) + jnp.sum(jnp.tanh(x @ p["b"]))  # noqa: E731
  fwd = _peak(jax.jit(loss).lower(params, batch).compile())
  nbytes = 4 * (d + 512 * 256)
  opt = zo.mezo(params, lr=1e-3, impl="xla")
  st = jax.eval_shape(lambda: opt.init(0))
  fused = zo.make_step(opt, loss).lower(params, st, batch).compile()
  assert fused.memory_analysis().alias_size_in_bytes >= nbytes           # params and state donated
  assert _peak(fused) <= fwd + 0.5 * nbytes                              # no stored z (it would add nbytes)
  split = zo.make_step(opt, loss, fused=False).programs
  ctx = jax.eval_shape(opt.prepare, st)
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  peaks = [_peak(split["plus"].lower(params, ctx).compile()), _peak(split["minus"].lower(params, ctx).compile()),
           _peak(split["loss"].lower(params, batch).compile()),
           _peak(split["finish"].lower(params, st, ctx, scalar, scalar).compile())]
  assert max(peaks) <= 1.01 * fwd                                        # MeZO's structure: a forward's memory


def test_bad_arguments_are_clear_errors():
  params, _, _ = _problem()
  with pytest.raises(ConfigError, match="learning rate"):
    zo.mezo(params, lr=-1.0)
  with pytest.raises(ConfigError, match="eps"):
    zo.mezo(params, lr=0.1, eps=0.0)
  with pytest.raises(ConfigError, match="density"):
    zo.sparse_zo(params, lr=0.1, density=1.5)
  with pytest.raises(ConfigError, match="pmin"):
    zo.curvzo(params, lr=0.1, pmin=2.0)
  with pytest.raises(ConfigError, match="beta"):
    zo.curvzo(params, lr=0.1, beta=1.0)
  with pytest.raises(ConfigError, match="decay_mask"):
    zo.mezo(params, lr=0.1, decay_mask=[True])
