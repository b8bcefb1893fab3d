"""Selective scan: one shared contract run once per impl, plus independent checks of the reference.

Tolerances: float32 forward rtol = atol = 1e-5, bf16 inputs max relative error <= 1e-2, gradients of every
input max relative error <= 1e-4 (float32).
"""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxlab import mesh as mesh_lib
from jaxlab.kernels.selective_scan import BlockSizes, reference, selective_scan

SMALL = BlockSizes(block_d=16, chunk=32, sub_chunk=8, block_d_bwd=32)
SHAPES = [(2, 64, 128, 16), (1, 200, 256, 8), (1, 37, 40, 5)]  # incl. odd length / dim / state
# (with_z, with_D, with_bias, softplus, last_state): each switch on and off at least once.
OPTIONS = [(True, True, True, True, True), (False, False, False, False, False), (True, False, True, False, True),
           (False, True, False, True, False)]


def make_inputs(b, l, d, n, dtype=jnp.float32, softplus=True, seed=0):
  k = jax.random.split(jax.random.key(seed), 8)
  raw = 0.5 * jax.random.normal(k[1], (b, l, d))
  delta = raw if softplus else jax.nn.softplus(raw) + 1.0  # step sizes stay > 0 (after the bias) unfused
  return dict(
      u=jax.random.normal(k[0], (b, l, d)).astype(dtype), delta=delta.astype(dtype),
      A=-jnp.exp(0.5 * jax.random.normal(k[2], (d, n))), B=jax.random.normal(k[3], (b, l, n)).astype(dtype),
      C=jax.random.normal(k[4], (b, l, n)).astype(dtype), D=jax.random.normal(k[5], (d,)),
      z=jax.random.normal(k[6], (b, l, d)).astype(dtype), delta_bias=0.3 * jax.random.normal(k[7], (d,)))


def pick(x, with_z, with_D, with_bias):
  return dict(x, z=x["z"] if with_z else None, D=x["D"] if with_D else None,
              delta_bias=x["delta_bias"] if with_bias else None)


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# Every (shape, options) pair. A Pallas kernel only branches on (with_z, softplus) (D and delta_bias become zeros,
# the last state is always computed), and OPTIONS holds all four of those; so a Pallas impl runs every option at
# the odd shape (padding in length, dim and state) and two kernel variants (z + softplus, neither) at the
# aligned and the many-chunk shapes: every kernel variant and every padding case, in 8 programs instead of 12.
ALL_CASES = tuple((shape, opts) for shape in SHAPES for opts in OPTIONS)
PALLAS_CASES = (tuple((SHAPES[2], opts) for opts in OPTIONS)
                + tuple((shape, OPTIONS[i]) for shape in SHAPES[:2] for i in (0, 1)))


def pytest_generate_tests(metafunc):
  """The contract's forward and gradient tests run the (shape, options) pairs of their class's FORWARD_CASES
  and GRAD_CASES."""
  cases = {"test_forward_float32": "FORWARD_CASES", "test_gradients_match_reference": "GRAD_CASES"}
  if metafunc.cls is not None and metafunc.function.__name__ in cases:
    metafunc.parametrize("shape,opts", list(getattr(metafunc.cls, cases[metafunc.function.__name__])), ids=str)


class SelectiveScanContract:
  """What every impl must satisfy; subclasses set IMPL (and BLOCKS for the Pallas ones)."""
  IMPL = None
  BLOCKS = None
  GRADS = True
  FORWARD_CASES = ALL_CASES
  GRAD_CASES = (((2, 64, 128, 16), OPTIONS[0]), ((1, 37, 40, 5), OPTIONS[1]))

  def run(self, x, softplus, last):
    return selective_scan(**x, delta_softplus=softplus, return_last_state=last, impl=self.IMPL,
                          block_sizes=self.BLOCKS)

  def test_forward_float32(self, shape, opts):
    with_z, with_D, with_bias, softplus, last = opts
    x = pick(make_inputs(*shape, softplus=softplus), with_z, with_D, with_bias)
    got = self.run(x, softplus, last)
    want = reference.selective_scan_ref(**x, delta_softplus=softplus, return_last_state=last)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
      assert g.shape == w.shape and g.dtype == w.dtype
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

  def test_forward_bfloat16(self):
    x = make_inputs(2, 64, 128, 16, dtype=jnp.bfloat16)
    got, last = self.run(x, True, True)
    x32 = {k: (v.astype(jnp.float32) if v.dtype == jnp.bfloat16 else v) for k, v in x.items()}
    want, want_last = reference.selective_scan_ref(**x32, delta_softplus=True, return_last_state=True)
    assert got.dtype == jnp.bfloat16 and last.dtype == jnp.float32
    assert rel(got, want) <= 1e-2 and rel(last, want_last) <= 1e-2

  def test_gradients_match_reference(self, shape, opts):
    if not self.GRADS:
      pytest.skip("the reference's own gradients are checked against finite differences below")
    with_z, with_D, with_bias, softplus, last = opts
    x = pick(make_inputs(*shape, softplus=softplus), with_z, with_D, with_bias)
    names = [k for k, v in x.items() if v is not None]

    def loss(fn, *vals):
      out = fn(**dict(zip(names, vals)), **{k: None for k in x if x[k] is None},
               delta_softplus=softplus, return_last_state=True)
      y, state = out
      return jnp.sum(y * jnp.cos(y)) + (jnp.sum(state ** 2) if last else 0.0)

    mine = lambda **kw: selective_scan(**kw, impl=self.IMPL, block_sizes=self.BLOCKS)  # noqa: E731
    vals = [x[k] for k in names]
    g = jax.jit(jax.grad(lambda *v: loss(mine, *v), argnums=tuple(range(len(vals)))))(*vals)
    w = jax.jit(jax.grad(lambda *v: loss(reference.selective_scan_ref, *v), argnums=tuple(range(len(vals)))))(*vals)
    for name, a, b in zip(names, g, w):
      assert rel(a, b) <= 1e-4, f"d{name}: relative error {rel(a, b):.2e}"

  def test_jit_and_vmap(self):
    x = make_inputs(2, 40, 32, 4)
    f = jax.jit(lambda u: selective_scan(u, x["delta"], x["A"], x["B"], x["C"], x["D"], x["z"], x["delta_bias"],
                                         True, impl=self.IMPL, block_sizes=self.BLOCKS))
    both = jax.vmap(f)(jnp.stack([x["u"], 2 * x["u"]]))
    want = reference.selective_scan_ref(**dict(x, u=2 * x["u"]), delta_softplus=True)
    np.testing.assert_allclose(both[1], want, rtol=1e-5, atol=1e-5)

  def test_mesh_context_equals_unsharded(self):
    """Under a 2 x 4 mesh context a Pallas impl runs per shard (batch over data, channels over model); every
    impl gives the unsharded values and B gradients."""
    m = mesh_lib.make_mesh((("data", 2), ("model", 4)))
    x = make_inputs(2, 48, 64, 8)
    kw = dict(delta_softplus=True, impl=self.IMPL, block_sizes=self.BLOCKS)
    fn = jax.jit(lambda x: selective_scan(**x, return_last_state=True, **kw))
    loss = lambda B: jnp.sum(selective_scan(**dict(x, B=B), **kw) ** 2)  # noqa: E731
    want, want_last = fn(x)
    wB = jax.jit(jax.grad(loss))(x["B"])
    with mesh_lib.use(m):
      per_shard = "shard_map" in str(jax.make_jaxpr(fn)(x))
      out, last = fn(x)
      gB = jax.jit(jax.grad(loss))(x["B"])
    assert per_shard == (self.IMPL not in ("xla", "associative"))
    if per_shard:
      assert out.sharding.spec == jax.sharding.PartitionSpec("data", None, "model")
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(last, want_last, rtol=1e-6, atol=1e-6)
    assert rel(gB, wB) <= 1e-5  # B is replicated over "model": its gradient is summed over the shards


class TestXla(SelectiveScanContract):
  IMPL = "xla"
  GRADS = False


class TestInterpret(SelectiveScanContract):
  """The GPU (Triton-lowered) kernels under the Pallas interpreter."""
  IMPL = "interpret"
  BLOCKS = SMALL
  FORWARD_CASES = PALLAS_CASES


@pytest.mark.skipif(importlib.util.find_spec("jaxlab.kernels.selective_scan.kernel_tpu") is None,
                    reason="TPU kernel not present")
class TestInterpretTpu(SelectiveScanContract):
  """The TPU (Mosaic) kernels under Pallas' TPU interpret mode."""
  IMPL = "interpret_tpu"
  BLOCKS = BlockSizes(chunk=32, sub_chunk=8)   # = test_selective_scan_tpu.SMALL (block_d = block_d_bwd = 128)
  # test_selective_scan_tpu.py runs the same programs (same blocks) at the aligned and the
  # many-chunk shapes (test_forward_matches_reference_float32: (64, OPTIONS[0]), (64, OPTIONS[1]),
  # (200, OPTIONS[0]), (200, OPTIONS[2]); OPTIONS[3] at 200 with other blocks), the same bfloat16 forward
  # (test_forward_bfloat16) and the same aligned gradients (test_gradients_of_every_input_match_reference
  # [(2, 64, 128, 16)-OPTIONS[0]-SMALL]); here only what that file does not run: every option at the odd shape,
  # and the odd-shape gradients without z / D / bias / softplus.
  FORWARD_CASES = tuple((SHAPES[2], opts) for opts in OPTIONS)
  GRAD_CASES = (((1, 37, 40, 5), OPTIONS[1]),)
  test_forward_bfloat16 = None    # identical to test_selective_scan_tpu.py::test_forward_bfloat16

  @pytest.mark.slow   # about a minute in the TPU interpreter; TestInterpret checks the same contract by default
  def test_mesh_context_equals_unsharded(self):
    super().test_mesh_context_equals_unsharded()


# ------------------------------------------------------------------ independent checks of the reference


def naive_numpy(u, delta, A, B, C, D, z, delta_bias, softplus):
  """Textbook loops in float64."""
  u, delta, A, B, C, D, z, bias = (np.asarray(v, np.float64) for v in (u, delta, A, B, C, D, z, delta_bias))
  b, l, d = u.shape
  out = np.zeros((b, l, d))
  last = np.zeros((b, d, A.shape[1]))
  for i in range(b):
    for ch in range(d):
      x = np.zeros(A.shape[1])
      for t in range(l):
        dt = delta[i, t, ch] + bias[ch]
        if softplus:
          dt = np.log1p(np.exp(dt))
        x = np.exp(dt * A[ch]) * x + dt * u[i, t, ch] * B[i, t]
        y = x @ C[i, t] + D[ch] * u[i, t, ch]
        out[i, t, ch] = y * z[i, t, ch] / (1 + np.exp(-z[i, t, ch]))
      last[i, ch] = x
  return out, last


@pytest.mark.parametrize("softplus", [True, False])
def test_reference_matches_naive_loops(softplus):
  x = make_inputs(2, 9, 3, 4, softplus=softplus)
  want, want_last = naive_numpy(**x, softplus=softplus)
  for fn in (reference.selective_scan_ref, reference.selective_scan_assoc):
    got, last = fn(**x, delta_softplus=softplus, return_last_state=True)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(last, want_last, rtol=2e-5, atol=2e-5)


def test_reference_gradients_match_finite_differences():
  x = make_inputs(1, 6, 3, 2)
  f = lambda u, delta, A, B, C, D, z, delta_bias: reference.selective_scan_ref(  # noqa: E731
      u, delta, A, B, C, D, z, delta_bias, True)
  check_grads(f, tuple(x.values()), order=1, modes=["rev"], atol=2e-2, rtol=2e-2, eps=1e-2)


@pytest.mark.parametrize("bad,match", [
    (dict(u=jnp.zeros((2, 8))), "u must be"),
    (dict(A=jnp.zeros((5, 4))), "A must be"),
    (dict(B=jnp.zeros((2, 8, 3))), "B must have shape"),
    (dict(delta=jnp.zeros((2, 8, 4), jnp.bfloat16)), "delta and z must have u's dtype"),
    (dict(A=jnp.zeros((4, 4), jnp.bfloat16)), "A must be float32"),
])
def test_bad_input_is_a_clear_error(bad, match):
  x = dict(u=jnp.zeros((2, 8, 4)), delta=jnp.zeros((2, 8, 4)), A=jnp.zeros((4, 4)), B=jnp.zeros((2, 8, 4)),
           C=jnp.zeros((2, 8, 4)))
  with pytest.raises(ValueError, match=match):
    selective_scan(**dict(x, **bad), impl="xla")


def test_impl_errors():
  x = make_inputs(1, 8, 4, 2)
  with pytest.raises(ValueError, match="impl='nope' is not one of"):
    selective_scan(**x, impl="nope")
  if jax.default_backend() == "cpu":
    with pytest.raises(ValueError, match="needs a GPU or TPU.*interpret"):
      selective_scan(**x, impl="pallas")
  with pytest.raises(ValueError, match="power of two"):
    selective_scan(**x, impl="interpret", block_sizes=BlockSizes(chunk=24))


@pytest.mark.parametrize("shape", [(8, 4096, 2048, 16), (2, 200, 100, 5)], ids=str)
def test_gpu_kernels_lower_to_triton_without_a_gpu(shape):
  """Cross-lowers forward and backward for CUDA (Pallas -> Triton IR) on this machine: catches
  constructs Pallas-Triton cannot lower, at the benchmark shape, without GPU hardware."""
  from jaxlab.kernels.selective_scan import kernel
  b, l, d, n = shape
  S = jax.ShapeDtypeStruct
  bf, f32 = jnp.bfloat16, jnp.float32
  args = (S((b, l, d), bf), S((b, l, d), bf), S((d, n), f32), S((b, l, n), bf), S((b, l, n), bf), S((d,), f32),
          S((b, l, d), bf), S((d,), f32))

  def fwd(*a):
    return kernel.forward(*a, delta_softplus=True, save_residuals=True)

  text = jax.jit(fwd).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 2
  res = jax.eval_shape(fwd, *args)[2]

  def bwd(*a):
    return kernel.backward(*a[:8], a[8], a[9], a[10], delta_softplus=True)

  text = jax.jit(bwd).trace(*args, res, S((b, l, d), bf), S((b, d, n), f32)).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 2


def _np_zoh_scan(u, delta, A, B, C):
  """float64 loop: h_t = exp(d A) h + (exp(d A) - 1) / A * B_t u_t (exact zero-order hold), y = <C_t, h_t>."""
  b, l, d = u.shape
  h = np.zeros((b, d, A.shape[1]))
  ys = np.zeros((b, l, d))
  for t in range(l):
    da = delta[:, t, :, None] * A
    h = np.exp(da) * h + np.expm1(da) / A * (u[:, t, :, None] * B[:, t, None, :])
    ys[:, t] = np.einsum("bdn,bn->bd", h, C[:, t])
  return ys, h


@pytest.mark.parametrize("impl", ["xla", "associative", "auto"])
def test_zoh_b_matches_a_float64_loop(impl):
  x = make_inputs(2, 33, 24, 6, softplus=False, seed=3)
  f64 = {k: np.asarray(v, np.float64) for k, v in x.items()}
  want, want_last = _np_zoh_scan(f64["u"], f64["delta"], f64["A"], f64["B"], f64["C"])
  got, last = selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], return_last_state=True, impl=impl,
                             zoh_b=True)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(last), want_last, rtol=1e-4, atol=1e-5)
  euler = selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], impl="xla")
  assert not np.allclose(np.asarray(euler), want, atol=1e-2)          # the switch changes the rule


def test_zoh_b_r_steps_at_delta_equal_one_step_at_r_delta():
  """The DF-Mamba identity through the op: an input held for r steps, B fixed over the window."""
  r, windows, d, n = 4, 6, 8, 5
  k = jax.random.split(jax.random.key(7), 3)
  u_c = jax.random.normal(k[0], (1, windows, d))
  b_c = jax.random.normal(k[1], (1, windows, n))
  A = -jnp.exp(jax.random.normal(k[2], (d, n)))
  delta = jnp.full((1, windows * r, d), 0.07)
  fine = lambda a: jnp.repeat(a, r, axis=1)
  ones = jnp.ones((1, windows * r, n))
  for zoh, expect_equal in ((True, True), (False, False)):
    _, h_fine = selective_scan(fine(u_c), delta, A, fine(b_c), ones, return_last_state=True, impl="xla", zoh_b=zoh)
    _, h_coarse = selective_scan(u_c, jnp.full((1, windows, d), 0.07 * r), A, b_c, jnp.ones((1, windows, n)),
                                 return_last_state=True, impl="xla", zoh_b=zoh)
    err = float(jnp.max(jnp.abs(h_fine - h_coarse)) / jnp.max(jnp.abs(h_fine)))
    assert (err < 1e-5) == expect_equal, (zoh, err)


def test_zoh_b_is_refused_by_the_pallas_kernels():
  x = make_inputs(1, 8, 16, 4)
  with pytest.raises(ValueError, match="zoh_b"):
    selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], impl="interpret", zoh_b=True)
