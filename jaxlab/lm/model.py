"""Decoder-only transformer language models (Flax NNX): Llama/Qwen2-style and OPT-style, with a KV cache.

Architectures (`TransformerConfig.arch`), with h the (batch, length, hidden) residual stream:

* "llama" (Hugging Face `LlamaForCausalLM`, `Qwen2ForCausalLM`; Touvron et al. 2023, Qwen2 2024)::

      h_0 = E[tokens]                                        E: (vocab, hidden)
      h   = h + Attn(RMSNorm(h))                             per layer, pre-norm
      h   = h + W_down (act(x W_gate) * (x W_up)),  x = RMSNorm(h)         act = SiLU (SwiGLU)
      logits = RMSNorm(h_L) W_head                           W_head = E^T when tied
      RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w             statistics in float32

  Attention with grouped-query heads (GQA: query head j reads kv head j // (n_heads / n_kv_heads)) and
  rotary position embeddings in the rotate-half convention of the HF checkpoints (no weight permutation):
  with theta_i = rope_theta^(-2i / head_dim), i < head_dim / 2, and x = (x1, x2) split in halves,
  RoPE(x, p) = (x1 cos(p theta) - x2 sin(p theta), x2 cos(p theta) + x1 sin(p theta)) applied to q and k;
  Attn(x) = softmax(RoPE(q) RoPE(k)^T / sqrt(head_dim) + mask) v W_o, q = x W_q (+ b_q), k, v alike.
  Qwen2 = llama with q/k/v biases (`qkv_bias=True`). Optional "llama3" / "linear" RoPE frequency scaling.

* "opt" (Hugging Face `OPTForCausalLM`; Zhang et al. 2022)::

      h_0 = E[tokens] (W_in) + P[positions + 2]              learned positions, OPT's offset of 2
      pre-LN  (do_layer_norm_before): h = h + Attn(LN(h));  h = h + fc2(ReLU(fc1(LN(h))));  final LN
      post-LN (OPT-350m):             h = LN(h + Attn(h));  h = LN(h + fc2(ReLU(fc1(h))));  no final LN
      logits = (h (W_out)) E^T                               W_in / W_out only when word_embed_proj_dim != hidden

  Attention as above without RoPE, with biases on q, k, v, o and the MLP.

Masks. Without a cache, query i attends key j iff j <= i and segment_ids[i] == segment_ids[j] (block-diagonal
causal attention for PACKED sequences; with segment_ids=None every token is in one segment). With a cache
(`KVCache`), the new tokens are written at slots cache_index .. cache_index + length - 1 and query slot s
attends cache slot t iff t <= s and cache.segment_ids[t] == segment_ids of the query; slot segment id 0 marks
empty slots and padding, so a LEFT-PADDED batch gives its pad tokens segment 0 and real tokens segment 1.

Parameters are `param_dtype` (float32 by default) with logical axis names for `jaxlab.mesh` sharding rules
("vocab", "embed" = hidden, "mlp" = MLP hidden, "heads" = query heads, "kv" = kv heads); compute runs in
`dtype`; softmax, norms and RoPE run in float32 and logits are float32. The layers are the shared ones of
`jaxlab.nn.layers`: projections are flax `nnx.Linear` / `nnx.LinearGeneral`, embeddings `nnx.Embed`, the
norms ours (RMSNorm with Hugging Face Llama's rounding, torch-style LayerNorm).

Reconstructed (not fixed by the papers): parameter init N(0, init_std) for every matrix (HF's
`initializer_range` convention), zero biases, unit norms; the (hidden, heads, head_dim) kernel layout; float32
logits for any compute dtype.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.kernels import sharding
from jaxlab.nn import attention as attention_lib
from jaxlab.nn import layers

ARCHS = ("llama", "opt")
ACTIVATIONS = ("silu", "relu", "gelu", "gelu_tanh")
ATTENTION_IMPLS = attention_lib.IMPLS
SCAN_MIN_LAYERS = 4          # scan_layers=None scans from this depth on
LAYERS_AXIS = layers.LAYERS_AXIS
ACTIVATION_AXES = ("batch", "length", "embed")   # logical names of the residual stream
REMAT_POLICIES = layers.REMAT_POLICIES
constrain = layers.constrain
stack_blocks = layers.stack_blocks


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Architecture of a `Transformer` (frozen and hashable: it is static model metadata).

  Attributes:
    vocab_size: number of token ids; logits have this many columns.
    hidden: residual width.
    n_layers: number of blocks.
    n_heads: number of query heads.
    mlp_hidden: MLP inner width (Llama `intermediate_size`, OPT `ffn_dim`).
    arch: "llama" (RMSNorm, RoPE, gated MLP) or "opt" (LayerNorm, learned positions, plain MLP).
    n_kv_heads: number of key/value heads (GQA); None = n_heads. Must divide n_heads.
    head_dim: per-head width; None = hidden // n_heads.
    max_position: longest supported position (OPT: rows of the position table minus `pos_offset`).
    rope_theta: RoPE base (llama).
    rope_scaling: None, or RoPE frequency scaling as sorted (key, value) pairs (a dict is converted):
      {"rope_type": "linear", "factor": f} or {"rope_type": "llama3", "factor", "low_freq_factor",
      "high_freq_factor", "original_max_position_embeddings"}.
    norm_eps: epsilon of RMSNorm / LayerNorm.
    qkv_bias: q/k/v projections have biases (Qwen2, OPT).
    o_bias: the attention output projection has a bias (OPT; Llama with attention_bias).
    mlp_bias: the MLP projections have biases (OPT).
    tie_embeddings: the output head is the transposed token embedding.
    activation: MLP nonlinearity: "silu" (Llama SwiGLU), "relu" (OPT), "gelu", "gelu_tanh"; None picks
      the architecture's default.
    dtype: compute dtype name ("float32", "bfloat16", "float16").
    param_dtype: parameter dtype name.
    remat: wrap each block in `jax.checkpoint` (rematerialise its activations in the backward pass) when
      called without a cache.
    remat_policy: name of a `jax.checkpoint_policies` policy used by `remat`: "nothing_saveable" (full
      remat: only block inputs are kept), "dots_saveable" (matmul outputs kept, elementwise work recomputed),
      "dots_with_no_batch_dims_saveable", "everything_saveable" (remat=False is "none").
    scan_layers: keep the blocks' parameters stacked on a leading "layers" axis (`layers/attn/q/kernel` of
      shape (n_layers, hidden, heads, head_dim)) and run them with `jax.lax.scan`: one block is traced and
      compiled whatever the depth. None (default): True when n_layers >= 4. The initial values equal the
      unrolled model's (the blocks are created one by one and stacked), and so do the logits.
    attention: implementation of the un-cached (training / prefill) attention, one of
      `jaxlab.nn.attention.IMPLS`: "auto" (TPU splash, GPU cuDNN or Pallas flash attention with segment ids,
      CPU einsum; "xla" wherever a kernel does not fit the call), "xla" (einsum, the reference), "chunked"
      (online softmax, no (L, L) scores), "splash", "flash_gpu", "cudnn". Cached decoding always uses
      "xla" (its mask is over cache slots).
    init_std: standard deviation of the normal init of embeddings and projection matrices.
    pos_offset: OPT's learned-position offset (row p + pos_offset holds position p).
    do_layer_norm_before: OPT pre-LN (True) or post-LN (False, OPT-350m).
    word_embed_proj_dim: OPT embedding width; None = hidden. Otherwise tokens are embedded at this width
      and projected in/out (`project_in` / `project_out`, OPT-350m).
    final_norm: OPT: apply the decoder's final LayerNorm; None = do_layer_norm_before (HF's rule).
  """
  vocab_size: int
  hidden: int
  n_layers: int
  n_heads: int
  mlp_hidden: int
  arch: str = "llama"
  n_kv_heads: int | None = None
  head_dim: int | None = None
  max_position: int = 2048
  rope_theta: float = 10000.0
  rope_scaling: Any = None
  norm_eps: float = 1e-5
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  tie_embeddings: bool = False
  activation: str | None = None
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False
  remat_policy: str = "nothing_saveable"
  scan_layers: bool | None = None
  attention: str = "auto"
  init_std: float = 0.02
  pos_offset: int = 2
  do_layer_norm_before: bool = True
  word_embed_proj_dim: int | None = None
  final_norm: bool | None = None

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"TransformerConfig: {msg}")
    if self.arch not in ARCHS:
      bad(f"arch={self.arch!r} is not one of {ARCHS}")
    for name in ("vocab_size", "hidden", "n_layers", "n_heads", "mlp_hidden", "max_position"):
      v = getattr(self, name)
      if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
        bad(f"{name} must be a positive integer, got {v!r}")
    set_ = lambda k, v: object.__setattr__(self, k, v)
    if self.n_kv_heads is None:
      set_("n_kv_heads", self.n_heads)
    if self.head_dim is None:
      if self.hidden % self.n_heads:
        bad(f"hidden={self.hidden} is not divisible by n_heads={self.n_heads}; set head_dim explicitly")
      set_("head_dim", self.hidden // self.n_heads)
    if self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
      bad(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
    if self.arch == "llama" and self.head_dim % 2:
      bad(f"RoPE needs an even head_dim, got {self.head_dim}")
    if self.activation is None:
      set_("activation", "silu" if self.arch == "llama" else "relu")
    if self.activation not in ACTIVATIONS:
      bad(f"activation={self.activation!r} is not one of {ACTIVATIONS}")
    for name in ("dtype", "param_dtype"):
      try:
        dt = jnp.dtype(getattr(self, name))
      except TypeError:
        bad(f"{name}={getattr(self, name)!r} is not a dtype name")
      if not jnp.issubdtype(dt, jnp.floating):
        bad(f"{name}={getattr(self, name)!r} must be a floating dtype")
      set_(name, dt.name)
    if self.scan_layers is None:
      set_("scan_layers", self.n_layers >= SCAN_MIN_LAYERS)
    set_("scan_layers", bool(self.scan_layers))
    if self.remat_policy not in REMAT_POLICIES:
      bad(f"remat_policy={self.remat_policy!r} is not one of {REMAT_POLICIES}")
    if self.attention not in ATTENTION_IMPLS:
      bad(f"attention={self.attention!r} is not one of {ATTENTION_IMPLS}")
    if isinstance(self.rope_scaling, dict):
      set_("rope_scaling", tuple(sorted(self.rope_scaling.items())))
    if self.rope_scaling is not None:
      rs = dict(self.rope_scaling)
      kind = rs.get("rope_type", rs.get("type"))
      need = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                "original_max_position_embeddings")}
      if kind not in need:
        bad(f"rope_scaling type {kind!r} is not supported (supported: None, 'linear', 'llama3')")
      missing = [k for k in need[kind] if k not in rs]
      if missing:
        bad(f"rope_scaling of type {kind!r} needs {missing}")
    if self.arch == "opt":
      if self.word_embed_proj_dim is None:
        set_("word_embed_proj_dim", self.hidden)
      if self.final_norm is None:
        set_("final_norm", bool(self.do_layer_norm_before))
    else:
      if self.word_embed_proj_dim not in (None, self.hidden):
        bad("word_embed_proj_dim applies to arch='opt' only")
      set_("word_embed_proj_dim", self.hidden)
      set_("final_norm", True)

  @property
  def compute_dtype(self) -> jnp.dtype:
    """`dtype` as a numpy dtype."""
    return jnp.dtype(self.dtype)

  @property
  def params_dtype(self) -> jnp.dtype:
    """`param_dtype` as a numpy dtype."""
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes) -> "TransformerConfig":
    """A copy with some fields changed (validated again).

    Derived fields that still hold their derived value (n_kv_heads == n_heads, head_dim == hidden //
    n_heads, the architecture's default activation, word_embed_proj_dim == hidden, final_norm ==
    do_layer_norm_before, scan_layers == (n_layers >= 4)) are derived again from the new values unless given
    in `changes`, so
    `config.replace(hidden=64, n_heads=8)` gets head_dim 8 rather than keeping the old one.
    """
    derived = {
        "n_kv_heads": self.n_kv_heads == self.n_heads,
        "head_dim": self.hidden % self.n_heads == 0 and self.head_dim == self.hidden // self.n_heads,
        "activation": self.activation == ("silu" if self.arch == "llama" else "relu"),
        "word_embed_proj_dim": self.word_embed_proj_dim == self.hidden,
        "final_norm": self.arch == "llama" or self.final_norm == bool(self.do_layer_norm_before),
        "scan_layers": self.scan_layers == (self.n_layers >= SCAN_MIN_LAYERS),
    }
    for name, is_derived in derived.items():
      if is_derived and name not in changes:
        changes[name] = None
    return dataclasses.replace(self, **changes)


@flax.struct.dataclass
class KVCache:
  """Key/value cache of a `Transformer` for incremental decoding (a pytree).

  Attributes:
    k: (n_layers, batch, max_len, n_kv_heads, head_dim) keys after RoPE, in the cache dtype.
    v: (n_layers, batch, max_len, n_kv_heads, head_dim) values.
    segment_ids: (batch, max_len) int32 segment id of each filled slot; 0 = empty slot or padding (never
      attended by a query of segment >= 1).
  """
  k: jax.Array
  v: jax.Array
  segment_ids: jax.Array

  @property
  def max_len(self) -> int:
    """Number of slots per sequence."""
    return self.k.shape[2]


# ----------------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------------


def _dense(in_shape: Sequence[int], out_shape: Sequence[int], names: Sequence[str | None], use_bias: bool,
           config: TransformerConfig, rngs: nnx.Rngs):
  """A flax dense layer (`jaxlab.nn.layers.dense`): kernel (*in_shape, *out_shape) ~ N(0, init_std), zero bias."""
  return layers.dense(tuple(in_shape), tuple(out_shape), names=names, kernel_init=layers.normal(config.init_std),
                      use_bias=use_bias, dtype=config.compute_dtype, param_dtype=config.params_dtype, rngs=rngs)


def _norm(config: TransformerConfig):
  """RMSNorm (llama; Hugging Face rounding) or LayerNorm (opt) of width `hidden`, no PRNG key consumed."""
  kw = dict(eps=config.norm_eps, dtype=config.compute_dtype, param_dtype=config.params_dtype)
  if config.arch == "llama":
    return layers.RMSNorm(config.hidden, round_before_scale=True, **kw)
  return layers.LayerNorm(config.hidden, **kw)


def _embed(rows: int, dim: int, names: Sequence[str | None], config: TransformerConfig, rngs: nnx.Rngs):
  """A flax `nnx.Embed` (rows, dim), init N(0, init_std).

  Lookups return the parameter dtype; the model casts the gathered rows to the compute dtype, so the
  embedding gradient (a scatter-add over repeated ids) accumulates in the parameter dtype.
  """
  return layers.embed(rows, dim, names=names, init=layers.normal(config.init_std), dtype=config.params_dtype,
                      param_dtype=config.params_dtype, rngs=rngs)


def rope_frequencies(config: TransformerConfig) -> np.ndarray:
  """RoPE inverse frequencies theta_i = rope_theta^(-2i / head_dim), with the config's scaling.

  Returns:
    (head_dim // 2,) float32 numpy array.
  """
  d = config.head_dim
  inv = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
  if config.rope_scaling is not None:
    rs = dict(config.rope_scaling)
    kind = rs.get("rope_type", rs.get("type"))
    factor = float(rs["factor"])
    if kind == "linear":                      # positions / factor
      inv = inv / factor
    elif kind == "llama3":
      # Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate smoothly in between,
      # by wavelength relative to the original context length.
      lo, hi = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
      ctx = float(rs["original_max_position_embeddings"])
      wavelen = 2 * math.pi / inv
      smooth = (ctx / wavelen - lo) / (hi - lo)
      mid = (1 - smooth) * inv / factor + smooth * inv
      inv = np.where(wavelen > ctx / lo, inv / factor, np.where(wavelen < ctx / hi, inv, mid))
  return inv.astype(np.float32)


def _rope_tables(positions_bl: jax.Array, config: TransformerConfig) -> tuple[jax.Array, jax.Array]:
  """(cos, sin), each (batch, length, head_dim // 2) float32, of angle positions * theta_i."""
  ang = positions_bl.astype(jnp.float32)[..., None] * jnp.asarray(rope_frequencies(config))
  return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x_blhd: jax.Array, cos_blf: jax.Array, sin_blf: jax.Array) -> jax.Array:
  """Rotate-half RoPE (the HF Llama convention).

  Args:
    x_blhd: (batch, length, heads, head_dim).
    cos_blf, sin_blf: (batch, length, head_dim // 2) float32 tables from the positions.

  Returns:
    (batch, length, heads, head_dim) in x's dtype: (x1 cos - x2 sin, x2 cos + x1 sin) for halves (x1, x2).
  """
  x = x_blhd.astype(jnp.float32)
  half = x.shape[-1] // 2
  x1, x2 = x[..., :half], x[..., half:]
  c, s = cos_blf[:, :, None, :], sin_blf[:, :, None, :]
  return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x_blhd.dtype)


attention = attention_lib.xla_attention     # the reference einsum attention (any mask), kept under its old name


class Attention(nnx.Module):
  """Multi-head / grouped-query self-attention with optional RoPE and KV cache.

  Parameters: q.kernel (hidden, n_heads, head_dim) ("embed", "heads", None); k/v.kernel
  (hidden, n_kv_heads, head_dim) ("embed", "kv", None); o.kernel (n_heads, head_dim, hidden)
  ("heads", None, "embed"); biases (when enabled) the out part of each kernel.

  Args:
    config: model config.
    rngs: initialisation randomness (not stored).
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    c = config
    self.rope = c.arch == "llama"
    self.impl = c.attention
    self.q = _dense((c.hidden,), (c.n_heads, c.head_dim), ("embed", "heads", None), c.qkv_bias, c, rngs)
    self.k = _dense((c.hidden,), (c.n_kv_heads, c.head_dim), ("embed", "kv", None), c.qkv_bias, c, rngs)
    self.v = _dense((c.hidden,), (c.n_kv_heads, c.head_dim), ("embed", "kv", None), c.qkv_bias, c, rngs)
    self.o = _dense((c.n_heads, c.head_dim), (c.hidden,), ("heads", None, "embed"), c.o_bias, c, rngs)

  def __call__(self, x_bld, rope, mask_bls, *, segment_ids=None, cache=None, layer: int = 0, cache_index=None):
    """Self-attention of x.

    Args:
      x_bld: (batch, length, hidden) normalised input.
      rope: (cos, sin) tables (see `apply_rope`) or None (no RoPE).
      mask_bls: with a cache, the boolean mask broadcastable to (batch, length, cache slots); without one
        unused (None): the mask is causal within `segment_ids`.
      segment_ids: (batch, length) segment ids of an un-cached call (None = one segment).
      cache: None, or the stacked (k, v) arrays of a `KVCache`.
      layer: index of this layer in the stacked cache.
      cache_index: int32 scalar slot of the first new token (with `cache`).

    Returns:
      (batch, length, hidden) output, and the updated (k, v) stacked arrays when `cache` is given.
    """
    q, k, v = self.q(x_bld), self.k(x_bld), self.v(x_bld)
    if rope is not None:
      q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    if cache is None:
      return self.o(attention_lib.attention(q, k, v, segment_ids=segment_ids, causal=True, impl=self.impl))
    ck, cv = cache
    start = (layer, 0, cache_index, 0, 0)
    ck = jax.lax.dynamic_update_slice(ck, k[None].astype(ck.dtype), start)
    cv = jax.lax.dynamic_update_slice(cv, v[None].astype(cv.dtype), start)
    o = attention(q, ck[layer], cv[layer], mask_bls)
    return self.o(o), (ck, cv)


_ACT = {"silu": jax.nn.silu, "relu": jax.nn.relu, "gelu": lambda x: jax.nn.gelu(x, approximate=False),
        "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


class MLP(nnx.Module):
  """Gated (Llama: down(act(gate x) * up x)) or plain (OPT: down(act(up x))) MLP.

  Parameters: up/gate.kernel (hidden, mlp_hidden) ("embed", "mlp"), down.kernel (mlp_hidden, hidden)
  ("mlp", "embed"), biases when `mlp_bias`.

  Args:
    config: model config (gated iff arch == "llama").
    rngs: initialisation randomness (not stored).
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    c = config
    gated = c.arch == "llama"
    self.gate = _dense((c.hidden,), (c.mlp_hidden,), ("embed", "mlp"), c.mlp_bias, c, rngs) if gated else None
    self.up = _dense((c.hidden,), (c.mlp_hidden,), ("embed", "mlp"), c.mlp_bias, c, rngs)
    self.down = _dense((c.mlp_hidden,), (c.hidden,), ("mlp", "embed"), c.mlp_bias, c, rngs)
    self.activation = c.activation

  def __call__(self, x_bld: jax.Array) -> jax.Array:
    """(batch, length, hidden) -> same shape, compute dtype."""
    act = _ACT[self.activation]
    h = act(self.gate(x_bld)) * self.up(x_bld) if self.gate is not None else act(self.up(x_bld))
    return self.down(h)


class Block(nnx.Module):
  """One transformer layer: pre-norm (Llama, OPT pre-LN) or post-norm (OPT-350m) residual attention + MLP.

  Args:
    config: model config.
    rngs: initialisation randomness (not stored).
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.pre_norm = config.arch == "llama" or config.do_layer_norm_before
    self.attn_norm = _norm(config)
    self.attn = Attention(config, rngs=rngs)
    self.mlp_norm = _norm(config)
    self.mlp = MLP(config, rngs=rngs)

  def __call__(self, h_bld, rope, mask_bls, *, segment_ids=None, cache=None, layer=0, cache_index=None):
    """(batch, length, hidden) residual stream -> same (plus the updated cache arrays when `cache`)."""
    x = self.attn_norm(h_bld) if self.pre_norm else h_bld
    res = self.attn(x, rope, mask_bls, segment_ids=segment_ids, cache=cache, layer=layer, cache_index=cache_index)
    a, cache = res if cache is not None else (res, None)
    h = h_bld + a.astype(h_bld.dtype)
    if not self.pre_norm:
      h = self.attn_norm(h)
    m = self.mlp(self.mlp_norm(h) if self.pre_norm else h)
    h = h + m.astype(h.dtype)
    if not self.pre_norm:
      h = self.mlp_norm(h)
    return (h, cache) if cache is not None else h


def _block_forward(block: Block, h, rope, segment_ids):
  return block(h, rope, None, segment_ids=segment_ids)


# ----------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------


class Transformer(nnx.Module):
  """Decoder-only transformer LM (see the module docstring for the equations).

  Parameter tree (pure-dict paths, as in `jaxlab.state.ModelDef`): `embed/embedding` (vocab,
  word_embed_proj_dim) ("vocab", "embed"); OPT: `pos_embed/embedding` (max_position + pos_offset, hidden)
  (None, "embed"), `project_in/kernel`, `project_out/kernel` when word_embed_proj_dim != hidden;
  `layers/{i}/{attn_norm, attn/{q,k,v,o}, mlp_norm, mlp/{gate,up,down}}`; `final_norm`; `lm_head/kernel`
  (hidden, vocab) ("embed", "vocab") unless tied. With `scan_layers` the blocks are one stacked `Block`:
  `layers/{attn_norm, attn/..., mlp_norm, mlp/...}` with a leading (n_layers,) axis named "layers" (no
  mesh rule maps it, so it is never split). The module keeps no `nnx.Rngs`.

  The residual stream is constrained to the logical axes ("batch", "length", "embed") before every block
  (`constrain`: a no-op without a multi-device mesh in context).

  Args:
    config: the architecture.
    rngs: initialisation randomness (used in the constructor only).
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = c
    with nnx.use_eager_sharding(False):    # logical names are mapped to a mesh by jaxlab.state
      self.embed = _embed(c.vocab_size, c.word_embed_proj_dim, ("vocab", "embed"), c, rngs)
      opt = c.arch == "opt"
      self.pos_embed = _embed(c.max_position + c.pos_offset, c.hidden, (None, "embed"), c, rngs) if opt else None
      proj = opt and c.word_embed_proj_dim != c.hidden
      width = c.word_embed_proj_dim
      self.project_in = _dense((width,), (c.hidden,), (None, "embed"), False, c, rngs) if proj else None
      self.project_out = _dense((c.hidden,), (width,), ("embed", None), False, c, rngs) if proj else None
      blocks = [Block(c, rngs=rngs) for _ in range(c.n_layers)]
      self.layers = stack_blocks(blocks) if c.scan_layers else nnx.List(blocks)
      self.final_norm = _norm(c) if c.final_norm else None
      self.lm_head = None if c.tie_embeddings else _dense((c.hidden,), (c.vocab_size,), ("embed", "vocab"), False, c,
                                                          rngs)

  # -- cache -------------------------------------------------------------------------------------------

  def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty KV cache.

    Args:
      batch: number of sequences.
      max_len: slots per sequence (prompt + generated tokens).
      dtype: k/v dtype (default: the compute dtype).

    Returns:
      `KVCache` with zero k, v of shape (n_layers, batch, max_len, n_kv_heads, head_dim) and segment_ids
      (batch, max_len) int32 zeros (all slots empty).
    """
    c = self.config
    dtype = c.compute_dtype if dtype is None else jnp.dtype(dtype)
    shape = (c.n_layers, batch, max_len, c.n_kv_heads, c.head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   segment_ids=jnp.zeros((batch, max_len), jnp.int32))

  # -- forward -----------------------------------------------------------------------------------------

  def __call__(self, tokens_bl: jax.Array, positions_bl: jax.Array | None = None, *,
               segment_ids_bl: jax.Array | None = None, cache: KVCache | None = None,
               cache_index: jax.Array | int | None = None):
    """Logits of every position, optionally reading and extending a KV cache.

    Args:
      tokens_bl: (batch, length) integer token ids.
      positions_bl: (batch, length) integer positions (RoPE angle / OPT position row). Default:
        arange(length) without a cache, cache_index + arange(length) with one.
      segment_ids_bl: (batch, length) int segment ids. Without a cache: tokens attend only to earlier
        tokens of the same segment (packed sequences; padding may use its own id, e.g. 0). With a cache:
        the ids are stored per slot and queries attend only to slots of their own id; use 0 for (left)
        padding and >= 1 for real tokens. Default: all ones.
      cache: a `KVCache` (from `init_cache` or a previous call) to write this call's keys/values into.
      cache_index: int32 scalar, the slot of tokens_bl[:, 0] (required with `cache`); slots
        cache_index .. cache_index + length - 1 must exist (not checked inside jit).

    Returns:
      logits (batch, length, vocab_size) float32; with a cache, the pair (logits, updated KVCache).
    """
    c = self.config
    tokens_bl = jnp.asarray(tokens_bl)
    if tokens_bl.ndim != 2:
      raise ValueError(f"Transformer: tokens must be (batch, length), got shape {tokens_bl.shape}")
    b, l = tokens_bl.shape
    if (cache is None) != (cache_index is None):
      raise ValueError("Transformer: pass cache and cache_index together (cache_index = slot of the first token)")
    if c.arch == "opt" and cache is None and l > c.max_position:
      raise ValueError(f"Transformer: length {l} exceeds max_position={c.max_position} of the learned positions")
    seg = None if segment_ids_bl is None else jnp.asarray(segment_ids_bl, jnp.int32)
    mask = kv = None
    if cache is None:
      pos = (jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l)) if positions_bl is None
             else jnp.asarray(positions_bl, jnp.int32))
    else:
      cache_index = jnp.asarray(cache_index, jnp.int32)
      pos = (jnp.broadcast_to(cache_index + jnp.arange(l, dtype=jnp.int32), (b, l)) if positions_bl is None
             else jnp.asarray(positions_bl, jnp.int32))
      seg = jnp.ones((b, l), jnp.int32) if seg is None else seg
      cache_seg = jax.lax.dynamic_update_slice(cache.segment_ids, seg, (0, cache_index))
      q_slot = cache_index + jnp.arange(l)
      k_slot = jnp.arange(cache.max_len)
      mask = (k_slot[None, None, :] <= q_slot[None, :, None]) & (cache_seg[:, None, :] == seg[:, :, None])
    h = self.embed(tokens_bl).astype(c.compute_dtype)
    if self.project_in is not None:
      h = self.project_in(h)
    if self.pos_embed is not None:
      rows = c.max_position + c.pos_offset          # positions past the table read its last row
      h = h + self.pos_embed(jnp.clip(pos + c.pos_offset, 0, rows - 1)).astype(c.compute_dtype)
    rope = _rope_tables(pos, c) if c.arch == "llama" else None
    if c.scan_layers:
      h, kv = self._scan(h, rope, seg, mask, cache, cache_index)
    elif cache is None:
      fwd = _block_forward
      if c.remat:
        fwd = nnx.remat(_block_forward, policy=getattr(jax.checkpoint_policies, c.remat_policy))
      for layer in self.layers:
        h = fwd(layer, constrain(h, ACTIVATION_AXES), rope, seg)
    else:
      kv = (cache.k, cache.v)
      for i, layer in enumerate(self.layers):
        h, kv = layer(constrain(h, ACTIVATION_AXES), rope, mask, cache=kv, layer=i, cache_index=cache_index)
    if self.final_norm is not None:
      h = self.final_norm(h)
    if self.project_out is not None:
      h = self.project_out(h)
    logits = self._head(h)
    if cache is None:
      return logits
    return logits, KVCache(k=kv[0], v=kv[1], segment_ids=cache_seg)

  def _scan(self, h, rope, seg, mask, cache, cache_index):
    """The stacked blocks under `jax.lax.scan` (h carried; per-layer parameters and cache slices scanned)."""
    c = self.config
    if cache is None:
      def apply(block, h, _):
        return block(constrain(h, ACTIVATION_AXES), rope, None, segment_ids=seg), None
      return layers.scan_blocks(self.layers, h, apply, remat_policy=c.remat_policy if c.remat else None)[0], None

    def apply_cached(block, h, kv):
      ck, cv = kv
      h, (ck, cv) = block(constrain(h, ACTIVATION_AXES), rope, mask, cache=(ck[None], cv[None]), layer=0,
                          cache_index=cache_index)
      return h, (ck[0], cv[0])
    return layers.scan_blocks(self.layers, h, apply_cached, (cache.k, cache.v))

  def _head(self, h_bld: jax.Array) -> jax.Array:
    """(batch, length, width) -> (batch, length, vocab) float32 (float32 accumulation)."""
    dt = self.config.compute_dtype
    if self.lm_head is None:
      w = self.embed.embedding[...].astype(dt)
      return jnp.einsum("bld,vd->blv", h_bld.astype(dt), w, preferred_element_type=jnp.float32)
    w = self.lm_head.kernel[...].astype(dt)
    return jnp.einsum("bld,dv->blv", h_bld.astype(dt), w, preferred_element_type=jnp.float32)


def count_params(config: TransformerConfig) -> int:
  """Number of parameters of `Transformer(config)` (from shapes only)."""
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def flops_per_token(config: TransformerConfig, seq_len: int) -> float:
  """Training FLOPs per token (forward + backward = 3x forward) of `Transformer(config)` at `seq_len`.

  Counts 2 * (matmul parameters) per token plus the attention scores and weighted sum
  (2 * 2 * seq_len * n_heads * head_dim per layer per token, full-square as computed, not halved for the
  causal mask). Embedding lookups are free; the output head is counted.

  Returns:
    FLOPs per token of one training step (multiply by tokens/s for achieved FLOP/s).
  """
  c = config
  attn_proj = c.hidden * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads)
  mlp = c.hidden * c.mlp_hidden * (3 if c.arch == "llama" else 2)
  head = c.word_embed_proj_dim * c.vocab_size
  proj = 2 * c.hidden * c.word_embed_proj_dim if c.word_embed_proj_dim != c.hidden else 0
  per_layer = 2 * (attn_proj + mlp) + 4 * seq_len * c.n_heads * c.head_dim
  forward = c.n_layers * per_layer + 2 * head + 2 * proj
  return 3.0 * forward
