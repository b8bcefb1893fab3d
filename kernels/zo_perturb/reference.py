"""Pure-JAX reference of the ZO perturbation `x + scale * w * z` (the spec the Pallas kernel is tested against).

Gaussian directions for zeroth-order optimisers (MeZO / SPSA, sparse ZO, CurvZO) must be regenerated several
times per step (perturb +eps, -2 eps, restore and update) without ever being stored. Here z is a pure function
of (seed, counter): element e of a leaf whose first element has counter `offset` uses counter
c = offset + flat(e), where flat(e) is e's row-major index in the (global, unsharded) leaf. Counters are 64-bit
integers held as two uint32 words (hi, lo); the index inside one leaf must be < 2^32.

Hash (uint32 arithmetic only, so every impl computes the same bits):

  mix(h)    = h ^= h >> 16; h *= 0x7FEB352D; h ^= h >> 15; h *= 0x846CA68B; h ^= h >> 16   (a bijection)
  key(s, hi) = mix(s ^ mix(hi * 0x9E3779B9 + 0x632BE5AB))        one per (seed, high word)
  key2(k)   = mix(k ^ 0x5851F42D) | 1
  h1 = mix(lo ^ key),   h2 = (h1 ^ key2) * 0x2C1B3C6D              two 32-bit words per counter

Box-Muller, with floats made by bit assembly (no integer-to-float conversion, which is slow on GPUs):
f(h) = bitcast_f32(0x3F800000 | (h >> 9)) in [1, 2) holds the top 23 bits of h,

  u1 = 2 - f(h1) in (0, 1],   u2 = (h2 >> 7) 2^-25 in [0, 1)
  z  = sqrt(-2 log u1) cos(2 pi u2)                                 (|z| <= 5.65)

where the cosine of the angle u2 (in turns) is evaluated from h2's bits by quadrant reduction and a
polynomial (`cos_turn`: +, * and selects only; a library cosine was the most expensive step).

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
_GOLDEN = 0x9E3779B9
_M1, _M2, _M3 = 0x7FEB352D, 0x846CA68B, 0x2C1B3C6D
_HI_SALT, _KEY2_SALT = 0x632BE5AB, 0x5851F42D
MAX_LEAF = 2 ** 32


def mix32(h):
  """A 32-bit integer bijection with good avalanche (xor-shift / multiply finaliser); uint32 in and out."""
  h = h ^ (h >> 16)
  h = h * U32(_M1)
  h = h ^ (h >> 15)
  h = h * U32(_M2)
  return h ^ (h >> 16)


def stream_key(seed, hi):
  """uint32 key of a (seed, counter high word) pair (broadcasting)."""
  hi = jnp.asarray(hi, U32)
  return mix32(jnp.asarray(seed, U32) ^ mix32(hi * U32(_GOLDEN) + U32(_HI_SALT)))


def second_key(key):
  """The odd uint32 that decorrelates the second word from the first."""
  return mix32(jnp.asarray(key, U32) ^ U32(_KEY2_SALT)) | U32(1)


def hash_words(key, key2, lo):
  """(h1, h2) uint32 words of counter low word `lo` under (key, key2)."""
  h1 = mix32(jnp.asarray(lo, U32) ^ key)
  h2 = (h1 ^ key2) * U32(_M3)
  return h1, h2


def unit_float(h):
  """float32 in [1, 2) whose mantissa is the top 23 bits of the uint32 `h` (exact, no conversion)."""
  return jax.lax.bitcast_convert_type((h >> 9) | U32(0x3F800000), jnp.float32)


# Taylor coefficients of cos in x = b^2 (|error| < 1e-8 on [0, pi/2]).
_COS = (1.0, -1.0 / 2, 1.0 / 24, -1.0 / 720, 1.0 / 40320, -1.0 / 3628800, 1.0 / 479001600)


def cos_turn(h):
  """cos(2 pi u) for the angle u = h / 2^32 in turns, from the bits of the uint32 `h` (+-, * only).

  The top two bits pick the quadrant q, the next 23 bits the position t in [0, 1) inside it; with
  b = (pi / 2) t (even q) or (pi / 2)(1 - t) (odd q), cos(2 pi u) = +-cos(b), negative for q in {1, 2}, and
  cos(b) is a degree-12 polynomial. Exact integer steps and plain float arithmetic, no transcendental call.
  """
  q = h >> 30
  t = unit_float(h << 2) - 1.0
  t = jnp.where((q & U32(1)) == U32(1), 1.0 - t, t)
  b = (0.5 * math.pi) * t
  x = b * b
  c = jnp.float32(_COS[-1])
  for coef in _COS[-2::-1]:
    c = c * x + jnp.float32(coef)
  return jnp.where(((q + U32(1)) & U32(2)) == U32(2), -c, c)


def box_muller(h1, h2):
  """A float32 standard normal from two uint32 words: sqrt(-2 log u1) cos(2 pi u2)."""
  u1 = 2.0 - unit_float(h1)
  return jnp.sqrt(-2.0 * jnp.log(u1)) * cos_turn(h2)


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

  The 64-bit counter is (off_hi, off_lo) + flat; a carry out of the low word selects the next high word.
  `may_carry=False` asserts that off_lo + flat never wraps (the result is the same, computed faster).
  """
  seed = jnp.asarray(seed, U32)
  lo = jnp.asarray(off_lo, U32) + flat
  k0 = stream_key(seed, off_hi)
  if not may_carry:
    return box_muller(*hash_words(k0, second_key(k0), lo))
  carry = lo < jnp.asarray(off_lo, U32)
  k1 = stream_key(seed, jnp.asarray(off_hi, U32) + U32(1))
  key = jnp.where(carry, k1, k0)
  key2 = jnp.where(carry, second_key(k1), second_key(k0))
  return box_muller(*hash_words(key, key2, lo))


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
  """x + delta, except x itself (bit for bit, also -0.0) where delta == 0 (masked-out blocks, scale 0)."""
  return jnp.where(delta == 0, x, x + delta)


def perturb_ref(x, seed, scale, *, mask=None, block_size: int | None = None, offset=0):
  """The spec: `x + scale * w * z` with z = `normal(x.shape, seed, offset)` (see the module docstring)."""
  hi, lo = split_offset(offset)
  return perturb_at(x, seed, scale, hi, lo, flat_index(x.shape), mask, block_size, may_carry(offset, x.size))
