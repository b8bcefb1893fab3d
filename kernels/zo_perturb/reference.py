"""Pure-JAX reference of the ZO perturbation `x + scale * w * z` (the spec the Pallas kernel is tested against).

Gaussian directions for zeroth-order optimisers (MeZO / SPSA, sparse ZO, CurvZO) must be regenerated several
times per step (perturb +eps, -2 eps, restore and update) without ever being stored. Here z is a pure function
of (seed, counter): element e of a leaf whose first element has counter `offset` uses counter
c = offset + flat(e), where flat(e) is e's row-major index in the (global, unsharded) leaf. Counters are 64-bit
integers held as two uint32 words (hi, lo); the index inside one leaf must be < 2^32.

Random words: Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
SC 2011; the counter-based generator of cuRAND, PyTorch's CUDA generator and Random123), with the 128-bit
block counter (0, c_lo, 0, c_hi) and the 64-bit key (seed, seed ^ 0x2C1B3C6D) (see `counter_words` for why
the counter words sit in the xor lanes). Each round maps (c0, c1, c2, c3) to

    (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)),   M0 = 0xD2511F53, M1 = 0xCD9E8D57

with the key bumped by (0x9E3779B9, 0xBB67AE85) between rounds; hi/lo are the halves of the 64-bit product,
computed from 16-bit limbs with uint32 arithmetic only (no 64-bit integers), so every impl computes the same
bits. Of the four output words, w0 and w1 make element e's normal: two independent 32-bit words per normal.

Box-Muller, with floats made by bit assembly (no integer-to-float conversion, which is slow on GPUs):
f(w) = bitcast_f32(0x3F800000 | (w >> 9)) in [1, 2) holds the top 23 bits of w,

  u1 = 2 - f(w0) in (0, 1],   u2 = w1 / 2^32 in [0, 1)
  z  = sqrt(-2 log u1) cos(2 pi u2)                                 (|z| <= 5.65)

where the cosine of the angle u2 (in turns) is evaluated from w1's bits by quadrant reduction and a
polynomial (`cos_turn`: +, * and selects only; a library cosine was the most expensive step), and the
logarithm from u1's bits by exponent extraction and a polynomial (`log_unit`: a library logarithm's bits
depend on how the compiler vectorises it); the square root is IEEE (correctly rounded everywhere).

Rounding: every product that is then added to (the polynomials' Horner steps, the step scale * w * z added to
x) passes through `rounded`, a select that only turns -0.0 into +0.0. A compiler cannot contract the
multiply and the add into one fused multiply-add across it, so each product is rounded to the compute dtype
before the addition on every backend and in every evaluation mode (compiled and fused, eager, the Pallas
interpreter): XLA's CPU backend contracts a fused multiply-add where the ops share a fusion, which made a
jitted and an op-by-op evaluation differ by one ulp.

Per-block weights (optional): the flattened leaf is cut into contiguous blocks of `block_size` elements and
w[b] multiplies the step of block b, which is how a Bernoulli block mask or CurvZO's Horvitz-Thompson weights
m_b / pi_b are applied.

Arithmetic: float32 for float32 / bfloat16 / float16 inputs (float64 for float64), rounded to x's dtype at
the end: with delta = (scale * w) * z (delta = scale * z without weights), y = x + delta, except that elements
with delta == 0 (all elements of blocks with w[b] == 0, every element when scale == 0) are returned
unchanged, bit for bit (also -0.0).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

U32 = jnp.uint32
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
PHILOX_ROUNDS = 10
KEY_WORD = 0x2C1B3C6D      # the second key word is seed ^ KEY_WORD: separates this stream from other Philox uses
MAX_LEAF = 2 ** 32


def mulhilo(a, b: int):
  """(high, low) uint32 words of the 64-bit product of uint32 `a` (array) and the constant `b`.

  From 16-bit limbs: a = a1 2^16 + a0, b = b1 2^16 + b0; every partial product fits in 32 bits.
  """
  a = jnp.asarray(a, U32)
  b0, b1 = U32(b & 0xFFFF), U32(b >> 16)
  a0, a1 = a & U32(0xFFFF), a >> 16
  p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
  mid = (p00 >> 16) + (p01 & U32(0xFFFF)) + (p10 & U32(0xFFFF))
  hi = a1 * b1 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
  return hi, a * U32(b)


def philox4x32(counter, key, rounds: int = PHILOX_ROUNDS):
  """Philox-4x32 of a 128-bit counter (4 uint32 arrays, broadcasting) under a 64-bit key (2 uint32 words).

  Returns:
    The four uint32 output words (Random123's philox4x32_R).
  """
  c0, c1, c2, c3 = (jnp.asarray(c, U32) for c in counter)
  k0, k1 = (jnp.asarray(k, U32) for k in key)
  for r in range(rounds):
    if r:
      k0, k1 = k0 + U32(PHILOX_W[0]), k1 + U32(PHILOX_W[1])
    hi0, lo0 = mulhilo(c0, PHILOX_M[0])
    hi1, lo1 = mulhilo(c2, PHILOX_M[1])
    c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
  return c0, c1, c2, c3


def counter_words(seed, hi, lo):
  """(w0, w1): the two words of counter (hi, lo) of stream `seed`.

  Philox-4x32-10 of the block counter (0, lo, 0, hi) under the key (seed, seed ^ KEY_WORD). The counter words
  enter the first round through xors with the key rather than through the multiplies, so every element-sized
  value depends on the seed from the first round on: a compiler cannot hoist part of z out of the
  optimizer's passes (which share counters and differ in the seed-derived scale only) into a stored,
  parameter-sized buffer.
  """
  zero = jnp.zeros((), U32)
  seed = jnp.asarray(seed, U32)
  w = philox4x32((zero, lo, zero, hi), (seed, seed ^ U32(KEY_WORD)))
  return w[0], w[1]


def unit_float(h):
  """float32 in [1, 2) whose mantissa is the top 23 bits of the uint32 `h` (exact, no conversion)."""
  return jax.lax.bitcast_convert_type((h >> 9) | U32(0x3F800000), jnp.float32)


def rounded(p):
  """`p` with -0.0 turned into +0.0: a select that keeps a product from fusing with the addition after it."""
  return jnp.where(p == 0, jnp.zeros_like(p), p)


# Taylor coefficients of cos in x = b^2 (|error| < 1e-8 on [0, pi/2]).
_COS = (1.0, -1.0 / 2, 1.0 / 24, -1.0 / 720, 1.0 / 40320, -1.0 / 3628800, 1.0 / 479001600)


def cos_turn(h):
  """cos(2 pi u) for the angle u = h / 2^32 in turns, from the bits of the uint32 `h` (+-, * only).

  The top two bits pick the quadrant q, the next 23 bits the position t in [0, 1) inside it; with
  b = (pi / 2) t (even q) or (pi / 2)(1 - t) (odd q), cos(2 pi u) = +-cos(b), negative for q in {1, 2}, and
  cos(b) is a degree-12 polynomial (Horner, each product rounded before its addition). Exact integer steps
  and plain float arithmetic, no transcendental call.
  """
  q = h >> 30
  t = unit_float(h << 2) - 1.0
  t = jnp.where((q & U32(1)) == U32(1), 1.0 - t, t)
  b = (0.5 * math.pi) * t
  x = b * b
  c = jnp.full_like(x, _COS[-1])
  for coef in _COS[-2::-1]:
    c = rounded(c * x) + jnp.float32(coef)
  return jnp.where(((q + U32(1)) & U32(2)) == U32(2), -c, c)


# log(1 + f) = f Q(f) on f in [sqrt(1/2) - 1, sqrt(2) - 1]: a Chebyshev fit of degree 9 (max error 3.4e-8 in
# float32 evaluation, the float32 rounding floor there).
_LOG1P = (1.0000000000182154, -0.4999998829414175, 0.3333332402364397, -0.2500158512307875, 0.20002071674548172,
          -0.16609126503821087, 0.14180078722644346, -0.1324084270736458, 0.12914170303831427, -0.0763859239085017)
_LN2 = 0.6931471805599453
_SQRT2 = 1.4142135623730951


def log_unit(u):
  """log(u) of a float32 u in (0, 1] with +, -, * and bit operations only (no library logarithm).

  A library log's bits can depend on how the compiler vectorises it (XLA's CPU log differs between short
  and long arrays), which would make z depend on the array's shape. Here u = 2^e m with m in
  [sqrt(1/2), sqrt(2)) (from u's bits; exact), and log u = e ln 2 + f Q(f), f = m - 1 (exact), each product
  rounded before its addition.
  """
  bits = jax.lax.bitcast_convert_type(u, U32)
  e = (bits >> 23).astype(jnp.int32) - 127
  m = jax.lax.bitcast_convert_type((bits & U32(0x7FFFFF)) | U32(0x3F800000), jnp.float32)   # [1, 2)
  big = m > _SQRT2
  m = jnp.where(big, m * 0.5, m)
  e = e + big.astype(jnp.int32)
  f = m - 1.0
  q = jnp.full_like(f, _LOG1P[-1])
  for coef in _LOG1P[-2::-1]:
    q = rounded(q * f) + jnp.float32(coef)
  return rounded(e.astype(jnp.float32) * jnp.float32(_LN2)) + rounded(q * f)


def box_muller(w0, w1):
  """A float32 standard normal from two uint32 words: sqrt(-2 log u1) cos(2 pi u2)."""
  u1 = 2.0 - unit_float(w0)
  return jnp.sqrt(-2.0 * log_unit(u1)) * cos_turn(w1)


def split_offset(offset) -> tuple[jax.Array, jax.Array]:
  """(hi, lo) uint32 words of a counter offset: a Python int in [0, 2^64) or a traced scalar < 2^32."""
  if isinstance(offset, (int, np.integer)):
    offset = int(offset)
    if not 0 <= offset < 2 ** 64:
      raise ValueError(f"zo_perturb: offset must be in [0, 2^64), got {offset}")
    return jnp.asarray(offset >> 32, U32), jnp.asarray(offset & 0xFFFFFFFF, U32)
  return jnp.zeros((), U32), jnp.asarray(offset).astype(U32)


def normal_at(seed, off_hi, off_lo, flat, may_carry: bool = True):
  """z at within-leaf flat indices `flat` (uint32 array) for a leaf starting at counter (off_hi, off_lo).

  The 64-bit counter is (off_hi, off_lo) + flat; a carry out of the low word adds one to the high word.
  `may_carry=False` asserts that off_lo + flat never wraps (the result is the same, computed faster).
  """
  seed = jnp.asarray(seed, U32)
  off_lo = jnp.asarray(off_lo, U32)
  lo = off_lo + flat
  hi = jnp.asarray(off_hi, U32)
  if may_carry:
    hi = hi + (lo < off_lo).astype(U32)
  return box_muller(*counter_words(seed, hi, lo))


def may_carry(offset, size: int) -> bool:
  """False when the low counter word provably never wraps inside a leaf of `size` at `offset`."""
  if isinstance(offset, (int, np.integer)):
    return (int(offset) & 0xFFFFFFFF) + max(int(size) - 1, 0) >= 2 ** 32
  return True


def flat_index(shape: Sequence[int]) -> jax.Array:
  """uint32 row-major flat index of every element of `shape`."""
  n = math.prod(shape)
  if n > MAX_LEAF:
    raise ValueError(f"zo_perturb: a leaf must have < 2^32 elements, got shape {tuple(shape)}")
  return jax.lax.iota(U32, n).reshape(shape) if n else jnp.zeros(shape, U32)


def normal(shape: Sequence[int], seed, offset=0, dtype=jnp.float32) -> jax.Array:
  """The z that `perturb` adds: z[e] = N(seed, offset + flat(e)), float32 (cast to `dtype`).

  Args:
    shape: leaf shape.
    seed: uint32 scalar (Python int or traced).
    offset: counter of element 0 (Python int < 2^64, or a traced scalar < 2^32).
    dtype: output dtype.
  """
  hi, lo = split_offset(offset)
  return normal_at(seed, hi, lo, flat_index(tuple(shape))).astype(dtype)


def compute_dtype(dtype) -> jnp.dtype:
  """float64 for float64 leaves, float32 otherwise."""
  return jnp.dtype(jnp.float64) if jnp.dtype(dtype) == jnp.float64 else jnp.dtype(jnp.float32)


def perturb_at(x, seed, scale, off_hi, off_lo, flat, mask=None, block_size: int | None = None,
               may_carry: bool = True):
  """`x + scale * w[flat // block_size] * z(seed, offset + flat)` for explicit flat indices (any shape).

  Args:
    x: float array.
    seed: uint32 scalar.
    scale: float scalar.
    off_hi, off_lo: uint32 words of the leaf's counter offset.
    flat: uint32 array broadcastable to x.shape: within-leaf (global, unsharded) flat index of each element.
    mask: optional (num_blocks,) float/bool per-block weights; blocks are `block_size` consecutive elements
      of the flattened global leaf.
    block_size: elements per block (required with `mask`).
    may_carry: see `normal_at`.

  Returns:
    Array of x's shape and dtype.
  """
  cdt = compute_dtype(x.dtype)
  z = normal_at(seed, off_hi, off_lo, flat, may_carry).astype(cdt)
  x32 = x.astype(cdt)
  scale = jnp.asarray(scale, cdt)
  if mask is None:
    return apply_step(x32, scale * z).astype(x.dtype)
  w = jnp.asarray(mask).astype(cdt)[(flat // U32(block_size)).astype(jnp.int32)]
  return apply_step(x32, (scale * w) * z).astype(x.dtype)


def apply_step(x, delta):
  """x + delta (delta rounded first), except x itself (bit for bit, also -0.0) where delta == 0 (masked-out
  blocks, scale 0)."""
  return jnp.where(delta == 0, x, x + rounded(delta))


def perturb_ref(x, seed, scale, *, mask=None, block_size: int | None = None, offset=0):
  """The spec: `x + scale * w * z` with z = `normal(x.shape, seed, offset)` (see the module docstring)."""
  hi, lo = split_offset(offset)
  return perturb_at(x, seed, scale, hi, lo, flat_index(x.shape), mask, block_size, may_carry(offset, x.size))
