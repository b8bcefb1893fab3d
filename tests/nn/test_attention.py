"""The attention entry point: every implementation equals the einsum reference (forward and gradients) on
packed, grouped-query batches; the Pallas kernels in interpret mode on CPU and cross-lowered to TPU (Mosaic)
and GPU (Triton) IR without the hardware; the chunked path never materialises (L, L)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlab import mesh as mesh_lib
from jaxlab.nn import attention as A
from jaxlab.lm.model import Transformer, TransformerConfig


def _inputs(b=2, l=256, h=4, hk=2, d=32, dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, l, h, d)), dtype)
  k = jnp.asarray(rng.normal(size=(b, l, hk, d)), dtype)
  v = jnp.asarray(rng.normal(size=(b, l, hk, d)), dtype)
  seg = jnp.asarray(np.sort(rng.integers(1, 4, size=(b, l)), axis=1), jnp.int32)   # packed: 1..3 segments
  return q, k, v, seg


def _dense_reference(q, k, v, seg, causal=True):
  """An independent float64 loop over (batch, head) with numpy (no shared code with the impls)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, l, h, d = q.shape
  g = h // k.shape[2]
  out = np.zeros_like(q)
  for bi in range(b):
    allowed = np.ones((l, l), bool) if seg is None else np.asarray(seg)[bi][:, None] == np.asarray(seg)[bi][None]
    if causal:
      allowed &= np.tril(np.ones((l, l), bool))
    for hi in range(h):
      s = q[bi, :, hi] @ k[bi, :, hi // g].T / np.sqrt(d)
      s = np.where(allowed, s, -np.inf)
      p = np.exp(s - s.max(-1, keepdims=True))
      out[bi, :, hi] = (p / p.sum(-1, keepdims=True)) @ v[bi, :, hi // g]
  return out


def test_xla_reference_matches_a_float64_loop():
  q, k, v, seg = _inputs(l=64)
  np.testing.assert_allclose(A.attention(q, k, v, segment_ids=seg, impl="xla"), _dense_reference(q, k, v, seg),
                             atol=2e-5)
  np.testing.assert_allclose(A.attention(q, k, v, causal=False, impl="xla"),
                             _dense_reference(q, k, v, None, causal=False), atol=2e-5)


CASES = [("chunked", dict(chunk=64)), ("chunked", dict(chunk=100)), ("splash", {}), ("flash_gpu", {})]


@pytest.mark.parametrize("impl,kw", CASES, ids=["chunked64", "chunked100", "splash", "flash_gpu"])
def test_impl_equals_reference_forward_and_gradients(impl, kw):
  q, k, v, seg = _inputs()
  ref = A.attention(q, k, v, segment_ids=seg, impl="xla")
  out = A.attention(q, k, v, segment_ids=seg, impl=impl, **kw)
  np.testing.assert_allclose(out, ref, atol=5e-6)
  w = jnp.asarray(np.random.default_rng(1).normal(size=ref.shape), jnp.float32)
  loss = lambda name, extra: (lambda q_, k_, v_: (A.attention(q_, k_, v_, segment_ids=seg, impl=name, **extra)  # noqa: E731
                                                 * w).sum())
  got = jax.jit(jax.grad(loss(impl, kw), argnums=(0, 1, 2)))(q, k, v)
  want = jax.jit(jax.grad(loss("xla", {}), argnums=(0, 1, 2)))(q, k, v)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, atol=2e-5)


@pytest.mark.parametrize("impl", ["splash", "flash_gpu", "chunked"])
def test_impl_without_segments_and_bfloat16(impl):
  q, k, v, _ = _inputs(dtype=jnp.bfloat16, l=128)
  ref = A.attention(q, k, v, impl="xla").astype(jnp.float32)
  out = A.attention(q, k, v, impl=impl, chunk=32).astype(jnp.float32)
  assert out.dtype == jnp.float32 and float(jnp.abs(out - ref).max()) < 0.05


def test_chunked_takes_any_mask_and_non_causal():
  q, k, v, seg = _inputs(l=96)
  extra = jnp.asarray(np.random.default_rng(2).random((2, 96, 96)) < 0.7) | jnp.eye(96, dtype=bool)[None]
  for causal in (True, False):
    ref = A.attention(q, k, v, segment_ids=seg, causal=causal, mask=extra, impl="xla")
    out = A.attention(q, k, v, segment_ids=seg, causal=causal, mask=extra, impl="chunked", chunk=40)
    np.testing.assert_allclose(out, ref, atol=5e-6)


def test_chunked_never_materialises_the_score_matrix():
  """The backward pass's buffers grow linearly in L (doubling L at most doubles them; the score matrix would
  quadruple) and at L = 8192 stay under 1/12 of the (heads, L, L) float32 scores (1 GiB; measured here: the
  chunked gradient needs 61 MiB, the reference 3 GiB)."""
  h, d = 4, 32

  def temp_bytes(l):
    args = [jax.ShapeDtypeStruct((1, l, h, d), jnp.float32)] * 3
    grad = jax.jit(jax.grad(lambda q, k, v: A.attention(q, k, v, impl="chunked", chunk=512).sum(), argnums=(0, 1, 2)))
    return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes

  m4, m8 = temp_bytes(4096), temp_bytes(8192)
  assert m8 < 2 * m4, (m4, m8)
  assert m8 < h * 8192 * 8192 * 4 / 12, m8


def test_auto_on_cpu_is_the_reference_and_chunked_for_long_inputs():
  q, k, v, seg = _inputs(l=64)
  np.testing.assert_array_equal(A.attention(q, k, v, segment_ids=seg), A.attention(q, k, v, segment_ids=seg,
                                                                                    impl="xla"))
  assert A._resolve("auto", q, jnp.zeros((2, A.AUTO_CHUNK_LENGTH + 1, 2, 32)), None, seg, None, True, None,
                    None) == "chunked"


@pytest.mark.parametrize("bad,match", [
    (dict(impl="flash"), "is not one of"),
    (dict(impl="splash", block=100), "not a multiple of the block 100"),
    (dict(impl="cudnn"), "segment ids are given"),
    (dict(impl="flash_gpu", mask=jnp.ones((1, 256, 256), bool)), "explicit mask"),
])
def test_bad_calls_are_one_line_errors(bad, match):
  q, k, v, seg = _inputs()
  with pytest.raises(ValueError, match=match) as e:
    A.attention(q, k, v, segment_ids=seg, **bad)
  assert "\n" not in str(e.value)


def test_kernels_per_shard_under_a_mesh_equal_the_unsharded_call():
  q, k, v, seg = _inputs(b=4, h=8, hk=4, l=128)
  ref = A.attention(q, k, v, segment_ids=seg, impl="xla")
  mesh = mesh_lib.make_mesh((("data", 2), ("model", 4)))
  with mesh_lib.use(mesh, "tensor_parallel"):
    assert mesh_lib.dividing_axes("heads", 8) is not None
    for impl in ("splash", "flash_gpu"):
      out = jax.jit(lambda q_, k_, v_, s_, i=impl: A.attention(q_, k_, v_, segment_ids=s_, impl=i))(q, k, v, seg)
      np.testing.assert_allclose(out, ref, atol=5e-6)


def _custom_calls(text):
  return set(re.findall(r"stablehlo\.custom_call @([\w$.]+)", text))


@pytest.mark.parametrize("impl,platform,target", [("splash", "tpu", "tpu_custom_call"),
                                                  ("flash_gpu", "cuda", "__gpu$xla.gpu.triton")])
def test_kernels_lower_for_their_hardware_without_it(impl, platform, target):
  sd = jax.ShapeDtypeStruct
  b, l, h, hk, d = 2, 256, 4, 2, 64
  args = (sd((b, l, h, d), jnp.bfloat16), sd((b, l, hk, d), jnp.bfloat16), sd((b, l, hk, d), jnp.bfloat16),
          sd((b, l), jnp.int32))
  fwd = lambda q, k, v, s: A.attention(q, k, v, segment_ids=s, impl=impl, interpret=False)  # noqa: E731
  grad = jax.grad(lambda q, k, v, s: fwd(q, k, v, s).astype(jnp.float32).sum(), argnums=(0, 1, 2))
  for fn in (fwd, grad):
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    assert target in _custom_calls(text), _custom_calls(text)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN fused attention needs an NVIDIA GPU "
                    "(its lowering asks the device for the cuDNN version)")
def test_cudnn_equals_reference_on_gpu():
  q, k, v, _ = _inputs(dtype=jnp.bfloat16, l=128, d=64)
  ref = A.attention(q, k, v, impl="xla").astype(jnp.float32)
  assert float(jnp.abs(A.attention(q, k, v, impl="cudnn").astype(jnp.float32) - ref).max()) < 0.05


@pytest.mark.parametrize("impl", [pytest.param("chunked", marks=pytest.mark.slow),   # ~20 s; chunked has its own tests
                                  "splash", "flash_gpu"])
def test_transformer_logits_and_gradients_with_each_impl(impl):
  """The model with a fused impl equals the reference model on a packed batch (Llama, GQA). One layer: the
  embedding's gradient already flows back through the kernel's dq, dk and dv (a second layer would compile
  a second copy of the same kernel)."""
  cfg = TransformerConfig(vocab_size=61, hidden=64, n_layers=1, n_heads=4, n_kv_heads=2, mlp_hidden=96,
                          attention="xla")
  ref_model = Transformer(cfg, rngs=nnx.Rngs(0))
  model = Transformer(cfg.replace(attention=impl), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(3)
  tokens = jnp.asarray(rng.integers(0, 61, size=(2, 128)))
  seg = jnp.asarray(np.sort(rng.integers(0, 3, size=(2, 128)), axis=1))
  fwd = nnx.jit(lambda m: m(tokens, segment_ids_bl=seg))     # one program per model, not one per eager op
  np.testing.assert_allclose(fwd(model), fwd(ref_model), atol=2e-5)

  def loss(m):
    return m(tokens, segment_ids_bl=seg).mean()
  g = nnx.jit(nnx.grad(loss))(model)
  g_ref = nnx.jit(nnx.grad(loss))(ref_model)
  for a, b in zip(jax.tree.leaves(nnx.state(g)), jax.tree.leaves(nnx.state(g_ref))):
    np.testing.assert_allclose(a, b, atol=2e-5)
