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


# ------------------------------------------------------------------ an independent (pure Python) hash model

def _py_mix(h):
  h &= 0xFFFFFFFF
  h ^= h >> 16
  h = (h * 0x7FEB352D) & 0xFFFFFFFF
  h ^= h >> 15
  h = (h * 0x846CA68B) & 0xFFFFFFFF
  return h ^ (h >> 16)


def _py_words(seed, counter):
  """The docstring's hash in Python integers: (h1, h2) of a 64-bit counter."""
  hi, lo = counter >> 32, counter & 0xFFFFFFFF
  key = _py_mix(seed ^ _py_mix((hi * 0x9E3779B9 + 0x632BE5AB) & 0xFFFFFFFF))
  key2 = _py_mix(key ^ 0x5851F42D) | 1
  h1 = _py_mix(lo ^ key)
  h2 = ((h1 ^ key2) * 0x2C1B3C6D) & 0xFFFFFFFF
  return h1, h2


def _py_normal(seed, counter):
  h1, h2 = _py_words(seed, counter)
  u1 = 2.0 - (1.0 + (h1 >> 9) / 2.0 ** 23)
  u2 = (h2 >> 7) / 2.0 ** 25
  return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def test_hash_and_normals_match_an_independent_python_model():
  seed, offset = 2024, 2 ** 32 - 3   # the counter crosses into the next high word
  n = 8
  counters = [offset + i for i in range(n)]
  for c in counters:
    k = reference.stream_key(U32(seed), U32(c >> 32))
    h1, h2 = reference.hash_words(k, reference.second_key(k), U32(c & 0xFFFFFFFF))
    assert (int(h1), int(h2)) == _py_words(seed, c)
  z = np.asarray(normal((n,), seed, offset))
  np.testing.assert_allclose(z, [_py_normal(seed, c) for c in counters], rtol=2e-6, atol=2e-6)


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
