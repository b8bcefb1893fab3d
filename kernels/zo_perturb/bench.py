"""Benchmarks for `python -m jaxlab.bench zo_perturb`: the in-place ZO perturbation vs a copy and XLA's RNGs.

Cases (GPU/TPU: a 1 GiB bfloat16 buffer, 2^29 elements; CPU: 2^22 float32 elements), every impl donating its
buffer (each timed call feeds the previous call's output back, so the update is in place as in an optimizer):

* `zo_perturb/dense`: x + s z over the whole buffer. Impls: `copy` (a plain elementwise pass, -x: the
  bandwidth a memory-bound kernel can reach, measured in the same run), `xla_threefry` / `xla_rbg`
  (XLA's fused `x + s * jax.random.normal(key, x.shape)`, the issue's baseline), `xla_philox` (our Philox
  stream in plain jnp, fused by XLA), `pallas` (the kernel; GPU only) plus a few tilings `pallas_t<tile>_w<warps>`.
* `zo_perturb/masked10`: a block mask selecting 10% of 4096-element blocks (CurvZO's sparse step): the
  kernel skips the unselected tiles, so only the selected 10% move through memory.

Roofline bytes: read + write of the touched elements. The speed-up column is against `copy`: the issue's
GPU target is >= 0.70 (goal >= 0.85) for `pallas` on `dense`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab.kernels.zo_perturb.kernel import BlockSizes
from jaxlab.kernels.zo_perturb.ops import num_blocks, perturb

MASK_BLOCK = 4096
DENSITY = 0.1
GPU_TILINGS = ((1024, 4), (4096, 8), (8192, 8))   # (tile, num_warps) besides the default (2048, 4)


def _accelerator() -> bool:
  return jax.default_backend() in ("gpu", "cuda", "rocm", "tpu")


def _size_dtype():
  return ((1 << 29), jnp.bfloat16) if _accelerator() else ((1 << 22), jnp.float32)


class _InPlace:
  """A donated jitted update applied to a buffer it owns: `call()` replaces the buffer with f(buffer, *rest)."""

  def __init__(self, fn, x, *rest):
    self.jitted = jax.jit(fn, donate_argnums=0)
    self.x = x
    self.rest = rest

  def __call__(self):
    self.x = self.jitted(self.x, *self.rest)
    return self.x

  def lower(self):
    """For the benchmark's memory analysis (temporary bytes of the compiled update)."""
    return self.jitted.lower(self.x, *self.rest)


def _buffer():
  n, dtype = _size_dtype()
  return jax.random.normal(jax.random.key(0), (n,), jnp.float32).astype(dtype)


def _dense_setup():
  scale = jnp.float32(1e-3)
  seed = jnp.uint32(12345)
  key = jax.random.key(1)
  rbg = jax.random.key(1, impl="rbg")
  out = {
      "copy": _InPlace(lambda x: -x, _buffer()),
      "xla_threefry": _InPlace(lambda x, k, s: x + (s * jax.random.normal(k, x.shape)).astype(x.dtype), _buffer(),
                               key, scale),
      "xla_rbg": _InPlace(lambda x, k, s: x + (s * jax.random.normal(k, x.shape)).astype(x.dtype), _buffer(),
                          rbg, scale),
      "xla_philox": _InPlace(lambda x, sd, s: perturb(x, sd, s, impl="xla"), _buffer(), seed, scale),
  }
  if jax.default_backend() in ("gpu", "cuda", "rocm"):
    out["pallas"] = _InPlace(lambda x, sd, s: perturb(x, sd, s, impl="pallas"), _buffer(), seed, scale)
    for tile, warps in GPU_TILINGS:
      bs = BlockSizes(tile=tile, num_warps=warps)
      out[f"pallas_t{tile}_w{warps}"] = _InPlace(
          lambda x, sd, s, bs=bs: perturb(x, sd, s, impl="pallas", block_sizes=bs), _buffer(), seed, scale)
  return {k: (v, ()) for k, v in out.items()}


def _mask():
  n, _ = _size_dtype()
  nb = num_blocks(n, MASK_BLOCK)
  keep = jax.random.bernoulli(jax.random.key(2), DENSITY, (nb,))
  return keep.astype(jnp.float32)


def _masked_setup():
  scale = jnp.float32(1e-3)
  seed = jnp.uint32(7)
  mask = _mask()
  out = {"xla_philox": _InPlace(lambda x, sd, s, m: perturb(x, sd, s, mask=m, block_size=MASK_BLOCK, impl="xla"),
                              _buffer(), seed, scale, mask)}
  if jax.default_backend() in ("gpu", "cuda", "rocm"):
    out["pallas"] = _InPlace(lambda x, sd, s, m: perturb(x, sd, s, mask=m, block_size=MASK_BLOCK, impl="pallas"),
                             _buffer(), seed, scale, mask)
  return {k: (v, ()) for k, v in out.items()}


def _costs(fraction: float):
  n, dtype = _size_dtype()
  item = jnp.dtype(dtype).itemsize
  touched = fraction * n
  # Per element: ~150 integer ops for Philox-4x32-10 (10 rounds of two 16-bit-limb 32x32 products), the log and
  # cos polynomials (~25 float ops) and one sqrt (the only special function).
  return dict(flops=30.0 * touched, bytes=2.0 * item * touched, transcendentals=1.0 * touched,
              shape=f"{n} x {jnp.dtype(dtype).name} ({n * item / 2**30:.3g} GiB)" +
              ("" if fraction == 1.0 else f", {fraction:.0%} of {MASK_BLOCK}-blocks"),
              count=float(n), unit="elem")


BENCHMARKS = [
    dict(name="zo_perturb/dense", setup=_dense_setup, baseline="copy", **_costs(1.0)),
    dict(name="zo_perturb/masked10", setup=_masked_setup, baseline="xla_philox", **_costs(DENSITY)),
]
