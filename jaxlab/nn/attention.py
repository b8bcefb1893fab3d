"""Softmax attention with one entry point and several implementations (`attention(..., impl=...)`).

Every implementation computes the same function: with q (batch, L, n_heads, d), k and v (batch, S,
n_kv_heads, d) (grouped-query: query head j reads kv head j // (n_heads // n_kv_heads)),

    out[b, i, j] = sum_t softmax_t(q[b, i, j] . k[b, t, j'] / sqrt(d) | mask[b, i, t]) v[b, t, j']

where query i may attend key t iff (not causal or t <= i) and segment_ids[b, i] == kv_segment_ids[b, t]
(block-diagonal causal attention over PACKED sequences), and-ed with an explicit `mask` when one is given.
Scores, the softmax and its statistics are float32 whatever the input dtype; the output has v's dtype.

Implementations (`IMPLS`):

* "xla": the reference; einsum scores (batch, heads, L, S) in float32, any mask. Materialises (L, S).
* "chunked": online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022) in plain XLA:
  queries in blocks of `chunk` (`lax.map`), keys in blocks of `chunk` (`lax.scan`); the query blocks and the
  key steps are under `jax.checkpoint`, so the backward pass recomputes scores instead of storing them.
  Memory is O(batch * heads * (chunk^2 + L * d)) on any backend (one forward more in the backward pass); for
  long sequences on CPU, or where no kernel fits.
  Causal blocks above the diagonal are skipped with `lax.cond`.
* "splash": TPU splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`), causal mask and
  segment ids inside the kernel; grouped-query heads through its multi-query kernel mapped over kv heads.
  Needs L == S, both multiples of the block (128 by default).
* "flash_gpu": jax's Pallas (Triton) flash attention for GPUs
  (`jax.experimental.pallas.ops.gpu.attention.mha`) with segment ids; kv heads are repeated to the query
  heads (the kernel has no grouped-query indexing). Needs L == S, a multiple of the block.
* "cudnn": cuDNN's fused attention (`jax.nn.dot_product_attention(implementation="cudnn")`); GPU only,
  16-bit inputs, causal or no mask WITHOUT segment ids (the public API has none).
* "auto": per backend and call: TPU -> splash, GPU -> cudnn when it supports the call, else flash_gpu, CPU ->
  xla up to `AUTO_CHUNK_LENGTH` keys and chunked beyond; any call a kernel cannot take (an explicit mask,
  L != S, lengths not a multiple of the block) falls back to xla.

The Pallas kernels run in interpret mode (`interpret=True`) on CPU, which the tests use to check them
against "xla" (forward and gradients); they are cross-lowered to Mosaic / Triton IR without the hardware.
Under a multi-device mesh in context (`jaxlab.mesh.use`), a kernel impl runs per shard in `jax.shard_map`,
batch over the axes of logical "batch" and heads over those of "heads" when both head counts divide.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxlab import mesh as mesh_lib

IMPLS = ("auto", "xla", "chunked", "splash", "flash_gpu", "cudnn")
AUTO_CHUNK_LENGTH = 4096     # "auto" on CPU: beyond this many keys, the chunked path (no (L, S) scores)
DEFAULT_CHUNK = 512
DEFAULT_BLOCK = 128
_NEG = -0.7 * float(np.finfo(np.float32).max)     # masked score: exp(-huge - max) == 0, no inf - inf NaN


def make_mask(length: int, kv_length: int, segment_ids=None, kv_segment_ids=None, causal: bool = True,
              mask=None):
  """The boolean attention mask (batch or 1, L, S) of the module docstring, or None (attend everywhere)."""
  out = None
  if causal:
    out = (jnp.arange(kv_length)[None, :] <= jnp.arange(length)[:, None])[None]
  if segment_ids is not None:
    kv = segment_ids if kv_segment_ids is None else kv_segment_ids
    seg = jnp.asarray(segment_ids)[:, :, None] == jnp.asarray(kv)[:, None, :]
    out = seg if out is None else out & seg
  if mask is not None:
    out = mask if out is None else out & mask
  return out


def xla_attention(q_blhd, k_bshd, v_bshd, mask_bls):
  """Grouped-query softmax attention (the reference), scores and softmax in float32.

  Args:
    q_blhd: (batch, L, n_heads, d) queries.
    k_bshd, v_bshd: (batch, S, n_kv_heads, d).
    mask_bls: boolean, broadcastable to (batch, L, S); True = attend. None = no mask.

  Returns:
    (batch, L, n_heads, d) in v's dtype.
  """
  b, l, h, d = q_blhd.shape
  hk = k_bshd.shape[2]
  q = q_blhd.reshape(b, l, hk, h // hk, d)
  s = jnp.einsum("blkgd,bskd->bkgls", q, k_bshd.astype(q.dtype), preferred_element_type=jnp.float32)
  s = s * (1.0 / math.sqrt(d))
  if mask_bls is not None:
    s = jnp.where(mask_bls[:, None, None], s, _NEG)
  p = jax.nn.softmax(s, axis=-1)
  o = jnp.einsum("bkgls,bskd->blkgd", p.astype(v_bshd.dtype), v_bshd)
  return o.reshape(b, l, h, d)


def attention(q, k, v, *, segment_ids=None, kv_segment_ids=None, causal: bool = True, mask=None,
              impl: str = "auto", chunk: int = DEFAULT_CHUNK, block: int | None = None,
              interpret: bool | None = None):
  """Softmax attention (see the module docstring for the function and the implementations).

  Args:
    q: (batch, L, n_heads, head_dim) queries.
    k, v: (batch, S, n_kv_heads, head_dim); n_kv_heads divides n_heads.
    segment_ids: (batch, L) int ids of the query tokens' sequences (packing); None = one segment.
    kv_segment_ids: (batch, S) ids of the keys; None = `segment_ids` (self-attention).
    causal: query i attends keys t <= i only.
    mask: optional extra boolean mask broadcastable to (batch, L, S) (xla and chunked only).
    impl: one of `IMPLS`.
    chunk: query / key block of "chunked".
    block: kernel block of "splash" / "flash_gpu" (default 128, or the length when shorter).
    interpret: run a Pallas kernel in interpret mode (default: when the backend is CPU).

  Returns:
    (batch, L, n_heads, head_dim) in v's dtype.

  Raises:
    ValueError: bad shapes, an unknown impl, or an impl that cannot take this call (says why).
  """
  q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
  _check(q, k, v, segment_ids, kv_segment_ids, impl)
  name = _resolve(impl, q, k, v, segment_ids, kv_segment_ids, causal, mask, block)
  if name == "xla":
    return xla_attention(q, k, v, make_mask(q.shape[1], k.shape[1], segment_ids, kv_segment_ids, causal, mask))
  if name == "chunked":
    return chunked_attention(q, k, v, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids, causal=causal,
                             mask=mask, chunk=chunk)
  why = _kernel_refusal(name, q, k, v, segment_ids, kv_segment_ids, mask, block)
  if why:
    raise ValueError(f"attention: impl={name!r} cannot take this call: {why}; use impl='xla' or 'chunked'")
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  if name == "cudnn":
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
  fn = functools.partial(_splash if name == "splash" else _flash_gpu, causal=bool(causal),
                         block=_block(q.shape[1], block), interpret=bool(interpret))
  return _per_shard(fn, q, k, v, segment_ids)


# ------------------------------------------------------------------------------------------- checks


def _check(q, k, v, segment_ids, kv_segment_ids, impl):
  if impl not in IMPLS:
    raise ValueError(f"attention: impl={impl!r} is not one of {IMPLS}")
  if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
    raise ValueError(f"attention: q must be (batch, L, heads, d) and k, v (batch, S, kv_heads, d) of one shape; "
                     f"got q {q.shape}, k {k.shape}, v {v.shape}")
  if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] % k.shape[2]:
    raise ValueError(f"attention: q {q.shape} and k {k.shape} need the same batch and head_dim, and kv heads "
                     "that divide the query heads")
  for name, ids, n in (("segment_ids", segment_ids, q.shape[1]), ("kv_segment_ids", kv_segment_ids, k.shape[1])):
    if ids is not None and tuple(jnp.shape(ids)) != (q.shape[0], n):
      raise ValueError(f"attention: {name} must be (batch, {n}), got {tuple(jnp.shape(ids))}")


def _block(length: int, block: int | None) -> int:
  return min(DEFAULT_BLOCK if block is None else int(block), length)


def _kernel_refusal(name, q, k, v, segment_ids, kv_segment_ids, mask, block) -> str:
  """Why kernel `name` cannot take the call ("" when it can)."""
  l, s = q.shape[1], k.shape[1]
  if mask is not None:
    return "an explicit mask is given (the kernels take causal and segment ids only)"
  if kv_segment_ids is not None:
    return "kv_segment_ids differ from the query's (the kernels do self-attention)"
  if l != s:
    return f"query length {l} != key length {s}"
  if name == "cudnn":
    if segment_ids is not None:
      return "segment ids are given (jax.nn.dot_product_attention has none; use 'flash_gpu')"
    if q.dtype not in (jnp.bfloat16, jnp.float16):
      return f"cuDNN takes bfloat16/float16 inputs, got {q.dtype}"
    return ""
  b = _block(l, block)
  if l % b:
    return f"length {l} is not a multiple of the block {b}"
  return ""


def _resolve(impl, q, k, v, segment_ids, kv_segment_ids, causal, mask, block) -> str:
  if impl != "auto":
    return impl
  backend = jax.default_backend()
  fits = lambda name: not _kernel_refusal(name, q, k, v, segment_ids, kv_segment_ids, mask, block)  # noqa: E731
  if backend == "tpu" and fits("splash"):
    return "splash"
  if backend == "gpu":
    if fits("cudnn"):
      return "cudnn"
    if fits("flash_gpu"):
      return "flash_gpu"
  return "chunked" if k.shape[1] > AUTO_CHUNK_LENGTH else "xla"


# ------------------------------------------------------------------------------------------- chunked


def chunked_attention(q, k, v, *, segment_ids=None, kv_segment_ids=None, causal=True, mask=None,
                      chunk: int = DEFAULT_CHUNK):
  """Online-softmax attention in blocks (the "chunked" impl; arguments as `attention`).

  A query whose every key is masked gets a zero output (the "xla" reference averages v there instead;
  causal self-attention never has such a row).
  """
  b, l, h, d = q.shape
  s, hk = k.shape[1], k.shape[2]
  g = h // hk
  cq, ck = min(chunk, l), min(chunk, s)
  nq, nk = -(-l // cq), -(-s // ck)
  pad = lambda x, n, axis: jnp.pad(x, [(0, n - x.shape[axis]) if i == axis else (0, 0)  # noqa: E731
                                       for i in range(x.ndim)])
  qseg = jnp.zeros((b, l), jnp.int32) if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
  kseg = qseg if kv_segment_ids is None else jnp.asarray(kv_segment_ids, jnp.int32)
  if segment_ids is None and kv_segment_ids is None:
    kseg = jnp.zeros((b, s), jnp.int32)
  full = None if mask is None else jnp.broadcast_to(mask, (b, l, s))
  qb = pad(q, nq * cq, 1).reshape(b, nq, cq, hk, g, d).transpose(1, 0, 2, 3, 4, 5)
  qsb = pad(qseg, nq * cq, 1).reshape(b, nq, cq).transpose(1, 0, 2)
  kb = pad(k, nk * ck, 1).reshape(b, nk, ck, hk, d).transpose(1, 0, 2, 3, 4)
  vb = pad(v, nk * ck, 1).reshape(b, nk, ck, hk, d).transpose(1, 0, 2, 3, 4)
  ksb = pad(kseg, nk * ck, 1).reshape(b, nk, ck).transpose(1, 0, 2)
  mb = None if full is None else pad(pad(full, nq * cq, 1), nk * ck, 2).reshape(b, nq, cq, nk, ck)
  scale = 1.0 / math.sqrt(d)

  def q_block(args):
    qi, q_, qs_ = args                                         # (b, cq, hk, g, d), (b, cq)
    qpos = qi * cq + jnp.arange(cq)

    def visible(kj):
      kpos = kj * ck + jnp.arange(ck)
      m = (kpos < s)[None, None, :] & (qs_[:, :, None] == ksb[kj][:, None, :])
      if causal:
        m = m & (kpos[None, None, :] <= qpos[None, :, None])
      if mb is not None:
        m = m & jax.lax.dynamic_index_in_dim(mb[:, qi], kj, axis=2, keepdims=False)
      return m                                                  # (b, cq, ck)

    def update(carry, kj):
      o, mx, den = carry                                        # (b,hk,g,cq,d), (b,hk,g,cq), (b,hk,g,cq)
      sc = jnp.einsum("bqkgd,bskd->bkgqs", q_, kb[kj].astype(q_.dtype), preferred_element_type=jnp.float32)
      msk = visible(kj)[:, None, None]
      sc = jnp.where(msk, sc * scale, _NEG)
      new = jnp.maximum(mx, sc.max(-1))
      p = jnp.where(msk, jnp.exp(sc - new[..., None]), 0.0)
      corr = jnp.exp(mx - new)
      pv = jnp.einsum("bkgqs,bskd->bkgqd", p.astype(v.dtype), vb[kj], preferred_element_type=jnp.float32)
      return o * corr[..., None] + pv, new, den * corr + p.sum(-1)

    def step(carry, kj):
      if causal:   # key blocks wholly above the diagonal change nothing
        carry = jax.lax.cond(kj * ck <= qi * cq + cq - 1, update, lambda c, _: c, carry, kj)
      else:
        carry = update(carry, kj)
      return carry, None

    init = (jnp.zeros((b, hk, g, cq, d), jnp.float32), jnp.full((b, hk, g, cq), _NEG, jnp.float32),
            jnp.zeros((b, hk, g, cq), jnp.float32))
    (o, _, den), _ = jax.lax.scan(jax.checkpoint(step, prevent_cse=False), init, jnp.arange(nk))
    o = jnp.where(den[..., None] > 0, o / jnp.where(den > 0, den, 1.0)[..., None], 0.0)
    return o.transpose(0, 3, 1, 2, 4)                           # (b, cq, hk, g, d)

  # The backward of a query block recomputes its scan (whose per-step carries are O(cq * d)), so no more than one
  # block's carries are alive at a time.
  out = jax.lax.map(jax.checkpoint(q_block, prevent_cse=False), (jnp.arange(nq), qb, qsb))   # (nq, b, cq, hk, g, d)
  out = out.transpose(1, 0, 2, 3, 4, 5).reshape(b, nq * cq, h, d)[:, :l]
  return out.astype(v.dtype)


# ------------------------------------------------------------------------------------------- kernels


def _per_shard(fn, q, k, v, segment_ids):
  """Runs kernel `fn(q, k, v, segment_ids)` per shard of the mesh in context (batch and heads split)."""
  b, h, hk = q.shape[0], q.shape[2], k.shape[2]
  batch_ax = mesh_lib.dividing_axes("batch", b)
  head_ax = mesh_lib.dividing_axes("heads", h)
  if head_ax is not None and mesh_lib.dividing_axes("heads", hk) != head_ax:
    head_ax = None                                  # kv heads must split the same way to keep groups local
  if batch_ax is None and head_ax is None:
    return fn(q, k, v, segment_ids)
  spec = P(batch_ax, None, head_ax, None)
  seg_spec = P(batch_ax, None)
  if segment_ids is None:
    local = lambda q_, k_, v_: fn(q_, k_, v_, None)  # noqa: E731
    return jax.shard_map(local, mesh=mesh_lib.current_mesh(), in_specs=(spec, spec, spec), out_specs=spec,
                         check_vma=False)(q, k, v)
  return jax.shard_map(fn, mesh=mesh_lib.current_mesh(), in_specs=(spec, spec, spec, seg_spec), out_specs=spec,
                       check_vma=False)(q, k, v, jnp.asarray(segment_ids, jnp.int32))


def _splash(q, k, v, segment_ids, *, causal, block, interpret):
  """TPU splash attention: the multi-query kernel over each kv head's group of query heads."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm  # pylint: disable=g-import-not-at-top
  b, l, h, d = q.shape
  hk = k.shape[2]
  g = h // hk
  one = sm.CausalMask((l, l)) if causal else sm.FullMask((l, l))
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  kernel = sk.make_splash_mqa(sm.MultiHeadMask([one] * g), head_shards=1, q_seq_shards=1, block_sizes=sizes,
                              interpret=interpret)
  qs = (q.astype(jnp.float32) * (1.0 / math.sqrt(d))).astype(q.dtype)
  qs = qs.reshape(b, l, hk, g, d).transpose(0, 2, 3, 1, 4)        # (b, hk, g, l, d)
  kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)        # (b, hk, l, d)
  if segment_ids is None:
    per_head = jax.vmap(lambda q_, k_, v_: kernel(q_, k_, v_))
    out = jax.vmap(per_head)(qs, kt, vt)
  else:
    seg = jnp.asarray(segment_ids, jnp.int32)
    per_head = jax.vmap(lambda q_, k_, v_, s_: kernel(q_, k_, v_, segment_ids=sk.SegmentIds(q=s_, kv=s_)),
                        in_axes=(0, 0, 0, None))
    out = jax.vmap(per_head)(qs, kt, vt, seg)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, l, h, d).astype(v.dtype)


def _flash_gpu(q, k, v, segment_ids, *, causal, block, interpret):
  """jax's Pallas GPU (Triton) flash attention; kv heads repeated to the query heads."""
  from jax.experimental.pallas.ops.gpu import attention as gpu_attention  # pylint: disable=g-import-not-at-top
  h, hk, d = q.shape[2], k.shape[2], q.shape[3]
  if hk != h:
    k, v = jnp.repeat(k, h // hk, axis=2), jnp.repeat(v, h // hk, axis=2)
  sizes = gpu_attention.BlockSizes(block_q=block, block_k=block, block_q_dkv=block, block_kv_dkv=block,
                                   block_q_dq=block, block_kv_dq=block)
  seg = None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
  out = gpu_attention.mha(q, k.astype(q.dtype), v.astype(q.dtype), seg, sm_scale=1.0 / math.sqrt(d),
                          causal=causal, block_sizes=sizes, interpret=interpret)
  return out.astype(v.dtype)
