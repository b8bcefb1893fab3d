"""ZO perturbation kernel: same bits in every impl, Gaussian z, masks, in-place donation, sharding, lowering."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab.kernels import zo_perturb as zp
from jaxlab.kernels.zo_perturb import kernel, ops, reference

U32 = jnp.uint32
normal = jax.jit(zp.normal, static_argnums=(0, 2))


# ------------------------------------------------- Philox-4x32-10 against references nobody here wrote

# Random123's known-answer vectors for philox4x32_R(10, counter, key) (Salmon et al., SC 2011; kat_vectors).
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


@pytest.mark.parametrize("counter,key,want", KAT)
def test_philox_matches_the_random123_known_answers(counter, key, want):
  got = reference.philox4x32([U32(c) for c in counter], [U32(k) for k in key])
  assert tuple(int(w) for w in got) == want


def test_philox_matches_randomgen():
  randomgen = pytest.importorskip("randomgen", reason="randomgen is a test extra: pip install -e '.[test]'")
  rng = np.random.default_rng(0)
  for _ in range(16):
    c = [int(v) for v in rng.integers(0, 2 ** 32, 4)]
    k = [int(v) for v in rng.integers(0, 2 ** 32, 2)]
    counter = sum(v << (32 * i) for i, v in enumerate(c))
    # randomgen increments its 128-bit counter before each block: start one below to get philox(c).
    g = randomgen.Philox(number=4, width=32, key=k[0] | (k[1] << 32), counter=(counter - 1) % 2 ** 128)
    want = [int(v) for v in g.random_raw(4)]
    got = reference.philox4x32([U32(v) for v in c], [U32(v) for v in k])
    assert [int(w) for w in got] == want


def _py_philox(counter, key):
  """Philox-4x32-10 in Python integers (64-bit products exact): the docstring's rounds, independently."""
  c0, c1, c2, c3 = counter
  k0, k1 = key
  for r in range(10):
    if r:
      k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
    c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c3 ^ k1, p0 & 0xFFFFFFFF
  return c0, c1, c2, c3


def _py_normal(seed, counter):
  w0, w1, _, _ = _py_philox((0, counter & 0xFFFFFFFF, 0, counter >> 32), (seed, seed ^ reference.KEY_WORD))
  u1 = 2.0 - (1.0 + (w0 >> 9) / 2.0 ** 23)
  u2 = (w1 >> 7) / 2.0 ** 25
  return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def test_normals_match_an_independent_python_model():
  seed, offset = 2024, 2 ** 32 - 3   # the counter crosses into the next high word
  n = 8
  counters = [offset + i for i in range(n)]
  for c in counters:
    w0, w1 = reference.counter_words(U32(seed), U32(c >> 32), U32(c & 0xFFFFFFFF))
    assert (int(w0), int(w1)) == _py_philox((0, c & 0xFFFFFFFF, 0, c >> 32), (seed, seed ^ reference.KEY_WORD))[:2]
  z = np.asarray(normal((n,), seed, offset))
  np.testing.assert_allclose(z, [_py_normal(seed, c) for c in counters], rtol=2e-6, atol=2e-6)


def test_the_two_box_muller_words_are_uniform_in_2d():
  """(u1, u2) of 2^22 counters on a 128 x 128 grid: chi-square within 3 standard deviations of its mean (the
  previous one-word hash was measurably too regular: about 3 sd below it at 2^24 draws)."""
  n, bins = 1 << 22, 128
  flat = jnp.arange(n, dtype=U32)
  w0, w1 = jax.jit(lambda f: reference.counter_words(U32(77), U32(0), f))(flat)
  i, j = np.asarray(w0 >> (32 - 7)), np.asarray(w1 >> (32 - 7))
  counts = np.bincount(i.astype(np.int64) * bins + j, minlength=bins * bins)
  expected = n / bins ** 2
  chi2 = float(((counts - expected) ** 2 / expected).sum())
  dof = bins ** 2 - 1
  assert abs(chi2 - dof) < 3 * math.sqrt(2 * dof), (chi2, dof)


@pytest.mark.parametrize("shape", [pytest.param((257, 129), marks=pytest.mark.slow),   # ~12 s each: compiles
                                   pytest.param((1000,), marks=pytest.mark.slow), (33, 7, 5), (3, 1)], ids=str)
def test_eager_jitted_and_interpreted_give_identical_bits(shape):
  """Also the perturbed parameters, not only z, and on shapes that are not block multiples: every product is
  rounded before its addition, so a fused multiply-add (XLA fuses them within a loop) changes nothing."""
  x = jax.random.normal(jax.random.key(0), shape, jnp.float32)
  mask = 0.5 + (jnp.arange(zp.num_blocks(math.prod(shape), 64)) % 2)
  for kw in (dict(), dict(mask=mask, block_size=64)):
    runs = {"xla": zp.perturb(x, 99, 1e-3, impl="xla", **kw),
            "interpret": zp.perturb(x, 99, 1e-3, impl="interpret", **kw),
            "jit xla": jax.jit(lambda x: zp.perturb(x, 99, 1e-3, impl="xla", **kw))(x),
            "jit interpret": jax.jit(lambda x: zp.perturb(x, 99, 1e-3, impl="interpret", **kw))(x),
            "reference": zp.perturb_ref(x, 99, 1e-3, **kw)}
    bits = {k: np.asarray(v).view(np.uint32) for k, v in runs.items()}
    for k, v in bits.items():
      assert (v == bits["reference"]).all(), f"{k} differs from the reference in {(v != bits['reference']).sum()}"


def test_normals_are_standard_gaussian_and_decorrelated():
  z = np.asarray(jax.jit(lambda s: zp.normal((1 << 20,), s))(U32(3)), np.float64)
  assert abs(z.mean()) < 0.01 and abs(z.var() - 1) < 0.02
  assert abs(scipy.stats.skew(z)) < 0.02 and abs(scipy.stats.kurtosis(z)) < 0.05
  assert scipy.stats.kstest(z, "norm").pvalue > 1e-3
  assert abs((np.abs(z) > 2).mean() - 2 * scipy.stats.norm.sf(2)) < 0.002
  other = np.asarray(normal((1 << 20,), 4), np.float64)
  assert abs(np.corrcoef(z, other)[0, 1]) < 0.005 and abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 0.005


def test_counters_are_offset_plus_index():
  a = normal((100,), 5, 2 ** 32 - 10)
  b = normal((90,), 5, 2 ** 32)
  np.testing.assert_array_equal(a[10:], b)
  c = normal((4, 25), 5, 2 ** 32 - 10)
  np.testing.assert_array_equal(c.ravel(), a)


CASES = [((1000,), jnp.float32, None), ((37, 53), jnp.bfloat16, 7), ((3, 5, 129), jnp.float16, 64)]


@pytest.mark.parametrize("shape,dtype,block", CASES, ids=str)
def test_impls_give_identical_bits(shape, dtype, block):
  x = jax.random.normal(jax.random.key(0), shape).astype(dtype)
  size = max(1, math.prod(shape))
  mask = None if block is None else 1.5 * (jnp.arange(zp.num_blocks(size, block)) % 3 == 1)
  kw = dict(mask=mask, block_size=block, offset=2 ** 32 - 500)
  want = jax.jit(lambda x, s: zp.perturb_ref(x, s, 0.25, **kw))(x, U32(11))
  for impl in ("xla", "interpret"):
    got = jax.jit(lambda x, s, impl=impl: zp.perturb(x, s, 0.25, impl=impl, block_sizes=zp.BlockSizes(tile=256),
                                                      **kw))(x, U32(11))
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32), err_msg=impl)
  # and the values: x + scale * w * z in float32, rounded once
  z = np.asarray(normal(shape, 11, 2 ** 32 - 500))
  w = np.ones(size) if mask is None else np.repeat(np.asarray(mask), block)[:size]
  expect = (np.asarray(x, np.float32) + np.float32(0.25) * w.reshape(shape).astype(np.float32) * z).astype(dtype)
  tol = 1e-6 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(np.asarray(want, np.float32), np.asarray(expect, np.float32), rtol=tol, atol=1e-6)


@pytest.mark.parametrize("impl", ["xla", "interpret"])
def test_mask_changes_only_selected_blocks(impl):
  x = jax.random.normal(jax.random.key(1), (40, 30))
  x = x.at[0, :3].set(-0.0)                               # signed zeros in an unselected block stay -0.0
  block = 50
  keep = np.zeros(zp.num_blocks(x.size, block), bool)
  keep[[1, 5, 23]] = True
  y = np.asarray(jax.jit(lambda x, m: zp.perturb(x, 3, 0.1, mask=m, block_size=block, impl=impl))(x, keep))
  flat_x, flat_y = np.asarray(x).ravel(), y.ravel()
  sel = np.repeat(keep, block)[: x.size]
  np.testing.assert_array_equal(flat_y[~sel].view(np.uint32), flat_x[~sel].view(np.uint32))
  assert np.all(flat_y[sel] != flat_x[sel])


def test_round_trip_and_in_place_donation():
  x = jax.random.normal(jax.random.key(2), (4096,))
  for impl in ("xla", "interpret"):
    f = jax.jit(lambda x, s, c, impl=impl: zp.perturb(x, s, c, impl=impl), donate_argnums=0)
    y = f(jnp.array(x), U32(5), 1e-3)
    np.testing.assert_allclose(y - x, 1e-3 * normal((4096,), 5), atol=2e-7)  # the same z regenerated
    y = f(y, U32(5), -2e-3)
    y = f(y, U32(5), 1e-3)
    np.testing.assert_allclose(y, x, atol=1e-6)
  mem = jax.jit(lambda x: zp.perturb(x, 5, 1e-3, impl="xla"), donate_argnums=0).lower(x).compile().memory_analysis()
  assert mem.alias_size_in_bytes == x.nbytes and mem.temp_size_in_bytes == 0   # in place, no z buffer
  m = jnp.ones((16,))
  mem = jax.jit(lambda x: zp.perturb(x, 5, 1e-3, mask=m, impl="xla"), donate_argnums=0).lower(x).compile(
  ).memory_analysis()
  assert mem.alias_size_in_bytes == x.nbytes and mem.temp_size_in_bytes == 0


SPECS = [((16, 12), P("data", "model")), ((8, 6, 4), P("model", None, "data"))]


@pytest.mark.parametrize("shape,spec", SPECS, ids=str)
def test_sharded_equals_unsharded_bitwise(shape, spec):
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  sh = NamedSharding(mesh, spec)
  x = jax.random.normal(jax.random.key(3), shape)
  mask = (jnp.arange(zp.num_blocks(x.size, 5)) % 2).astype(jnp.float32)
  for impl, m in (("xla", None), ("xla", mask), ("interpret", mask)):
    if True:
      kw = dict(mask=m, block_size=None if m is None else 5, offset=2 ** 32 - 50, impl=impl)
      want = jax.jit(lambda x, s, kw=kw: zp.perturb(x, s, 0.3, **kw))(x, U32(9))
      got = jax.jit(lambda x, s, kw=kw: zp.perturb(x, s, 0.3, sharding=sh, **kw))(jax.device_put(x, sh), U32(9))
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  # Given the concrete sharded array (not a tracer) the op uses the array's own sharding.
  placed = jax.device_put(x, sh)
  own = lambda s: zp.perturb(placed, s, 0.3, impl="xla")  # noqa: E731
  assert "shard_map" in str(jax.make_jaxpr(own)(U32(9)))
  want = jax.jit(lambda x, s: zp.perturb(x, s, 0.3, impl="xla"))(x, U32(9))
  np.testing.assert_array_equal(np.asarray(jax.jit(own)(U32(9))), np.asarray(want))


def test_tree_uses_one_z_over_the_concatenated_leaves():
  tree = {"a": jnp.ones((3, 4)), "b": {"c": jnp.zeros((5,)), "d": jnp.full((2, 2, 2), 2.0)}}
  out = jax.jit(lambda t: zp.perturb_tree(t, 17, 0.5, impl="xla", base_offset=7))(tree)
  flat = jnp.concatenate([x.ravel() for x in jax.tree.leaves(tree)])
  want = jax.jit(lambda f: zp.perturb(f, 17, 0.5, offset=7, impl="xla"))(flat)
  np.testing.assert_array_equal(jnp.concatenate([x.ravel() for x in jax.tree.leaves(out)]), want)
  assert zp.leaf_offsets(tree) == [0, 12, 17]


def test_kernel_lowers_to_triton_in_place_without_a_gpu():
  S = jax.ShapeDtypeStruct
  for shape, dtype, masked in (((1 << 29,), jnp.bfloat16, False), ((50257, 768), jnp.bfloat16, True)):
    n = math.prod(shape)

    def f(x, seed, scale, *w):
      (r, c), rowflat = ops.view_2d(x.shape, x.shape, [0] * x.ndim)
      ctr = jnp.stack([seed, U32(0), U32(0), U32(0)])
      return kernel.perturb_2d(x.reshape(r, c), rowflat, ctr, scale.reshape(1), *w,
                               block_size=4096 if w else None, may_carry=False).reshape(x.shape)

    args = (S(shape, dtype), S((), U32), S((), jnp.float32))
    if masked:
      args += (S((kernel._pow2(zp.num_blocks(n, 4096)),), jnp.float32),)  # pylint: disable=protected-access
    text = jax.jit(f, donate_argnums=0).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
    assert "output_operand_aliases" in text


def test_bad_inputs_are_clear_errors():
  x = jnp.ones((10, 10))
  with pytest.raises(ValueError, match="float32/bfloat16"):
    zp.perturb(jnp.ones((3,), jnp.int32), 1, 0.1)
  with pytest.raises(ValueError, match="cannot infer block_size"):
    zp.perturb(x, 1, 0.1, mask=jnp.ones((3,)))
  with pytest.raises(ValueError, match="in blocks of 30 has 4"):
    zp.perturb(x, 1, 0.1, mask=jnp.ones((3,)), block_size=30)
  with pytest.raises(ValueError, match="impl="):
    zp.perturb(x, 1, 0.1, impl="cuda")
  with pytest.raises(ValueError, match="offset must be"):
    zp.perturb(x, 1, 0.1, offset=-1)
  with pytest.raises(ValueError, match="power of two"):
    zp.BlockSizes(tile=1000)
  if jax.default_backend() == "cpu":
    with pytest.raises(ValueError, match="needs a GPU"):
      zp.perturb(x, 1, 0.1, impl="pallas")
