"""Benchmarks for `python -m jaxlab.bench selective_scan`: forward and forward+backward.

On GPU/TPU the shape is the one the official Mamba CUDA kernel is usually measured at (batch 8, length 4096, dim 2048, state 16, bf16, with z, D, softplus)
and the impls are the `lax.scan` reference, `lax.associative_scan` (the baseline the speed-up is reported
against) and the Pallas kernels. On CPU a smaller float32 shape runs the two XLA impls only (the Pallas
interpreter is a correctness tool, not a performance one).

Roofline terms per call (forward): HBM bytes = read u, delta, z, B, C + write out; special functions =
one exp per (batch, length, dim, state) plus softplus and SiLU per (batch, length, dim); FLOPs ~ 6 per
(batch, length, dim, state). Forward+backward: about twice the exps (the backward recomputes the decay) and
the extra reads (dout, the inputs again) and writes (the input gradients).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxlab.kernels.selective_scan.kernel import BlockSizes
from jaxlab.kernels.selective_scan.ops import selective_scan


# Extra block-size variants timed on GPU in the same run (a small autotuning sweep; the first one is the
# default). (block_d, chunk, sub_chunk, block_d_bwd, num_warps, num_stages).
GPU_VARIANTS = [None, (32, 128, 16, 32, 1, 1), (16, 256, 16, 32, 1, 1), (16, 64, 16, 32, 1, 1),
                (64, 128, 8, 64, 2, 1), (16, 128, 16, 16, 1, 2)]


def _shape():
  if jax.default_backend() in ("gpu", "cuda"):
    return (8, 4096, 2048, 16), jnp.bfloat16, ("xla", "associative", "pallas")
  if jax.default_backend() == "tpu":
    return (8, 4096, 2048, 16), jnp.bfloat16, ("xla", "associative", "pallas")
  return (2, 1024, 256, 16), jnp.float32, ("xla", "associative")


def _inputs(shape, dtype):
  b, l, d, n = shape
  k = jax.random.split(jax.random.key(0), 8)
  return (jax.random.normal(k[0], (b, l, d), dtype), (0.5 * jax.random.normal(k[1], (b, l, d))).astype(dtype),
          -jnp.exp(0.5 * jax.random.normal(k[2], (d, n))), jax.random.normal(k[3], (b, l, n), dtype),
          jax.random.normal(k[4], (b, l, n), dtype), jax.random.normal(k[5], (d,)),
          jax.random.normal(k[6], (b, l, d), dtype), 0.3 * jax.random.normal(k[7], (d,)))


def _setup(with_grad: bool):
  def setup():
    shape, dtype, impls = _shape()
    args = _inputs(shape, dtype)
    out = {}
    variants = [(impl, None) for impl in impls]
    if "pallas" in impls and jax.default_backend() in ("gpu", "cuda"):
      variants += [("pallas", BlockSizes(*v)) for v in GPU_VARIANTS[1:]]
    for impl, blocks in variants:
      def fwd(*a, impl=impl, blocks=blocks):
        return selective_scan(*a, delta_softplus=True, impl=impl, block_sizes=blocks)
      if with_grad:
        fn = jax.jit(jax.grad(lambda *a, f=fwd: jnp.sum(f(*a).astype(jnp.float32)), argnums=tuple(range(8))))
      else:
        fn = jax.jit(fwd)
      name = "lax_scan" if impl == "xla" else impl
      if blocks is not None:
        name += "_" + "-".join(str(x) for x in dataclasses.astuple(blocks))
      out[name] = (fn, args)
    return out
  return setup


def _costs(with_grad: bool):
  (b, l, d, n), dtype, _ = _shape()
  item = jnp.dtype(dtype).itemsize
  bld, bln, bldn = b * l * d, b * l * n, b * l * d * n
  fwd_bytes = (4 * bld + 2 * bln) * item
  if not with_grad:
    return dict(flops=6.0 * bldn, bytes=fwd_bytes, transcendentals=bldn + 3.0 * bld)
  bwd_bytes = (7 * bld + 4 * bln) * item
  return dict(flops=20.0 * bldn, bytes=fwd_bytes + bwd_bytes, transcendentals=2.0 * bldn + 6.0 * bld)


def _benchmarks():
  (b, l, d, n), dtype, _ = _shape()
  shape = f"b{b} l{l} d{d} n{n} {jnp.dtype(dtype).name}"
  # Plain dicts with the fields of jaxlab.bench.Benchmark (kernels do not import the library).
  return [dict(name="selective_scan/fwd", setup=_setup(False), baseline="associative", shape=shape, **_costs(False)),
          dict(name="selective_scan/fwd_bwd", setup=_setup(True), baseline="associative", shape=shape,
               **_costs(True))]


BENCHMARKS = _benchmarks()
